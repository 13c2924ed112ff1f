"""Ready in seconds: a page's engine is warmed up with a quick, provisional cost curve (specdemo/learning/measuring.py,
quick=True) and learns the rest of the machine (the full curve, the batching noise, the acceptance evidence) after
the page is ready, each in a turn of its own between visitors' runs; until then its predictions say they are
provisional."""

import threading
from dataclasses import replace

import pytest

from specdemo.learning import measuring
from specdemo.models import runtime
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy, RunSettings
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


def test_costs_measured_while_the_host_was_busy_make_the_engine_and_its_plan_say_provisional(engine):
    engine.warm_up(12, quick=True)
    busy = "measured while the host was busy: steal 18 %, other processes 50 % of the CPU time, load 2.9 on 2 cores"
    engine.profile.keep_costs(engine.keys.costs, replace(engine.costs, busy=busy))
    assert "call costs measured while the host was busy" in engine.provisional
    plan = engine.plan("Write a function that adds two numbers.", GenerationSettings(k_policy=KPolicy.auto()))
    assert plan.provisional == busy and f"Provisional: this machine's call costs were {busy}" in plan.reason


def test_a_full_measurement_kept_busy_is_measured_again_by_the_next_start_in_a_turn_of_its_own(engine, monkeypatch):
    monkeypatch.setenv("SPECDEMO_HOST_LOAD", "ignore")  # the measurement taken again here judges the host quiet
    engine.warm_up(12, quick=True)
    for _, step in engine.to_learn(12):
        step()
    busy = "measured while the host was busy: steal 0 %, other processes 50 % of the CPU time, load 2.9 on 2 cores"
    engine.profile.keep_costs(engine.keys.costs, replace(engine.costs, busy=busy, busy_takes=1))
    engine.warm_up(12, quick=True)  # the next start: the busy curve from the profile, and its measurement again
    steps = engine.to_learn(12)
    assert [what for what, _ in steps] == ["measuring this machine's call costs again (the last measurement was taken "
                                           "while the host was busy)"]
    steps[0][1]()
    assert engine.costs.busy == "" and engine.to_learn(12) == []


def test_a_quick_measurement_pays_each_first_call_on_one_token_and_prefills_each_model_once(engine, monkeypatch):
    sizes = {"target": [], "draft": []}  # tokens of each call, in order
    for role in sizes:
        model = getattr(engine, role).runtime
        monkeypatch.setattr(model, "forward", lambda ids, logits_to_keep=1, forward=model.forward, calls=sizes[role]:
                            calls.append(len(ids)) or forward(ids, logits_to_keep))
    said = []
    engine.warm_up(12, quick=True, log=said.append)
    target, draft = sizes["target"], sizes["draft"]
    assert target[0] == draft[0] == 1  # the first call, where the plugin lays out the weights, on the least work
    assert target.count(measuring.QUICK_CONTEXT_TOKENS) == draft.count(measuring.QUICK_CONTEXT_TOKENS) == 1  # the prefill
    assert measuring.CONTEXT_TOKENS not in target + draft  # a shorter context than the full measurement's
    assert set(range(1, 14)) <= set(target) and len(target) == 27  # every shape a run makes, in 27 calls (38 before)
    assert "warmed up in" in said[0] and "(2 calls" in said[0]  # each stage says its seconds and its calls
    assert said[-1].startswith("measured quickly in") and f"({len(target) + len(draft) - 2} calls)" in said[-1]


def test_with_a_tune_next_only_what_outlives_the_compile_is_learnt_first(engine):
    engine.warm_up(12, quick=True)
    steps = engine.to_learn(12, pair_only=True)  # the tune measures the cost curve and noise of the compile it keeps
    assert [what for what, _ in steps] == ["learning how often the draft agrees with the target"]
    steps[0][1]()
    assert engine.to_learn(12, pair_only=True) == [] and engine.costs.provisional and engine.noise is None
    assert [what.split()[0] for what, _ in engine.to_learn(12)] == ["measuring", "measuring"]  # left, not forgotten


def test_the_page_learns_the_rest_in_turns_of_its_own_behind_a_visitors_run(engine):
    from specdemo.serve import learning
    from specdemo.serve.server import Server

    server = Server()
    line = server.line
    engine.warm_up(12, quick=True)
    visitor = line.join(16)  # a visitor's run holds the machine
    then, said = threading.Event(), []
    thread = learning.learn_in_turns(server, engine, said.append, then=then.set)
    thread.join(1.0)
    assert thread.is_alive() and engine.costs.provisional  # it waits its turn: nothing measured beside the run
    line.leave(visitor)
    assert then.wait(120) and not engine.costs.provisional and engine.noise is not None
    assert [line.split(":")[0] for line in said if ": done in" in line] == [
        "measuring this machine's call costs in full", "measuring the batching noise",
        "learning how often the draft agrees with the target"]


def test_a_prediction_before_the_machine_is_learnt_says_it_is_provisional():
    from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
    from specdemo.serve.values import ONE_AFTER_ANOTHER
    from tests.ui.test_page_render import lane_with, results_of, token

    from specdemo.decoding.events import TARGET
    from specdemo.settings import GenerationSettings

    lanes = {AUTOREGRESSIVE: lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, stop_reason="eos"),
             SPECULATIVE: lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=9.0, rounds=3,
                                    alpha_hat=0.8, stop_reason="eos")}
    html = results_of(lanes, ONE_AFTER_ANOTHER, GenerationSettings(), provisional="no batching noise")
    assert "Provisional: this machine is still being learnt in the background (no batching noise)" in html
    assert "Provisional" not in results_of(lanes, ONE_AFTER_ANOTHER, GenerationSettings())


def test_a_full_measurement_stops_for_something_more_urgent_and_keeps_nothing(engine):
    engine.warm_up(12, quick=True)
    target, draft = engine.target.runtime, engine.draft.runtime
    with pytest.raises(measuring.Interrupted):
        measuring.measure(target, draft, 13, None, interrupted=lambda: True)
    assert engine.costs.provisional  # the provisional curve stands until a full measurement completes


def test_visitors_go_ahead_of_the_servers_yielding_work_and_stop_it_once_it_runs():
    from specdemo.serve import waiting
    from specdemo.serve.visitors import Visitor

    line = waiting.RunQueue(max_waiting=8)
    running = line.join(16, Visitor("a", "10.0.0.1"))
    learning = line.join(1, yields=True)
    visitor = line.join(16, Visitor("b", "10.0.0.2"))
    assert line.ahead(visitor) == 1 and line.ahead(learning) == 2  # b goes before the server's learning
    line.leave(running)
    line.leave(visitor)
    assert line.ahead(learning) == 0 and not line.visitors_behind(learning)
    line.join(16, Visitor("c", "10.0.0.3"))  # the learning has its turn: c waits behind it, and it stops for c
    assert line.visitors_behind(learning)


def test_learning_stopped_for_a_visitor_goes_on_once_the_line_is_empty():
    from types import SimpleNamespace

    from specdemo.serve import learning
    from specdemo.serve.server import Server

    tries, done = [], []

    def full(interrupted):
        tries.append(1)
        if len(tries) == 1:
            raise measuring.Interrupted("a visitor came")
        done.append("full")

    engine = SimpleNamespace(to_learn=lambda k, log, interrupted, pair_only: [] if done else [("full", lambda: full(interrupted))])
    then, said = threading.Event(), []
    learning.learn_in_turns(Server(), engine, said.append, then=then.set, retry_s=0.05)
    assert then.wait(10) and done == ["full"] and len(tries) == 2
    assert any("stopped for a visitor's run" in line for line in said)


def test_a_full_measurement_stops_within_one_call_of_being_asked_even_while_warming_up(engine):
    engine.warm_up(12, quick=True)
    target, draft = engine.target.runtime, engine.draft.runtime
    before = target.requests + draft.requests
    asked = []

    def interrupted():  # a visitor arrives once the measurement has made its third call
        asked.append(target.requests + draft.requests - before)
        return asked[-1] >= 3

    with pytest.raises(measuring.Interrupted):
        measuring.measure(target, draft, 13, None, interrupted=interrupted)
    assert target.requests + draft.requests - before == 3  # not the warm-ups' 14 calls, the prefills' and the steps'
    assert len(asked) == 4


def test_learning_how_often_the_draft_agrees_stops_for_a_visitor_and_keeps_nothing(engine):
    engine.warm_up(12, quick=True)
    steps = dict(engine.to_learn(12, interrupted=lambda: True, pair_only=True))
    with pytest.raises(measuring.Interrupted):
        steps["learning how often the draft agrees with the target"]()
    still = [what for what, _ in engine.to_learn(12, pair_only=True)]
    assert still == ["learning how often the draft agrees with the target"]  # nothing kept: it is taken again


def test_measuring_the_batching_noise_stops_for_a_visitor_and_keeps_nothing(engine):
    engine.warm_up(12, quick=True)
    steps = dict(engine.to_learn(12, interrupted=lambda: True))
    with pytest.raises(measuring.Interrupted):
        steps["measuring the batching noise"]()
    assert engine.noise is None and "measuring the batching noise" in dict(engine.to_learn(12))


def test_learning_stops_part_way_through_a_long_call_when_a_visitor_comes(engine, monkeypatch):
    """A teacher-forced answer is one call of a few hundred tokens (3-7 s on a 2-core AVX2 CPU): a visitor who comes
    during it waits for one node of it, not for the rest of it."""
    monkeypatch.setattr(runtime, "POLL_MS", 0)
    engine.warm_up(12, quick=True)
    asked = []

    def interrupted():  # no one waits before the first answer; someone does once its call has started
        asked.append(1)
        return len(asked) > 1

    steps = dict(engine.to_learn(12, interrupted=interrupted, pair_only=True))
    with pytest.raises(measuring.Interrupted, match="a long call stopped"):
        steps["learning how often the draft agrees with the target"]()
    assert engine.target.runtime.length == 0 or engine.draft.runtime.length == 0


def test_a_full_measurement_stops_within_one_round_of_being_asked_while_timing(engine):
    """Each size's rounds (3 draft steps and a verify call, 7 times) took 1.3 s on a 2-core Zen 3: a visitor who came
    during them waited for all of them. Now a round at most."""
    engine.warm_up(12, quick=True)
    target, draft = engine.target.runtime, engine.draft.runtime
    before = target.requests + draft.requests
    asked_at = 60  # past the warm-ups, the prefills and the single steps: inside the rounds

    def interrupted():
        return target.requests + draft.requests - before >= asked_at

    with pytest.raises(measuring.Interrupted):
        measuring.measure(target, draft, 13, None, interrupted=interrupted)
    assert target.requests + draft.requests - before <= asked_at + 4  # one round: 3 draft steps and a target call
