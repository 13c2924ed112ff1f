"""specdemo's kernels (kernels/, specdemo/models/kernels.py): BlockMatMul over a GGUF tensor's own blocks equals
gguf-py's dequantization of those blocks times the 8-bit-quantized activations, on every block type and on every ISA
path this CPU runs (each one forced in turn); the graph built on them computes the exact layout's logits; a machine
where they were not built still runs, and says why once.

The real-model, browser and slow tests of tests/models/test_kernels.py, which holds the fast ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.models import kernels

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


BUILD_WITHOUT_A_COMPILER = """
import sys
sys.path.insert(0, sys.argv[1])
from specdemo.models import kernels
print(kernels.unavailable())
kernels.say_once_if_unavailable(sys.stdout)
kernels.say_once_if_unavailable(sys.stdout)
"""


@pytest.mark.slow  # a build of the package (its CMake step told to fail) and a fresh interpreter
def test_a_machine_that_cannot_build_the_kernels_installs_without_them_and_says_so_once(tmp_path):
    env = {**os.environ, "SPECDEMO_KERNELS_BUILD": "fail"}
    build = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp_path / "build")],
                           cwd=ROOT / "kernels", env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]  # the install goes on
    assert "the extension was not built" in build.stderr
    package = next((tmp_path / "build").glob("lib*/specdemo_kernels"))
    assert (package / "BUILD_ERROR").is_file() and not list(package.glob("*.so"))
    said = subprocess.run([sys.executable, "-c", BUILD_WITHOUT_A_COMPILER, str(package.parent)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    lines = said.stdout.strip().splitlines()
    assert said.returncode == 0, said.stderr[-2000:]
    assert lines[0].startswith("specdemo's kernels were not built when they were installed (the build was told to fail")
    assert lines[0].endswith("so the GGUF's blocks run on OpenVINO's own kernels; install a C++ compiler and run pip "
                             "install --force-reinstall ./kernels")
    assert lines[1:] == [lines[0]]  # said once, whatever asks again
