"""specdemo's kernels fail loudly where they should have been built (issue 61): on x86-64 Linux, the platform we build
them on, a library that did not build or does not load is a failing test, not a skipped module; and the OpenVINO they
are compiled against is the one specdemo runs."""

import re

import pytest

import specdemo_kernels
from specdemo.models import kernels
from tests.conftest import ROOT

BUILT_ON = specdemo_kernels.check_platform() is None


@pytest.mark.skipif(not BUILT_ON, reason=f"specdemo builds its kernels on x86-64 Linux only: "
                                          f"{specdemo_kernels.check_platform()}")
def test_on_x86_64_linux_the_kernels_were_built_and_load():
    assert kernels.unavailable() is None, kernels.unavailable()
    assert "scalar" in kernels.supported_isas()


def pinned(text: str, package: str) -> str | None:
    """The version `text` (a requirements file or a pyproject's list) pins `package` to with ==, or None."""
    found = re.search(rf"(?<![\w-]){re.escape(package)}==([\w.]+)", text)
    return found.group(1) if found else None


def test_the_kernels_build_against_the_openvino_specdemo_runs():
    """The extension is compiled against kernels/pyproject.toml's openvino and loaded into requirements.txt's: an ABI
    mismatch would crash inside add_extension rather than raise, so the two pins are one version."""
    runtime = pinned((ROOT / "requirements.txt").read_text(), "openvino")
    build = pinned((ROOT / "kernels" / "pyproject.toml").read_text(), "openvino")
    assert runtime and runtime == build, (runtime, build)


def ask_again():
    """Forget what this process found of the kernels: each answer is kept for the process (the check's per ISA stays)."""
    for cached in (kernels.unavailable, kernels.library, kernels._unloadable):
        cached.cache_clear()


def test_a_library_built_against_another_openvino_is_refused_in_a_sentence_not_loaded(monkeypatch):
    """The build stamps the OpenVINO it compiled against (kernels/setup.py); at load another version is refused before
    add_extension, and the GGUF's blocks run on the plugin's kernels."""
    import openvino as ov

    if specdemo_kernels.library_path() is None:
        pytest.skip("the kernels were not built here (the test above says whether they should have been)")
    if BUILT_ON:
        assert specdemo_kernels.built_against() == ov.__version__  # this install's own build is stamped
    monkeypatch.setattr(specdemo_kernels, "built_against", lambda: "2000.1.0-1-abc")
    ask_again()
    try:
        said = kernels.unavailable()
        assert said is not None and said.startswith("specdemo's kernels were built against OpenVINO 2000.1.0 but ")
        assert said.endswith("pip install --force-reinstall ./kernels") and "\n" not in said
        assert kernels.library() is None
    finally:
        monkeypatch.undo()
        ask_again()
    assert kernels.unavailable() is None or not BUILT_ON
