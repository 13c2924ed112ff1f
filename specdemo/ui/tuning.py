"""Tuning a new machine in the background: once the page is ready on a machine with no tune choice yet, the server
starts `python -m specdemo tune` in a child process at the lowest CPU priority. The page never waits for it, and while
a visitor's run holds the machine the child is stopped (SIGSTOP), then continued: niced but running, it doubled a
target step (92 ms against ~45 on a 2-core Zen 5), since the lanes share caches and memory bandwidth, not only cores.
It ends with the server. Its choice applies from the next start; until then the model panel says so.
SPECDEMO_TUNE_AT_START=0 turns it off (the tests' and the benchmark's servers).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import psutil

from specdemo import sources, tune
from specdemo.settings import RunSettings

ROOT = Path(__file__).resolve().parents[2]  # where `-m specdemo` resolves, whatever the server's working folder
TUNE_AT_START = "SPECDEMO_TUNE_AT_START"
NICENESS = 19  # the lowest priority, for the moments between runs when the page itself has work
_PR_SET_PDEATHSIG = 1


def _in_the_child() -> None:
    """Lowest priority, and ended (SIGTERM) when the server ends, so no tune outlives the page that started it."""
    os.nice(NICENESS)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (AttributeError, OSError):  # not Linux: the tune may outlive the server
        pass


class BackgroundTune:
    """One `tune` child process; `state` is "running", then "done" or "failed" (exit code in `returncode`)."""

    def __init__(self, command: list[str], log_path: Path, on_end: Callable[["BackgroundTune"], None] | None = None):
        self.log_path = log_path
        self.state = "running"
        self.returncode: int | None = None
        self.started = time.perf_counter()
        self.seconds = 0.0
        self.on_end = on_end
        self.process: subprocess.Popen | None = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Started and waited for on a thread of its own that lives as long as the child: Linux sends the parent-death
        # signal when the *thread* that started the child ends (the loading thread that calls this ends at once).
        started = threading.Event()
        threading.Thread(target=self._run, args=(command, started), daemon=True, name="specdemo-tune").start()
        started.wait()

    def _run(self, command: list[str], started: threading.Event) -> None:
        try:
            with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=ROOT, preexec_fn=_in_the_child)
        except OSError:
            self.returncode = -1
        finally:
            started.set()
        if self.process is not None:
            self.returncode = self.process.wait()
        self.seconds = time.perf_counter() - self.started
        self.state = "done" if self.returncode == 0 else "failed"
        if self.on_end is not None:
            self.on_end(self)

    def signal(self, number: int) -> None:
        if self.state == "running" and self.process is not None:
            try:
                self.process.send_signal(number)
            except ProcessLookupError:  # it has just ended
                pass

    def describe(self) -> str:
        """A few words for the model panel."""
        if self.state == "running":
            return "tuning this machine in the background, at low priority; applies from the next start"
        if self.state == "done":
            return "tuned in the background; restart the app to apply"
        return f"the background tune failed (exit {self.returncode}); see {self.log_path}"


_CURRENT: BackgroundTune | None = None
_HOLDS = 0  # visitors' runs holding the machine now
_HOLDS_LOCK = threading.Lock()


@contextmanager
def machine_held() -> Iterator[None]:
    """Around a visitor's run: the background tune, if any, is stopped from the first run's start to the last one's end."""
    global _HOLDS
    with _HOLDS_LOCK:
        _HOLDS += 1
        if _HOLDS == 1 and _CURRENT is not None:
            _CURRENT.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        with _HOLDS_LOCK:
            _HOLDS -= 1
            if _HOLDS == 0 and _CURRENT is not None:
                _CURRENT.signal(signal.SIGCONT)


def current() -> BackgroundTune | None:
    """The background tune this server started, if any."""
    return _CURRENT


def start_if_untuned(settings: RunSettings = RunSettings(), model_bytes: int = 0, command: list[str] | None = None,
                     on_end: Callable[[BackgroundTune], None] | None = None,
                     log: Callable[[str], None] = print) -> BackgroundTune | None:
    """Start tuning in the background when this machine has no choice for the pair's target yet (and nothing turned it
    off) and memory allows; None when it was not started. `model_bytes`: the target's weights on disk (the tune holds
    one compile per candidate of a dimension at once). `command` replaces `python -m specdemo tune` (tests)."""
    global _CURRENT
    if os.environ.get(TUNE_AT_START, "1") == "0" or not settings.target.device.upper().startswith("CPU"):
        return None
    if tune.chosen(settings.target) is not None or _CURRENT is not None:
        return None
    needed, available = memory_needed(model_bytes), psutil.virtual_memory().available
    if available < needed:
        log(f"not tuning this machine in the background: it needs about {needed / 2**30:.0f} GiB of memory and "
            f"{available / 2**30:.1f} GiB are free; `python -m specdemo tune` does it when they are")
        return None
    command = command or [sys.executable, "-m", "specdemo", "tune"]
    _CURRENT = BackgroundTune(command, sources.specdemo_home() / "tune" / "background-tune.log", on_end)
    return _CURRENT


def memory_needed(model_bytes: int) -> int:
    """Bytes a tune holds at its peak: a compile of the target per candidate of the widest dimension, and a margin
    (a 1.66 GiB target: ~9 GiB, seen as 11 GiB used on a 24 GiB machine with the server's 2.4 GiB)."""
    return len(tune.GROUP_SIZES) * model_bytes + 2**30
