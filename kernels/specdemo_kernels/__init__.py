"""specdemo's BlockMatMul extension for OpenVINO: where its library is, or why it was not built."""

import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEMS = {"linux": "Linux", "darwin": "macOS", "win32": "Windows"}  # sys.platform, as a user names it


def check_platform() -> str | None:
    """Why this platform gets no library, as a clause of a sentence ("this is macOS on arm64, and they are written for
    x86-64 Linux only"); None on x86-64 Linux, the one platform their SIMD paths, intrinsics and build are written for.
    kernels/setup.py builds only where this is None, so that elsewhere the package installs at once, without a
    compiler's error to read."""
    machine = platform.machine()
    if sys.platform == "linux" and machine.lower() in ("x86_64", "amd64"):
        return None
    return (f"this is {SYSTEMS.get(sys.platform, sys.platform)} on {machine or 'an unknown CPU'}, and they are written "
            "for x86-64 Linux only")


def library_path() -> Path | None:
    """The extension's shared library (load it with openvino.Core.add_extension), or None when it was not built."""
    path = HERE / "libspecdemo_kernels.so"
    return path if path.is_file() else None


def build_error() -> str | None:
    """What went wrong when pip built this package without its library, or None."""
    path = HERE / "BUILD_ERROR"
    return path.read_text().strip() if path.is_file() else None


def built_against() -> str | None:
    """The OpenVINO version (openvino.__version__) the library was compiled against, or None where it was not stamped."""
    path = HERE / "OPENVINO_VERSION"
    return path.read_text().strip() if path.is_file() else None
