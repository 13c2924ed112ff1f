"""The embedded models' part packages: installed and pinned, assembled into one GGUF, refused by name or checksum."""

from pathlib import Path

import pytest

from specdemo.models import export, sources


def _quiet(fraction, message):
    pass


def test_a_missing_part_package_is_named(home, tmp_path):
    model = sources.EmbeddedModel("Nothing-1B", "specdemo-no-such-part", "0.0.1", parts=2, size=10, sha256="0" * 64)
    with pytest.raises(sources.ModelSourceError, match=r"specdemo-no-such-part1==0\.0\.1 is not installed"):
        export.assemble_parts(model, tmp_path / "model.gguf", _quiet)


def test_a_corrupted_part_is_refused_by_its_checksum(home, tmp_path, monkeypatch):
    for i in (1, 2):  # two fake part packages on sys.path
        package = tmp_path / "pkgs" / f"fakepart{i}"
        (package / "data").mkdir(parents=True)
        (package / "data" / "part.bin").write_bytes(b"corrupted bytes")
        (package / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data', 'part.bin')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    model = sources.EmbeddedModel("Fake-1B", "fakepart", "1.0", parts=2, size=30, sha256="0" * 64)
    with pytest.raises(sources.ModelSourceError, match="does not match its checksum.*reinstall fakepart1..2==1.0"):
        export.assemble_parts(model, tmp_path / "model.gguf", _quiet)


def test_the_embedded_parts_are_installed_and_pinned():
    requirements = (Path(__file__).parents[2] / "requirements.txt").read_text().splitlines()
    for preset in sources.PRESETS.values():  # every part of both models, 22 + 6
        for i in range(1, preset.parts + 1):
            assert export._part_path(preset, i).is_file()
            assert f"{preset.package}{i}=={preset.version}" in requirements
