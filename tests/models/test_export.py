"""The embedded models' part packages: installed and pinned, assembled into one GGUF, refused by name or checksum."""

import hashlib
import os
from pathlib import Path

import pytest

from specdemo.models import export, sources


def _quiet(fraction, message):
    pass


def test_a_missing_part_package_is_named(home, tmp_path):
    model = sources.EmbeddedModel("Nothing-1B", "specdemo-no-such-part", "0.0.1", parts=2, size=10, sha256="0" * 64)
    with pytest.raises(sources.ModelSourceError, match=r"specdemo-no-such-part1==0\.0\.1 is not installed"):
        export.assemble_parts(model, tmp_path / "model.gguf", _quiet)


def fake_parts(tmp_path, monkeypatch, contents: list[bytes], package: str = "fakepart") -> None:
    """Part packages `package`1, 2, … on sys.path, each holding one of `contents`."""
    for i, content in enumerate(contents, 1):
        folder = tmp_path / "pkgs" / f"{package}{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "part.bin").write_bytes(content)
        (folder / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data', 'part.bin')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))


def test_a_corrupted_part_is_refused_by_its_checksum(home, tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, [b"corrupted bytes", b"corrupted bytes"])
    model = sources.EmbeddedModel("Fake-1B", "fakepart", "1.0", parts=2, size=30, sha256="0" * 64)
    with pytest.raises(sources.ModelSourceError, match="does not match its checksum.*reinstall fakepart1..2==1.0"):
        export.assemble_parts(model, tmp_path / "model.gguf", _quiet)


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "through a buffer"])
def test_the_parts_are_assembled_byte_for_byte_by_the_kernel_or_where_it_cannot_through_a_buffer(
        home, tmp_path, monkeypatch, kernel_copy):
    contents = [bytes(range(256)) * 40_000, b"", b"tail" * 3]  # 10 MB, an empty part, a few bytes
    fake_parts(tmp_path, monkeypatch, contents, "wholepart")
    if not kernel_copy:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    whole = b"".join(contents)
    model = sources.EmbeddedModel("Whole-1B", "wholepart", "1.0", parts=3, size=len(whole),
                                  sha256=hashlib.sha256(whole).hexdigest())
    export.assemble_parts(model, tmp_path / "model.gguf", _quiet)
    assert (tmp_path / "model.gguf").read_bytes() == whole


def test_the_embedded_parts_are_installed_and_pinned():
    requirements = (Path(__file__).parents[2] / "requirements.txt").read_text().splitlines()
    for preset in sources.PRESETS.values():  # every part of both models, 22 + 6
        for i in range(1, preset.parts + 1):
            assert export._part_path(preset, i).is_file()
            assert f"{preset.package}{i}=={preset.version}" in requirements
