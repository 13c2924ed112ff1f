"""The platform said first (issue 61): specdemo's kernels are built on x86-64 Linux only; elsewhere (aarch64, macOS,
Windows) the package installs without trying to build them, and specdemo says why in one sentence, not that a compiler
is missing."""

import platform
import subprocess
import sys

import pytest

import specdemo_kernels
from specdemo.models import kernels
from tests.conftest import ROOT
from tests.models.test_kernels_built import ask_again


def on(monkeypatch, system: str, machine: str) -> None:
    """This process as if it ran on `system` (sys.platform) and `machine` (platform.machine())."""
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "machine", lambda: machine)


@pytest.mark.parametrize("machine", ["x86_64", "AMD64"])
def test_x86_64_linux_is_where_the_kernels_are_built(monkeypatch, machine):
    on(monkeypatch, "linux", machine)
    assert specdemo_kernels.check_platform() is None


@pytest.mark.parametrize("system, machine, named", [("linux", "aarch64", "Linux on aarch64"),
                                                    ("darwin", "arm64", "macOS on arm64"),
                                                    ("darwin", "x86_64", "macOS on x86_64"),
                                                    ("win32", "AMD64", "Windows on AMD64")])
def test_elsewhere_the_platform_is_named_as_the_reason(monkeypatch, system, machine, named):
    on(monkeypatch, system, machine)
    assert specdemo_kernels.check_platform() == f"this is {named}, and they are written for x86-64 Linux only"


def test_off_x86_64_linux_specdemo_says_why_in_one_sentence_without_asking_for_a_compiler(monkeypatch):
    on(monkeypatch, "darwin", "arm64")
    ask_again()
    try:
        said = kernels.unavailable()
        assert said == ("specdemo's kernels are not built on this platform (this is macOS on arm64, and they are "
                        "written for x86-64 Linux only), so the GGUF's blocks run on OpenVINO's own kernels")
        assert kernels.library() is None
    finally:
        monkeypatch.undo()
        ask_again()


SETUP_ON_AARCH64 = """
import platform, sys
platform.machine = lambda: "aarch64"
sys.argv = ["setup.py", "-q", "build", "--build-base", sys.argv[1]]
exec(compile(open("setup.py").read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
"""


def test_off_x86_64_linux_the_package_installs_without_trying_to_build(tmp_path, monkeypatch):
    # A build that were tried would fail (SPECDEMO_KERNELS_BUILD) and leave BUILD_ERROR behind.
    monkeypatch.setenv("SPECDEMO_KERNELS_BUILD", "fail")
    build = subprocess.run([sys.executable, "-c", SETUP_ON_AARCH64, str(tmp_path / "build")], cwd=ROOT / "kernels",
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-2000:]
    assert ("the extension is not built here (this is Linux on aarch64, and they are written for x86-64 Linux only)"
            in build.stderr)
    package = next((tmp_path / "build").glob("lib*/specdemo_kernels"))
    assert (package / "__init__.py").is_file()
    assert not list(package.glob("*.so")) and not (package / "BUILD_ERROR").exists()
