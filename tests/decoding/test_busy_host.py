"""A plan that holds on a shared host (issue 48, item 4): a measurement taken while others load the machine is seen as
such, taken again, and kept as provisional if still busy; the plans made on it say so; runs correct it, and the plan
follows within a few runs and says when it changed. Synthetic: fake models whose calls report chosen seconds, fake
/proc/stat texts."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from specdemo.decoding import loops
from specdemo.decoding.costs import CLEAN_RUNS, CostModel, fold
from specdemo.decoding.drafters import strategy
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.decoding.planner import make_plan, plan_change
from specdemo.decoding.pricing import Acceptance
from specdemo.host import load
from specdemo.learning import measuring, race
from specdemo.results import metrics
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

PROMPT = [0, 1, 2, 1, 0, 2, 2]
MODEL = strategy("model")
ACCEPTANCE = Acceptance.geometric(0.8)
AUTO = KPolicy.auto()


def quiet_target(n: int) -> float:
    """This host's quiet target: 40 ms a step, each further token scored 25 % of a step (a prefill: 1 ms a token)."""
    return n * 0.001 if n > 20 else 0.04 * (1 + 0.25 * (n - 1))


def quiet_draft(n: int) -> float:
    return 0.012 * n


def busy_target(n: int) -> float:
    """The same target beside a busy loop on one of two cores: a single step waits for the descheduled thread (2×),
    a longer call less so (its work hides the wait), so scoring many tokens looks nearly free."""
    return quiet_target(n) * (2.0 if n == 1 else 1.2)


def stat_texts(steal_share: float, others_share: float):
    """/proc/stat texts, one a read, of a 2-core host where each read follows the last by 2 CPU seconds (200 ticks at
    100 a second, whatever this host's own tick), that share of them stolen and that share busy for others."""
    for i in itertools.count():
        steal, busy = int(200 * steal_share * i), int(200 * others_share * i)
        idle = 200 * i - steal - busy
        yield f"cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n"


@pytest.fixture
def host(monkeypatch):
    """host(steal, others): the /proc/stat the measurements read from now on; the tests' blanket "ignore" lifted."""
    monkeypatch.delenv("SPECDEMO_HOST_LOAD", raising=False)

    def on(steal: float = 0.0, others: float = 0.0) -> None:
        texts = stat_texts(steal, others)
        monkeypatch.setattr(load, "read_stat", lambda: next(texts))
    on()
    monkeypatch.setattr(load, "WATCH_S", 0.0)  # the host watched before a repeat: its /proc/stat texts are made up
    return on


def measure(target_cost, draft_cost=quiet_draft, log=None) -> CostModel:
    """measuring.measure in full, on fake models whose calls report these seconds."""
    target, draft = FakeModel(50, "target", seconds=target_cost), FakeModel(50, "draft", seconds=draft_cost)
    return measuring.measure(target, draft, 13, log=log if log is not None else (lambda message: None))


def takes(log: list[str]) -> int:
    """Takes of the full measurement, as its log says them."""
    return 1 + sum("measuring again" in line for line in log)


def test_a_measurement_on_a_quiet_host_is_taken_once_and_not_provisional(host):
    log = []
    costs = measure(quiet_target, log=log.append)
    assert takes(log) == 1
    assert costs.busy == "" and costs.host["steal"] == 0 and costs.host["spread"] == 0


def test_a_measurement_while_the_hypervisor_steals_time_is_kept_as_provisional_at_once_if_the_host_stays_busy(host):
    host(steal=0.18)
    log = []
    costs = measure(quiet_target, log=log.append)
    assert takes(log) == 1  # the host watched after the take: still busy, so another take would be busy too
    assert any("the host is still busy (other processes 0 % of the CPU time, steal 18 %" in line for line in log)
    assert costs.busy.startswith("measured while the host was busy: steal 18 %")
    assert any(line.startswith("kept as provisional") for line in log)
    assert "provisional until runs correct it" in costs.standing()


def test_a_busy_measurement_is_taken_again_up_to_its_repeats_while_the_host_looks_quiet_between_takes(host, monkeypatch):
    host(steal=0.18)
    monkeypatch.setattr(load, "busy_now", lambda seconds: None)  # a neighbour who pauses whenever we look
    log = []
    costs = measure(quiet_target, log=log.append)
    assert takes(log) == 1 + measuring.BUSY_REPEATS and costs.busy


def test_a_measurement_while_another_process_takes_a_core_is_busy(host):
    host(others=0.5)
    costs = measure(quiet_target)
    assert abs(costs.host["others"] - 0.5) < 0.05  # less this process's own CPU time while measuring
    assert "other processes" in costs.busy


def test_repeats_far_apart_are_a_busy_host_even_where_the_counters_show_nothing(host):
    jitter = itertools.cycle([1.0, 1.5])
    assert "apart" in measure(lambda n: quiet_target(n) * next(jitter)).busy


def test_a_busy_take_then_a_quiet_one_keeps_the_quiet_one(host, monkeypatch):
    host(steal=0.3)
    time_loop, taken = measuring._time_loop, []

    def neighbour_leaves_after_the_first_take(*args, **kwargs):
        taken.append(1)
        try:
            return time_loop(*args, **kwargs)
        finally:
            host()
    monkeypatch.setattr(measuring, "_time_loop", neighbour_leaves_after_the_first_take)
    log = []
    costs = measure(quiet_target, log=log.append)
    assert takes(log) == 2 and costs.busy == ""


def test_where_every_take_is_busy_each_calls_fastest_is_kept_so_a_burst_in_one_take_is_not(host, monkeypatch):
    host(others=0.5)
    time_loop, take = measuring._time_loop, [0]
    bursts = {1: 6, 2: 9, 3: 4}  # in each take a neighbour's burst lands on another call size: 3× its time

    def counted(*args, **kwargs):
        take[0] += 1
        return time_loop(*args, **kwargs)
    monkeypatch.setattr(measuring, "_time_loop", counted)
    monkeypatch.setattr(load, "busy_now", lambda seconds: None)  # quiet whenever watched between takes
    costs = measure(lambda n: busy_target(n) * (3.0 if n == bursts.get(take[0]) else 1.0))
    monkeypatch.setattr(measuring, "_time_loop", time_loop)
    assert costs.busy and costs.target_s == measure(busy_target).target_s  # the curve as if no burst had come


def test_a_plan_made_on_a_busy_measurement_is_provisional_and_says_why():
    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=1000.0, target_rollback_s=0.001,
                      draft_s=(0.012, 0.013), busy="measured while the host was busy: steal 18 %, load 2.9 on 2 cores")
    plan = make_plan(costs, MODEL, ACCEPTANCE, AUTO)
    assert plan.provisional == costs.busy
    assert "Provisional: this machine's call costs were measured while the host was busy: steal 18 %" in plan.reason
    assert make_plan(CostModel(**{**costs.to_dict(), "busy": ""}), MODEL, ACCEPTANCE, AUTO).provisional == ""


# ---- two empty homes on one host, one measured beside a busy loop


def run_pair(k: int) -> list[dict]:
    """One autoregressive run and one speculative run at K (none at K = 0: the target alone) of the real loops on the
    quiet host; their calls as folded into the model."""
    target, draft = FakeModel(3, "target", seconds=quiet_target), FakeModel(3, "draft", seconds=quiet_draft)
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(max(k, 1)))
    runs = [drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, settings, set()))]
    if k:
        drafter = ModelDrafter(draft, settings, np.random.default_rng(0))
        runs.append(drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set())))
    return [metrics.call_seconds(run.rounds) for run in runs]


def test_two_homes_one_measured_beside_a_busy_loop_reach_the_same_plan_within_five_runs(host):
    quiet = measure(quiet_target)
    host(others=0.5)
    busy = measure(busy_target)
    clean_plan = make_plan(quiet, MODEL, ACCEPTANCE, AUTO)
    plan = make_plan(busy, MODEL, ACCEPTANCE, AUTO)
    assert plan.k != clean_plan.k and plan.provisional  # the busy home plans otherwise, and says it is provisional
    said, at = [], 0.0
    for run in range(1, 6):
        for observation in run_pair(plan.k):
            at += 30
            busy = fold(busy, observation, at=at)
        before, plan = plan, make_plan(busy, MODEL, ACCEPTANCE, AUTO)
        said.append(plan_change(before, plan))
        if plan.k == clean_plan.k and not plan.provisional:
            break
    assert plan.k == clean_plan.k and not plan.provisional and run <= 5
    assert any(line.startswith("The plan changed after") and f"→ {clean_plan.k}" in line for line in said), said
    assert "no longer provisional" in busy.last_change or busy.runs >= CLEAN_RUNS


def test_runs_that_disagree_leave_a_busy_measurement_provisional():
    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=1000.0, target_rollback_s=0.001, busy="measured while "
                      "the host was busy: steal 18 %")
    for i, step in enumerate([0.04, 0.07, 0.04, 0.08, 0.05]):  # a host still busy: each run pays another step
        costs = fold(costs, {"target": {1: step}}, at=60.0 * i)
    assert costs.busy


def test_a_change_of_k_is_said_in_one_line_and_no_change_says_nothing():
    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=1000.0, target_rollback_s=0.001, draft_s=(0.012, 0.013))
    before = make_plan(costs, MODEL, ACCEPTANCE, AUTO)
    assert plan_change(before, before) == ""
    steep = CostModel(target_s=tuple(0.04 * n for n in range(1, 14)), target_prefill_tps=1000.0,
                      target_rollback_s=0.001, draft_s=(0.012, 0.013), runs=3, last_change="t(5)/t(1) 1.00 → 5.00")
    after = make_plan(steep, MODEL, ACCEPTANCE, AUTO)
    said = f"The plan changed after 3 runs: K {before.k} → 0 (costs: t(5)/t(1) 1.00 → 5.00)."
    assert plan_change(before, after) == said


# ---- a clean curve that says no K pays, checked by the run that follows it


def flat_target(n: int) -> float:
    """A memory-bound target (an AMX Xeon's kind): each further token scored costs 10 % of a 40-ms step."""
    return n * 0.001 if n > 20 else 0.04 * (1 + 0.1 * (n - 1))


def steep_target(n: int) -> float:
    """A compute-bound target (a Zen 3's kind): each further token scored costs 42 % of a step."""
    return n * 0.003 if n > 20 else 0.04 * (1 + 0.42 * (n - 1))


def too_steep(costs: CostModel, factor: float) -> CostModel:
    """`costs` as if every call on more than one token had been measured `factor` times slower: clean, and wrong."""
    curve = (costs.target_s[0], *(s * factor for s in costs.target_s[1:]))
    return replace(costs, target_s=curve, measured_target_s=curve)


def run_both(plan, target_cost, draft_cost=quiet_draft):
    """The real loops on fake models of these costs: the autoregressive lane and the speculative lane as `plan` runs it
    (greedy, 40 tokens)."""
    target, draft = FakeModel(3, "target", seconds=target_cost), FakeModel(3, "draft", seconds=draft_cost)
    settings = GenerationSettings(max_new_tokens=40, k_policy=AUTO)
    ar = drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, settings, set()))
    drafter = ModelDrafter(draft, settings, np.random.default_rng(0))
    return ar, drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set(), plan=plan))


def paid(run) -> float:
    """What a run's calls and trims cost on the fake clock (its decoding, the prefill left out)."""
    return sum(r.verify_s + r.draft_s + r.rollback_s for r in run.rounds[1:])


def test_a_clean_curve_measured_too_steep_to_draft_is_corrected_by_the_first_run_that_follows_it(host):
    truth = measure(flat_target)
    right = make_plan(truth, MODEL, ACCEPTANCE, AUTO)
    wrong = too_steep(truth, 1.7)  # a 2-token call measured at 1.87 steps where it costs 1.1
    plan = make_plan(wrong, MODEL, ACCEPTANCE, AUTO)
    assert right.k > 0 and not right.gate and plan.gate and not plan.provisional  # no fixed K pays: gated rounds
    assert plan.rescore == 2 and "2 of its steps score 2 tokens each (the last token again" in plan.reason
    ar, spec = run_both(plan, flat_target)
    assert [r.rescored for r in spec.rounds[1:4]] == [True, True, False]  # two probes, then the plan's rounds
    assert [r.verify_tokens for r in spec.rounds[1:3]] == [2, 2]
    assert spec.ids == ar.ids  # each probe still gives the target's own token
    for run in (ar, spec):
        wrong = fold(wrong, metrics.call_seconds(run.rounds))
    after = make_plan(wrong, MODEL, ACCEPTANCE, AUTO)
    assert after.k == right.k and after.rescore == 0
    assert "t(3)/t(1) 2.04 → 1.20" in wrong.last_change


def test_a_curve_right_to_say_no_k_pays_costs_its_first_run_under_one_target_step_and_is_not_probed_again(host):
    truth = measure(steep_target, lambda n: 0.45 * 0.04 * n)  # a draft step 0.45 of a target step
    plan = make_plan(truth, MODEL, ACCEPTANCE, AUTO)
    assert plan.k == 0 and plan.rescore == 2
    ar, spec = run_both(plan, steep_target)
    assert spec.ids == ar.ids
    # 0.84 of a step, and the two trims (real time, microseconds)
    assert paid(spec) - paid(ar) == pytest.approx(2 * (steep_target(2) - steep_target(1)), abs=0.002)
    assert paid(ar) / paid(spec) >= 0.97
    for run in (ar, spec):
        truth = fold(truth, metrics.call_seconds(run.rounds))
    again = make_plan(truth, MODEL, ACCEPTANCE, AUTO)
    assert again.k == 0 and again.rescore == 0 and "No run has paid" not in again.reason


def test_only_a_plan_that_drafts_nothing_on_an_unchecked_curve_probes():
    unchecked = measure(steep_target, lambda n: 0.45 * 0.04 * n)
    assert make_plan(unchecked, MODEL, ACCEPTANCE, KPolicy.fixed(3)).rescore == 0  # a fixed K drafts: it checks
    assert make_plan(measure(flat_target), MODEL, ACCEPTANCE, AUTO).rescore == 0  # a K pays: its rounds check
    probed = make_plan(unchecked, MODEL, ACCEPTANCE, AUTO).rescore
    assert probed == 2
    checked = fold(unchecked, {"target": {1: 0.04, probed: steep_target(probed)}})
    assert checked.observed(probed) and make_plan(checked, MODEL, ACCEPTANCE, AUTO).rescore == 0
    assert not fold(unchecked, {"target": {1: 0.04}}).observed(probed)


def middle_target(n: int) -> float:
    """A target between the two: each further token scored costs 20 % of a step."""
    return n * 0.001 if n > 20 else 0.04 * (1 + 0.2 * (n - 1))


@pytest.mark.parametrize("target_cost, factor", [(middle_target, 1.1), (quiet_target, 1.45)],
                         ids=["a K pays on both, another one", "no fixed K pays on the steeper"])
def test_two_clean_homes_whose_curves_disagree_plan_the_same_k_within_five_runs(host, target_cost, factor):
    """Two empty homes on one quiet host measure curves a little apart (noise just under the busy thresholds): each
    plans its own K at first; the runs that follow correct both curves to what the calls cost, and the plans meet."""
    homes = [measure(target_cost), too_steep(measure(target_cost), factor)]
    plans = [make_plan(costs, MODEL, ACCEPTANCE, AUTO) for costs in homes]
    assert plans[0].k != plans[1].k and not plans[0].gate
    for run in range(1, 6):
        for i, plan in enumerate(plans):
            for lane in run_both(plan, target_cost):
                homes[i] = fold(homes[i], metrics.call_seconds(lane.rounds))
        plans = [make_plan(costs, MODEL, ACCEPTANCE, AUTO) for costs in homes]
        if plans[0].k == plans[1].k and not plans[0].gate and not plans[1].gate:
            break
    assert plans[0].k == plans[1].k and not plans[1].gate and run <= 5


# ---- the races tune and the draft plan decide by


class Sampled:
    """A stand-in compile whose samples are drawn one after another from `seconds`."""

    def __init__(self, seconds):
        self.seconds = iter(seconds)

    def reset(self):
        pass

    def forward(self, ids, logits_to_keep=1):
        pass


def draw(model, other) -> float:
    return next(model.seconds)


def counting(taken: list):
    """`draw`, noting each sample it takes in `taken`."""
    def counted(model, other):
        taken.append(1)
        return draw(model, other)
    return counted


@pytest.mark.parametrize("quiet_between", [False, True], ids=["the host stays busy", "the host looks quiet between"])
def test_a_race_run_to_its_cap_on_a_busy_host_is_run_again_where_the_host_looks_quiet_then_marked(host, monkeypatch,
                                                                                                 quiet_between):
    host(others=0.5)
    if quiet_between:
        monkeypatch.setattr(load, "busy_now", lambda seconds: None)
    taken = []
    counted = counting(taken)
    tie = itertools.cycle([0.050, 0.052, 0.049, 0.051])  # the challenger neither faster nor slower
    verdict = race.race(Sampled(tie), Sampled(itertools.cycle([0.051, 0.049, 0.050, 0.052])), None, counted)
    assert verdict.pairs == race.MAX_PAIRS and not verdict.faster
    assert len(taken) == 2 * race.MAX_PAIRS * (1 + (race.BUSY_REPEATS if quiet_between else 0))
    assert verdict.busy.startswith("measured while the host was busy")


def test_a_race_that_settles_on_a_busy_host_stands_and_a_clean_one_is_not_marked(host):
    host(others=0.5)
    taken = []
    clear = race.race(Sampled(itertools.repeat(0.050)), Sampled(itertools.repeat(0.040)), None, counting(taken))
    assert clear.faster and clear.pairs == race.MIN_PAIRS and len(taken) == 2 * race.MIN_PAIRS
    host()
    assert race.race(Sampled(itertools.repeat(0.050)), Sampled(itertools.repeat(0.050)), None, draw).busy == ""


def test_a_draft_plan_priced_on_a_busy_curve_or_a_busy_race_is_provisional_and_kept_so():
    from specdemo.learning.draft_choice import DraftOption, from_dict, price, to_dict
    from tests.decoding.test_planner import machine

    def option(head, step_s, busy=""):
        return DraftOption("int4", head, rows=head or 151_936, step_s=step_s, tested=[10_000] * 12,
                           accepted=[9_000] * 12, provisional=busy)
    avx2 = machine(0.30, draft_steps=0.50, n_max=13)
    best = price([option(0, 0.050), option(16_000, 0.0375, busy="measured while the host was busy: steal 18 %")], avx2)
    assert best.provisional == "measured while the host was busy: steal 18 %"
    busy_curve = replace(avx2, busy="measured while the host was busy: load 2.9 on 2 cores")
    assert price([option(0, 0.050), option(16_000, 0.0375)], busy_curve).provisional == busy_curve.busy
    assert price([option(0, 0.050), option(16_000, 0.0375)], avx2).provisional == ""
    assert from_dict(to_dict(best)).provisional == best.provisional
    assert from_dict({k: v for k, v in to_dict(best).items() if k != "provisional"}).provisional == ""  # an older file


def test_a_change_of_k_by_what_runs_taught_of_acceptance_says_so():
    costs = CostModel(target_s=tuple(0.04 * (1 + 0.25 * (n - 1)) for n in range(1, 14)), target_prefill_tps=1000.0,
                      target_rollback_s=0.001, draft_s=(0.012, 0.013), runs=2)
    before, after = (make_plan(costs, MODEL, Acceptance.geometric(alpha), AUTO) for alpha in (0.8, 0.3))
    assert before.k != after.k
    said = f"The plan changed after 2 runs: K {before.k} → {after.k} (α = 0.80 → α = 0.30)."
    assert plan_change(before, after) == said


def test_a_draft_plan_whose_losing_challenger_raced_on_a_busy_host_is_provisional_too():
    from specdemo.learning.draft_choice import DraftOption, price
    from tests.decoding.test_planner import machine

    def option(head, step_s, busy=""):
        return DraftOption("int4", head, rows=head or 151_936, step_s=step_s, tested=[10_000] * 12,
                           accepted=[9_000] * 12, provisional=busy)
    loser = option(16_000, 0.060, busy="measured while the host was busy: other processes 50 % of the CPU time")
    best = price([option(0, 0.050), loser], machine(0.30, draft_steps=0.50, n_max=13))
    assert not best.head_tokens and best.provisional == loser.provisional  # a quiet race might have crowned it


def test_runs_on_a_host_still_busy_leave_a_busy_measurement_provisional_even_when_they_agree():
    costs = CostModel(target_s=(0.08,) * 13, target_prefill_tps=1000.0, target_rollback_s=0.001, busy="measured while "
                      "the host was busy: other processes 80 % of the CPU time")
    for i in range(5):  # a neighbour loading the host all along: every run pays the same, and was watched busy
        costs = fold(costs, {"target": {1: 0.08}, "busy": True}, at=60.0 * i)
    assert costs.busy
    for i in range(CLEAN_RUNS):  # the neighbour gone
        costs = fold(costs, {"target": {1: 0.04}}, at=600.0 + 60 * i)
    assert not costs.busy and "no longer provisional: 3 clean runs" in costs.last_change


def test_a_measurement_kept_busy_is_taken_again_at_the_next_starts_until_one_is_clean_or_three_were_busy(host):
    # runs correct only the calls a plan makes: a busy "no K pays" drafts nothing and so is never corrected by them
    host(others=0.5)
    first = measuring.counted(measure(busy_target), None)
    assert first.busy_takes == 1 and measuring.measure_again(first)
    second = measuring.counted(measure(busy_target), first)
    assert second.busy_takes == 2 and measuring.measure_again(second)
    third = measuring.counted(measure(busy_target), second)
    assert third.busy_takes == measuring.BUSY_MEASUREMENTS and not measuring.measure_again(third)  # kept, provisional
    host()
    clean = measuring.counted(measure(quiet_target), second)
    assert clean.busy == "" and clean.busy_takes == 0 and not measuring.measure_again(clean)
    quick = replace(first, provisional=True)  # a page's quick curve is measured in full anyway, not "again"
    assert not measuring.measure_again(quick) and measuring.counted(first, quick).busy_takes == 1
    assert CostModel.from_dict(third.to_dict()).busy_takes == 3  # kept in the machine profile
