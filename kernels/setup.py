"""Builds the BlockMatMul extension with CMake while pip installs this package, on x86-64 Linux (elsewhere it is not
tried: the package installs without the library, and specdemo_kernels.check_platform says why). A build that fails
(no C++ compiler, a compiler too old for the SIMD paths) does not fail the install: the package is installed without the
library and says why in BUILD_ERROR, and specdemo runs on the CPU plugin's own kernels (specdemo/models/kernels.py says
so once)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
LIBRARY = "libspecdemo_kernels.so"
sys.path.insert(0, str(HERE))  # this source's package, not one installed before it
from specdemo_kernels import check_platform  # noqa: E402 - the one rule of where the library is built


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        package = Path(self.build_lib) / "specdemo_kernels"
        for stale in (package / LIBRARY, package / "BUILD_ERROR", package / "OPENVINO_VERSION"):
            stale.unlink(missing_ok=True)
        if refused := check_platform():
            print(f"specdemo-kernels: the extension is not built here ({refused}); specdemo will run on OpenVINO's own "
                  "kernels", file=sys.stderr)
            return
        build = Path(tempfile.mkdtemp(prefix="specdemo-kernels-"))
        try:
            shutil.copy2(compile_library(build), package / LIBRARY)
            import openvino  # what it was compiled against: a library loaded into another OpenVINO is refused at load

            (package / "OPENVINO_VERSION").write_text(openvino.__version__ + "\n")
        except Exception as error:  # noqa: BLE001 - any failure: install without it, and say why
            (package / "BUILD_ERROR").write_text(f"{error}".strip()[-2000:] + "\n")
            print(f"specdemo-kernels: the extension was not built ({str(error).strip().splitlines()[-1]}); specdemo "
                  "will run on OpenVINO's own kernels", file=sys.stderr)
        finally:
            shutil.rmtree(build, ignore_errors=True)


def compile_library(build: Path) -> Path:
    """The library built in the folder `build`; raises with the compiler's last words when CMake fails."""
    if os.environ.get("SPECDEMO_KERNELS_BUILD") == "fail":  # tests: a machine that cannot build it
        raise RuntimeError("the build was told to fail (SPECDEMO_KERNELS_BUILD=fail)")
    import openvino

    cmake_dir = Path(openvino.__file__).parent / "cmake"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for command in (["cmake", "-S", str(HERE), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DOpenVINO_DIR={cmake_dir}", f"-DTBB_DIR={cmake_dir}"],
                    ["cmake", "--build", str(build), "--parallel"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command[:2])} failed:\n{(done.stdout + done.stderr)[-1500:]}")
    return build / LIBRARY


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it holds a library built for this machine
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
