"""Running the lanes of one press of Generate: worker threads, the events they send, and Stop.

Workers run each lane's event generator to its end and put (lane, item) pairs in an inbox; `follow`
applies them to the LaneRuns and paces the page's updates. Runs, a registry of cancel Events, one per
run by a random run id that only the visitor's own page is told, lets Stop reach only the run it names.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from typing import Callable, Iterator

from specdemo.decoding.events import TokenEvent
from specdemo.names import GENAI, LANES
from specdemo.results.lane import LaneLog
from specdemo.serve.values import ONE_AFTER_ANOTHER, as_sentence

# The page is updated once a second while lanes run: every update costs the browser's renderer ~25 ms of CPU on the
# same machine (measured on a 2-core EPYC), which stalls the lanes' parallel model calls, so fewer updates keep the
# figures honest (bench --only watching measures what is left).
UPDATE_INTERVAL_S = 1.0

_STARTED = object()  # a worker's marker: this lane's generation begins now


# One lane's work: given the run's cancel Event, the lane's events (TokenEvents, then a Summary).
Run = Callable[[threading.Event], Iterator]


class LaneRun(LaneLog):
    """What one lane of one run has produced so far (its plan, tokens, rounds and summary: lane.LaneLog), with
    when it started and its error, if any."""

    def __init__(self, events: list[TokenEvent] | None = None, error: str = ""):
        super().__init__()
        self.events = list(events or [])
        self.started: float | None = None  # time.perf_counter() when the lane began, for the live timer
        self.error = error
        self.changed = False  # tokens arrived since the text was last rendered
        self.sent = 0  # tokens the page has been sent (the next update sends the rest)

    def take(self, item) -> None:
        if item is _STARTED:
            self.started = time.perf_counter()
        elif isinstance(item, Exception):
            self.error = as_sentence(item)
        else:
            super().take(item)
            self.changed = self.changed or isinstance(item, TokenEvent)

    @property
    def done(self) -> bool:
        return self.summary is not None or bool(self.error)

    def elapsed(self, now: float) -> float:
        if self.summary is not None:
            return self.summary.wall_s
        if self.started is None:
            return 0.0
        return max(now - self.started, self.events[-1].t if self.events else 0.0)


def start_lanes(jobs: dict[str, Run], mode: str, cancel: threading.Event, inbox: queue.SimpleQueue) -> list[threading.Thread]:
    """Start the workers for `jobs` (by lane). One after another: one thread runs our lanes in turn. Race: one
    thread per lane of ours. GenAI's lane, if any, runs last, when ours are done, with the whole machine."""
    ours = [(lane, jobs[lane]) for lane in LANES]
    groups = [ours] if mode == ONE_AFTER_ANOTHER else [[job] for job in ours]
    threads = [threading.Thread(target=_work, args=(group, cancel, inbox), daemon=True, name="specdemo-lanes")
               for group in groups]
    if GENAI in jobs:
        def last() -> None:
            for thread in threads[: len(groups)]:
                thread.join()
            _work([(GENAI, jobs[GENAI])], cancel, inbox)
        threads.append(threading.Thread(target=last, daemon=True, name="specdemo-genai-lane"))
    for thread in threads:
        thread.start()
    return threads


def _work(jobs: list[tuple[str, Run]], cancel: threading.Event, inbox: queue.SimpleQueue) -> None:
    # Each engine generator is run to its end here, even after the page has gone away: that is what
    # releases the engine's lock. `cancel` makes that end come after the current step.
    for lane, run in jobs:
        if cancel.is_set():
            return
        inbox.put((lane, _STARTED))
        try:
            for event in run(cancel):
                inbox.put((lane, event))
        except Exception as error:  # shown in the page as a sentence; the other lanes carry on
            inbox.put((lane, error))


def follow(lanes: dict[str, LaneRun], threads: list[threading.Thread], inbox: queue.SimpleQueue) -> Iterator[None]:
    """Apply the workers' events to `lanes`; yield every UPDATE_INTERVAL_S until the workers are done."""
    deadline = time.perf_counter() + UPDATE_INTERVAL_S
    while True:
        finished = not any(thread.is_alive() for thread in threads)
        try:
            # A short wait, so the end of the workers is noticed at once whatever the update interval.
            lane, item = inbox.get(timeout=min(max(0.0, deadline - time.perf_counter()), 0.1))
            lanes[lane].take(item)
        except queue.Empty:
            if finished:
                return
        if time.perf_counter() >= deadline:
            yield
            deadline = time.perf_counter() + UPDATE_INTERVAL_S


class Runs:
    """Each running or waiting run's session and cancel Event, by run id: what lets Stop reach the run it names and no
    other."""

    def __init__(self):
        self._runs: dict[str, tuple[str, threading.Event]] = {}
        self._lock = threading.Lock()

    def begin(self, session: str) -> tuple[str, threading.Event]:
        """A new run of this visitor's: its id (random, told to their page alone, so Stop names the run it stops and no
        one who merely knows the session can stop it) and its cancel Event (Stop sets it)."""
        run_id, cancel = secrets.token_urlsafe(16), threading.Event()
        with self._lock:
            self._runs[run_id] = (session, cancel)
        return run_id, cancel

    def end(self, run_id: str) -> None:
        with self._lock:
            _, cancel = self._runs.pop(run_id, ("", threading.Event()))
        cancel.set()  # stops the workers if the page went away mid-run

    def cancel(self, session: str, run_id: str) -> bool:
        """Ask run `run_id` to stop after the current step, if it is this session's. False if no such run is going."""
        with self._lock:
            owner, cancel = self._runs.get(run_id or "", (None, None))
        if cancel is None or owner != session:
            return False
        cancel.set()
        return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)
