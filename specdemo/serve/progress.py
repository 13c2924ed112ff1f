"""Where the background work stands, for the line under the page's status: which step of how many, what the step's
log says it is at (a conversion's stage; within tune, the setting searched and how many of its candidates are done;
a wait for memory), and what is done so far. Read from the work's log as it grows: only the bytes new since the
last look, so asking often costs little and asking when nothing changed costs a stat.

    progress = work.progress()   # Follower.read: Progress(index=2, count=4, step="tuning this machine", detail=...)
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

_STAMP = re.compile(r"^\[\s*[\d.]+ (s|min)\]\s*")  # "[  12 s] ", "[1.8 min] ": tune's and the conversion's clocks
_DIMENSION = re.compile(r"^(target|draft): (.+), (\d+) settings, each raced against")  # tune.Search.run, per dimension
_TRIAL = re.compile(r"^(target|draft) .+: keeps [\d.]+% of the reference")  # one candidate checked
_PLAN = "draft plan:"  # tune.plan_draft, then one line per candidate draft
_PLANNED = re.compile(r"^draft .+ rows\): agrees with the target")


@dataclass(frozen=True)
class Progress:
    """The background work as the page shows it."""

    index: int  # the step running now, from 1
    count: int  # steps in all
    step: str  # what it does ("tuning this machine")
    detail: str  # where the step is, from its log ("target: KV-cache precision, 2 of 3 settings"), or ""
    state: str  # "running", "done" or "failed"
    held: bool  # a visitor's run holds the machine: the work is stopped meanwhile
    finished: tuple[str, ...]  # the steps done
    skipped: tuple[str, ...]  # the steps memory did not allow
    seconds: float  # since the work started
    passed_over: tuple[str, ...] = ()  # the steps not run: their result could not change what runs here


class Follower:
    """Reads one work's log as it grows and keeps where its current step is."""

    def __init__(self):
        self._lock = threading.Lock()
        self._offset, self._rest, self._index = 0, b"", 0
        self._context, self._done, self._total, self._memory = "", 0, 0, ""

    def read(self, work) -> Progress:
        """`work` (tuning.BackgroundWork) as it stands now."""
        import time

        with self._lock:
            if work.index != self._index:  # a new step: what the last one was at is no longer news
                self._index, self._context, self._done, self._total, self._memory = work.index, "", 0, 0, ""
            self._take_new_lines(work.log_path)
            return Progress(work.index, len(work.steps), work.step, self._detail() if work.state == "running" else "",
                            work.state, work.held, tuple(work.finished), tuple(work.skipped),
                            (time.perf_counter() - work.started) if work.state == "running" else work.seconds,
                            tuple(work.passed_over))

    def _take_new_lines(self, path) -> None:
        try:
            with open(path, "rb") as log:
                log.seek(self._offset)
                new = log.read()
        except OSError:
            return
        self._offset += len(new)
        *lines, self._rest = (self._rest + new).split(b"\n")
        for line in lines:
            self._take(_STAMP.sub("", line.decode("utf-8", "replace").strip()))

    def _take(self, text: str) -> None:
        if not text:
            return
        if text.startswith("memory:"):
            self._memory = text.removeprefix("memory:").strip()
            return
        self._memory = ""
        if match := _DIMENSION.match(text):
            self._context, self._done, self._total = f"{match.group(1)}: {match.group(2)}", 0, int(match.group(3))
        elif _TRIAL.match(text) or _PLANNED.match(text):
            self._done += 1
        elif text.startswith(_PLAN):
            self._context, self._done, self._total = "the draft plan", 0, 0
        elif not text.startswith(("target ", "draft ", "Traceback", "File ", "warnings.warn")) and len(text) < 200:
            self._context, self._done, self._total = text, 0, 0

    def _detail(self) -> str:
        counted = f", {self._done} of {self._total} settings checked" if self._total else \
            (f", {self._done} candidates measured" if self._done else "")
        waiting = f"; {self._memory}" if self._memory else ""
        return f"{self._context}{counted}{waiting}"
