"""Running the lanes of one press of Generate, with fake engines: order, races, Stop, pacing and failures."""

import queue
import threading
import time

import pytest

from specdemo.decoding.events import TARGET, TokenEvent
from specdemo.results.metrics import Summary
from specdemo.settings import GenerationSettings
from specdemo.names import AUTOREGRESSIVE, GENAI, LANES, SPECULATIVE
from specdemo.serve.lanes import UPDATE_INTERVAL_S, LaneRun, Runs, follow, start_lanes
from specdemo.serve.values import ONE_AFTER_ANOTHER, RACE


def token(text, source=TARGET, step=1, t=0.1):
    return TokenEvent(id=len(text), text=text, source=source, step=step, t=t)


# ----------------------------------------------------------------------------- running the lanes


class FakeEngine:
    """Yields `tokens` events per lane; `meet` makes each lane wait for the other to have started."""

    def __init__(self, tokens=3, meet=None, until_cancelled=False, log=None, name=""):
        self.tokens, self.meet, self.until_cancelled = tokens, meet, until_cancelled
        self.log = [] if log is None else log
        self.name = name

    def autoregressive(self, instruction, settings, cancel):
        yield from self._run("autoregressive", cancel)

    def speculative(self, instruction, settings, cancel):
        yield from self._run("speculative", cancel)

    def _run(self, mode, cancel):
        self.log.append(f"{self.name} {mode} starts".strip())
        if self.meet is not None:
            self.meet.wait(timeout=5)
        n = 0
        while (n < self.tokens or self.until_cancelled) and not cancel.is_set():
            n += 1
            yield token("x", TARGET, step=n, t=n * 0.01)
            cancel.wait(0.01)
        self.log.append(f"{self.name} {mode} ends".strip())
        yield Summary(mode=mode, tokens=n, stop_reason="cancelled" if cancel.is_set() else "max_new_tokens")


def run_lanes(engines, mode, cancel=None, genai=None):
    """Run fake lanes as the page does; (lanes, updates yielded, seconds it took)."""
    settings = GenerationSettings()
    jobs = {lane: (lambda cancel, engine=engine, lane=lane: getattr(engine, lane)("hi", settings, cancel))
            for lane, engine in engines.items()}
    if genai is not None:
        jobs[GENAI] = lambda cancel: genai.speculative("hi", settings, cancel)
    lanes = {name: LaneRun() for name in jobs}
    inbox = queue.SimpleQueue()
    start = time.perf_counter()
    threads = start_lanes(jobs, mode, cancel or threading.Event(), inbox)
    updates = sum(1 for _ in follow(lanes, threads, inbox))
    return lanes, updates, time.perf_counter() - start


def test_one_after_another_runs_the_speculative_lane_after_the_autoregressive_one():
    engine = FakeEngine()
    lanes, _, _ = run_lanes({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, ONE_AFTER_ANOTHER)
    assert engine.log == ["autoregressive starts", "autoregressive ends", "speculative starts", "speculative ends"]
    assert [len(lanes[name].events) for name in LANES] == [3, 3]
    assert all(lane.summary.stop_reason == "max_new_tokens" for lane in lanes.values())


def test_race_runs_both_lanes_at_once():
    meet = threading.Barrier(2)  # breaks (and the lanes log no tokens) unless both lanes start together
    engines = {AUTOREGRESSIVE: FakeEngine(meet=meet), SPECULATIVE: FakeEngine(meet=meet)}
    lanes, _, _ = run_lanes(engines, RACE)
    assert not meet.broken
    assert [len(lanes[name].events) for name in LANES] == [3, 3]


def test_cancel_stops_both_lanes_after_their_current_step():
    cancel = threading.Event()
    engines = {AUTOREGRESSIVE: FakeEngine(until_cancelled=True), SPECULATIVE: FakeEngine(until_cancelled=True)}
    threading.Timer(0.2, cancel.set).start()
    lanes, _, _ = run_lanes(engines, RACE, cancel)
    assert all(lane.summary.stop_reason == "cancelled" for lane in lanes.values())


def test_a_cancelled_run_one_after_another_never_starts_the_second_lane():
    cancel = threading.Event()
    engine = FakeEngine(until_cancelled=True)
    threading.Timer(0.2, cancel.set).start()
    lanes, _, _ = run_lanes({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, ONE_AFTER_ANOTHER, cancel)
    assert engine.log == ["autoregressive starts", "autoregressive ends"]
    assert lanes[SPECULATIVE].summary is None


def test_updates_are_throttled_however_fast_tokens_come():
    engine = FakeEngine(tokens=30)  # about 0.3 s of tokens at one per 10 ms
    _, updates, seconds = run_lanes({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, ONE_AFTER_ANOTHER)
    assert updates <= seconds / UPDATE_INTERVAL_S + 1  # paced by the clock, not by 60 tokens


@pytest.mark.parametrize("mode", [ONE_AFTER_ANOTHER, RACE])
def test_genai_runs_last_once_our_lanes_are_done_in_either_mode(mode):
    log = []
    ours = {AUTOREGRESSIVE: FakeEngine(log=log), SPECULATIVE: FakeEngine(log=log)}
    lanes, _, _ = run_lanes(ours, mode, genai=FakeEngine(log=log, name="genai"))
    assert log[-2:] == ["genai speculative starts", "genai speculative ends"]
    assert [len(lanes[name].events) for name in (*LANES, GENAI)] == [3, 3, 3]


def test_a_failing_lane_is_reported_as_a_sentence():
    class Broken(FakeEngine):
        def speculative(self, instruction, settings, cancel):
            raise RuntimeError("the device was lost")
            yield

    lanes, _, _ = run_lanes({AUTOREGRESSIVE: FakeEngine(), SPECULATIVE: Broken()}, RACE)
    assert lanes[SPECULATIVE].error == "The device was lost."
    assert lanes[AUTOREGRESSIVE].summary is not None


def test_stop_cancels_only_the_run_it_names_and_only_for_the_session_that_started_it():
    runs = Runs()
    (mine, my_cancel), (theirs, their_cancel) = runs.begin("me"), runs.begin("them")
    assert mine != theirs and len(mine) >= 16  # random ids, told to each visitor's page alone
    assert not runs.cancel("me", theirs)  # my session cannot stop their run, even knowing its id
    assert not runs.cancel("them", "")  # nor can a session stop anything without naming its run
    assert not their_cancel.is_set()
    assert runs.cancel("me", mine)
    assert my_cancel.is_set() and not their_cancel.is_set()
    runs.end(mine)
    runs.end(theirs)
    assert not runs.cancel("me", mine) and len(runs) == 0  # a run that ended is not going any more
