"""Stop: a run cancelled between steps, while drafting or while verifying ends with a "cancelled"
summary, leaves both KV caches holding only what was emitted, and the next run is exact. Tiny random
models (fast, exact). Figures: docs/reliability.md."""

import itertools
import threading

import pytest

from specdemo.decoding.events import End
from specdemo.models.runtime import OVModel
from specdemo.results.lane import LaneLog, drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy
from tests.conftest import watch_forward

PROMPT = "w5 w17 w99 w3 w250 w42 w7"
STOPPED_SETTINGS = [GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(3)),
                    GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(3), temperature=1.0, top_k=50, seed=5)]


def test_cancel_stops_between_steps_and_the_next_run_is_exact(tiny_engine):
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(3))
    cancel = threading.Event()
    log, ends = LaneLog(), []
    for i, event in enumerate(tiny_engine.speculative(PROMPT, settings, cancel)):
        if i == 5:
            cancel.set()
        log.take(event)
        ends += [event] if isinstance(event, End) else []
    assert len(ends) == 1 and log.summary.stop_reason == "cancelled" and log.summary.tokens < 40
    ar = drain(tiny_engine.autoregressive(PROMPT, settings))
    assert drain(tiny_engine.speculative(PROMPT, settings)).ids == ar.ids


def _run_stopped(engine: Engine, settings: GenerationSettings, monkeypatch, model: OVModel, call: int):
    """A speculative run with Stop pressed during `model`'s `call`-th forward."""
    cancel, calls = threading.Event(), itertools.count(1)

    def press_stop(ids):
        if next(calls) == call:
            cancel.set()

    watch_forward(monkeypatch, model, press_stop)
    run = drain(engine.speculative(PROMPT, settings, cancel))
    monkeypatch.undo()
    return run


@pytest.mark.parametrize("settings", STOPPED_SETTINGS, ids=["greedy", "sampling"])
def test_stop_while_drafting_leaves_the_target_clean_and_the_next_run_exact(tiny_engine, settings, monkeypatch):
    engine = tiny_engine
    reference = drain(engine.speculative(PROMPT, settings)).ids
    # The draft's 5th call is the middle of the second round: its proposals are never verified.
    run = _run_stopped(engine, settings, monkeypatch, engine.draft.runtime, call=5)
    assert run.summary.stop_reason == "cancelled" and 0 < len(run.ids) < 40
    assert run.summary.target_calls == 2  # the prefill and round 1's verification; round 2 is dropped
    assert run.ids == reference[: len(run.ids)]
    assert engine.target.runtime.length == len(engine.prompt_ids(PROMPT, settings)) + len(run.ids) - 1
    assert drain(engine.speculative(PROMPT, settings)).ids == reference


@pytest.mark.parametrize("settings", STOPPED_SETTINGS, ids=["greedy", "sampling"])
def test_stop_while_verifying_leaves_both_caches_clean_and_the_next_run_exact(tiny_engine, settings, monkeypatch):
    engine = tiny_engine
    reference = drain(engine.speculative(PROMPT, settings)).ids
    # The target's 3rd call is the second round's verification: it finishes, then the run stops.
    run = _run_stopped(engine, settings, monkeypatch, engine.target.runtime, call=3)
    assert run.summary.stop_reason == "cancelled" and 0 < len(run.ids) < 40
    assert run.summary.target_calls == 3  # round 2's verification was the last call
    assert run.ids == reference[: len(run.ids)]
    held = len(engine.prompt_ids(PROMPT, settings)) + len(run.ids) - 1  # the sequence but its last token
    assert engine.target.runtime.length == held and engine.draft.runtime.length <= held
    assert drain(engine.speculative(PROMPT, settings)).ids == reference
    if settings.greedy:
        assert reference == drain(engine.autoregressive(PROMPT, settings)).ids
