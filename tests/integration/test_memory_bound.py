"""A background step under a memory limit this test sets finishes within it, and its peak is reported: the page's first
background step (`python -m specdemo prepare --draft-precision int8`: the 0.5B draft converted to INT8, ~3 min) in an
empty home (the target linked from the user's conversions), with the bound SPECDEMO_MEMORY_BUDGET and, where this test
may create one (root, a writable cgroup v1 memory controller or cgroup v2), inside a cgroup with that limit, where
going past it gets the step killed. Its process tree's anonymous memory is sampled every 0.2 s. Before the conversion
dequantized one tensor at a time it peaked at 3.2 GiB (transformers' GGUF loading: the model in f32 at once)."""

import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from specdemo.host import memory
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.settings import DEFAULT_TARGET
from tests.conftest import ROOT, TEST_HOME

pytestmark = [pytest.mark.real_models, pytest.mark.slow]

LIMIT = int(2.5 * 2**30)  # a 0.5B conversion's 1.4 GiB with room; below the 3.2 GiB it used to take


@contextmanager
def memory_cgroup(limit: int):
    """A new cgroup with a memory limit, as a folder whose cgroup.procs a child joins; None where none can be made."""
    own = Path("/proc/self/cgroup").read_text()
    v1 = next((line.split(":", 2)[2] for line in own.splitlines() if ":memory:" in line), None)
    base = Path("/sys/fs/cgroup/memory") if v1 is not None else Path("/sys/fs/cgroup")
    path = v1 if v1 is not None else next((line[3:] for line in own.splitlines() if line.startswith("0::")), None)
    folder = base / (path or "/").strip("/") / f"specdemo-test-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / ("memory.limit_in_bytes" if v1 is not None else "memory.max")).write_text(str(limit))
    except OSError:
        folder = None
    try:
        yield folder
    finally:
        if folder is not None:
            try:
                folder.rmdir()
            except OSError:
                pass


def run_sampled(command: list[str], env: dict, cgroup: Path | None) -> tuple[int, int]:
    """(exit status, peak anonymous bytes of its process tree) of `command`, in `cgroup` when given."""
    join = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup is not None else None
    child = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=join)
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.2):
            peak[0] = max(peak[0], memory.tree_anonymous(child.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    output = child.communicate(timeout=1800)[0].decode(errors="replace")
    done.set()
    sampler.join()
    print(output[-2000:])
    return child.returncode, peak[0]


def test_the_first_background_step_finishes_within_a_memory_limit_and_reports_its_peak(tmp_path):
    home = tmp_path / "home"
    target = sources.cached_folder(machine_profile().resolve_precision(DEFAULT_TARGET)).relative_to(TEST_HOME)
    if (TEST_HOME / target / sources.COMPLETE_MARKER).is_file():  # the target is ready in the page's first start
        (home / target).parent.mkdir(parents=True)
        (home / target).symlink_to((TEST_HOME / target).resolve(), target_is_directory=True)
    env = {**os.environ, "SPECDEMO_HOME": str(home), memory.BUDGET_VARIABLE: str(LIMIT)}
    with memory_cgroup(LIMIT) as cgroup:
        code, peak = run_sampled([sys.executable, "-m", "specdemo", "prepare", "--draft-precision", "int8"], env, cgroup)
    where = f"inside cgroup {cgroup}" if cgroup is not None else "under SPECDEMO_MEMORY_BUDGET alone (no cgroup here)"
    print(f"peak anonymous memory of the step's tree: {peak / 2**30:.2f} GiB, {where}, limit {LIMIT / 2**30:.1f} GiB")
    assert code == 0, f"the step ended with {code} {where}"
    assert peak <= LIMIT, f"the step's tree peaked at {peak / 2**30:.2f} GiB, over its {LIMIT / 2**30:.1f} GiB limit"
    assert list((home / "models").rglob(f"*0.5b-int8/{sources.COMPLETE_MARKER}"))
