"""A first start converts the draft beside the target (two conversion children, one a core) where memory allows both,
and one after the other where it does not. The conversions are stand-ins that record when they run; the real ones
are tests/models/test_gguf_graph.py's, the first start's figures the README's.

The real-model, browser and slow tests of tests/models/test_first_start.py, which holds the fast ones."""

import pytest

from specdemo.models import kernels
from specdemo.settings import FAITHFUL_PRECISIONS, FIRST_DRAFT_PRECISIONS


# The first start as the page makes it (the default pair resolved, converted straight from the GGUF files, compiled,
# warmed up and measured quickly), in a child where torch cannot be imported, from an empty home.
_FIRST_START = """
import sys
sys.modules['torch'] = None  # the default pair's first start must not need torch
from specdemo.run.engine import Engine
from specdemo.settings import K_MAX, RunSettings
engine = Engine.load(RunSettings(), progress=lambda fraction, message: None)
engine.warm_up(K_MAX, log=lambda message: None, quick=True)
print(engine.target.settings.precision, engine.draft.settings.precision, sys.modules['torch'])
"""


@pytest.mark.real_models
@pytest.mark.slow  # converts the default pair (about 35 s on 2 cores) and compiles it
def test_the_default_pairs_first_start_never_imports_torch(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "SPECDEMO_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-c", _FIRST_START], env=env, capture_output=True, text=True, timeout=1200,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    # the quickest faithful layout (the file's own blocks on our kernels where they were built), and the draft on the
    # file's own blocks too: no NNCF before ready (INT4 comes later)
    assert result.stdout.split() == [kernels.runnable(FAITHFUL_PRECISIONS)[0], kernels.runnable(FIRST_DRAFT_PRECISIONS)[0],
                                     "None"]
