"""specdemo's BlockMatMul extension for OpenVINO: where its library is, or why it was not built."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


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
