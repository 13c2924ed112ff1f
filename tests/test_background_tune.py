"""Tuning a new machine in the background after the first start: started once, only where no choice exists and nothing
turned it off, at the lowest CPU priority, and the model panel says where it stands. The tune itself is replaced by a
short child process (tests/test_tune.py covers the tuner)."""

import json
import subprocess
import sys
import time

import psutil
import pytest

from specdemo import tune
from specdemo.settings import DEFAULT_TARGET
from specdemo.ui import handlers, tuning


def child(code: int = 0) -> list[str]:
    """A stand-in for `python -m specdemo tune`: prints its priority, then exits with the code given."""
    return [sys.executable, "-c", f"import os, sys; print('niceness', os.nice(0)); sys.exit({code})"]


@pytest.fixture
def turned_on(home, monkeypatch):
    """This test's own empty SPECDEMO_HOME, background tuning on (conftest turns it off), no tune started yet."""
    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    monkeypatch.setattr(tuning, "_CURRENT", None)
    return home


def finish(background: tuning.BackgroundTune) -> None:
    background.process.wait(timeout=60)
    for _ in range(600):  # the waiting thread sets the state just after the exit
        if background.state != "running":
            return
        time.sleep(0.05)


def test_an_untuned_machine_starts_one_niced_tune_and_says_when_it_is_done(turned_on):
    ended = []
    background = tuning.start_if_untuned(command=child(0), on_end=ended.append)
    assert background is not None and tuning.current() is background
    assert "applies from the next start" in background.describe()
    assert tuning.start_if_untuned(command=child(0)) is None  # one per server
    finish(background)
    assert background.state == "done" and ended == [background]
    assert "niceness 19" in background.log_path.read_text()
    assert background.log_path.parent == turned_on / "tune"
    assert "restart" in background.describe()


def test_a_failed_tune_points_to_its_log(turned_on):
    background = tuning.start_if_untuned(command=child(3))
    finish(background)
    assert background.state == "failed" and background.returncode == 3
    assert str(background.log_path) in background.describe()


def test_nothing_starts_when_turned_off_or_already_tuned(turned_on, monkeypatch):
    monkeypatch.setenv(tuning.TUNE_AT_START, "0")
    assert tuning.start_if_untuned(command=child()) is None
    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    path = tune.path_for()
    path.parent.mkdir(parents=True)
    setting = {"dynamic_quantization_group_size": 128, "inference_precision": "f32", "kv_cache_precision": "u8",
               "num_threads": 0}
    path.write_text(json.dumps({"models": {tune.model_key(DEFAULT_TARGET): {"setting": setting, "relative": 0.8}}}))
    assert tuning.start_if_untuned(command=child()) is None
    assert tuning.current() is None


class Described:
    """A loaded model as the panel sees it: only its facts."""

    def __init__(self, tuned: str):
        self.tuned = tuned

    def describe(self) -> dict:
        return {"name": "m", "tuned": self.tuned}


def test_the_model_panel_says_where_the_background_tune_stands(turned_on):
    assert handlers.describe_model(Described(""))["tuned"] == ""  # the panel then says "not tuned: python -m specdemo tune"
    background = tuning.start_if_untuned(command=child(0))
    assert "tuning this machine in the background" in handlers.describe_model(Described(""))["tuned"]
    assert handlers.describe_model(Described("tuned: 20 % faster"))["tuned"] == "tuned: 20 % faster"  # compiled tuned
    finish(background)
    assert "restart the app" in handlers.describe_model(Described(""))["tuned"]


def test_a_visitors_run_stops_the_tune_until_the_last_run_ends(turned_on):
    background = tuning.start_if_untuned(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    process = psutil.Process(background.process.pid)
    try:
        with tuning.machine_held():
            assert wait_for_status(process, psutil.STATUS_STOPPED)
            with tuning.machine_held():  # a second run overlapping (a race lane, an API client)
                pass
            assert process.status() == psutil.STATUS_STOPPED  # still held by the first
        assert wait_for_status(process, psutil.STATUS_SLEEPING)
    finally:
        background.process.kill()


def test_the_tune_outlives_the_thread_that_started_it_but_not_the_server(turned_on, tmp_path):
    """The app starts the tune from its loading thread, which ends at once: the tune goes on. A server stopped with
    Ctrl-C (or killed) leaves no tune running on the machine."""
    report = tmp_path / "report"
    server = subprocess.run([sys.executable, "-c", f"""
import os, sys, threading, time
from specdemo.ui import tuning
loading = threading.Thread(target=tuning.start_if_untuned,
                           kwargs=dict(command=[sys.executable, "-c", "import time; time.sleep(60)"]))
loading.start()
loading.join()
time.sleep(1)
pid = tuning.current().process.pid
open({str(report)!r}, "w").write(f"{{pid}} {{tuning.current().state}}")
"""], cwd=tuning.ROOT, timeout=60)
    assert server.returncode == 0
    pid, state = report.read_text().split()
    assert state == "running"  # a second after the loading thread ended
    for _ in range(100):
        if not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.05)
    psutil.Process(int(pid)).kill()
    pytest.fail("the tune outlived the server")


def wait_for_status(process: psutil.Process, status: str) -> bool:
    for _ in range(100):
        if process.status() == status:
            return True
        time.sleep(0.02)
    return False


def test_too_little_memory_says_so_and_starts_nothing(turned_on):
    said = []
    free = psutil.virtual_memory().available
    assert tuning.start_if_untuned(model_bytes=free, command=child(), log=said.append) is None  # needs 5× that
    assert tuning.current() is None
    assert len(said) == 1 and "python -m specdemo tune" in said[0] and "GiB" in said[0]
