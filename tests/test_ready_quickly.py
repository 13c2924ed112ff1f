"""Ready in seconds: a page's engine is warmed up with a quick, provisional cost curve (specdemo/measuring.py,
quick=True) and learns the rest of the machine (the full curve, the batching noise, the acceptance evidence) after
the page is ready, each in a turn of its own between visitors' runs; until then its predictions say they are
provisional."""

import threading

import pytest

from specdemo import measuring
from specdemo.engine import Engine
from specdemo.settings import RunSettings
from tests.conftest import exact


def test_sizes_between_the_timed_ones_are_interpolated_in_straight_lines():
    assert measuring._interpolated([2, 5, 13], [2.0, 5.0, 9.0], 13) == pytest.approx(
        [2.0, 3.0, 4.0, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0])


@pytest.fixture
def engine(tiny_target, tiny_draft, home, monkeypatch):
    monkeypatch.setenv("SPECDEMO_LEARN", "1")  # its own home: what it learns stays there
    return Engine.load(RunSettings(exact(tiny_target), exact(tiny_draft)))


def test_a_quick_warm_up_is_provisional_and_leaves_the_rest_to_learn_one_step_at_a_time(engine):
    said = []
    engine.warm_up(12, quick=True, log=said.append)
    assert engine.costs.provisional and len(engine.costs.target_s) == 13 and engine.noise is None
    assert any("quickly" in line for line in said)
    assert "quick first measurement" in engine.provisional and "batching noise" in engine.provisional
    steps = engine.to_learn(12)
    assert [what.split()[0] for what, _ in steps] == ["measuring", "measuring", "learning"]
    for _, step in steps:
        step()
    assert not engine.costs.provisional and engine.noise is not None and engine.provisional == ""
    assert engine.to_learn(12) == []
    engine.warm_up(12, quick=True)  # a later start finds it all in the profile: nothing left, nothing provisional
    assert not engine.costs.provisional and engine.to_learn(12) == []


def test_the_page_learns_the_rest_in_turns_of_its_own_behind_a_visitors_run(engine, monkeypatch):
    from specdemo.ui import handlers, waiting

    line = waiting.RunQueue(max_waiting=4)
    monkeypatch.setattr(handlers, "LINE", line)
    engine.warm_up(12, quick=True)
    visitor = line.join(16)  # a visitor's run holds the machine
    then, said = threading.Event(), []
    learning = handlers.learn_in_turns(engine, said.append, then=then.set)
    learning.join(1.0)
    assert learning.is_alive() and engine.costs.provisional  # it waits its turn: nothing measured beside the run
    line.leave(visitor)
    assert then.wait(120) and not engine.costs.provisional and engine.noise is not None
    assert [line.split(":")[0] for line in said if ": done in" in line] == [
        "measuring this machine's call costs in full", "measuring the batching noise",
        "learning how often the draft agrees with the target"]


def test_a_prediction_before_the_machine_is_learnt_says_it_is_provisional():
    from specdemo.ui import render
    from specdemo.ui.lanes import AUTOREGRESSIVE, SPECULATIVE
    from specdemo.ui.values import ONE_AFTER_ANOTHER
    from tests.test_page_render import lane_with, token

    from specdemo.events import TARGET
    from specdemo.settings import GenerationSettings

    lanes = {AUTOREGRESSIVE: lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, stop_reason="eos"),
             SPECULATIVE: lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=9.0, rounds=3,
                                    alpha_hat=0.8, stop_reason="eos")}
    html = render.render_results(lanes, ONE_AFTER_ANOTHER, GenerationSettings(), provisional="no batching noise")
    assert "Provisional: this machine is still being learnt in the background (no batching noise)" in html
    assert "Provisional" not in render.render_results(lanes, ONE_AFTER_ANOTHER, GenerationSettings())
