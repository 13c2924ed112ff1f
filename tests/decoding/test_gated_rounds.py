"""Gated rounds: where no fixed K pays, a round's first draft is verified only when the draft is confident enough for
this machine's break-even; otherwise the target takes a plain step. Priced on synthetic curves (the classes of
machine we do not have), never timed."""

import math

import numpy as np
import pytest

from specdemo.decoding import loops
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED_STRATEGY
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.decoding.k_rules import LOSS_LIMIT, GatedK
from specdemo.decoding.planner import Plan, make_plan, with_confidence_stop
from specdemo.decoding.pricing import Acceptance, best_k, gate_threshold, gated_out_cost, gated_speedup, priced_round
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

STEP = 0.1  # seconds of one target step in the synthetic machines below
PROMPT = [0, 2, 1, 2, 0]


def machine(slope: float, draft_steps: float, n_max: int = 9) -> CostModel:
    """t(n) = t(1) * (1 + slope * (n - 1)); a draft step costs `draft_steps` target steps."""
    target = tuple(STEP * (1 + slope * (n - 1)) for n in range(1, n_max + 1))
    return CostModel(target_s=target, target_prefill_tps=1000.0, target_rollback_s=0.0,
                     draft_s=(STEP * draft_steps, STEP * draft_steps), draft_prefill_tps=4000.0)


COMPUTE_BOUND = machine(0.35, 0.4)  # the issue's edge: t(5) / t(1) = 2.4, a draft step 0.4 of a target step
ZEN_3 = machine(0.425, 0.45)  # an AVX2-only Zen 3: t(5) / t(1) = 2.7, a draft step 0.45
MEMORY_BOUND = machine(0.02, 0.25)  # an AMX Xeon: scoring 9 tokens costs ~1.2 steps


class Draft(FakeModel):
    """A 3-token draft whose top token has probability `p` everywhere: the target's own choice (`right`) or its least
    likely (wrong)."""

    def __init__(self, target: FakeModel, p: float, right: bool = True):
        super().__init__(3, "draft")
        self.target, self.p, self.right = target, p, right

    def logits(self, prefix):
        scores = self.target.logits(prefix)
        top = int(scores.argmax() if self.right else scores.argmin())
        row = np.full(3, (1 - self.p) / 2)
        row[top] = self.p
        return np.log(row).astype(np.float32)


# Each curve with a prior acceptance at which no fixed K pays but a perfect gate could (0.9: this pair's on code)
GATED = [(COMPUTE_BOUND, 0.8), (ZEN_3, 0.9)]
CURVES = ["t(5) 2.4 steps, α 0.8", "t(5) 2.7 steps, α 0.9"]


def gated_run(draft_p: float, right: bool, costs: CostModel, alpha: float, tokens: int = 128):
    """A greedy gated lane (the plan gated_plan makes at prior acceptance α, stops and all) on a fake target, and the
    autoregressive one."""
    target = FakeModel(3, "target", scale=2.0)
    settings = GenerationSettings(max_new_tokens=tokens, k_policy=KPolicy.auto(8))
    plan = with_confidence_stop(make_plan(costs, MASKED_STRATEGY, Acceptance.geometric(alpha), settings.k_policy), None)
    assert plan.gate, "a plan with gated rounds"
    drafter = ModelDrafter(Draft(target, draft_p, right), settings, np.random.default_rng(0), plan.stops, plan.gate)
    speculative = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set(), plan=plan))
    autoregressive = drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, settings, set()))
    return speculative, autoregressive


def priced_speedup(costs: CostModel, speculative, autoregressive) -> float:
    """The autoregressive lane's calls over the speculative lane's, both priced on `costs`."""
    return sum(priced_round(costs, r) for r in autoregressive.rounds) / sum(priced_round(costs, r) for r in speculative.rounds)


def test_the_gate_is_the_break_even_of_verifying_one_draft_whose_step_is_already_paid():
    # One more row in the call against one more token worth a plain step: t(2) / t(1) − 1
    assert gate_threshold(COMPUTE_BOUND) == pytest.approx(0.35)
    assert gate_threshold(ZEN_3) == pytest.approx(0.425)
    assert gate_threshold(MEMORY_BOUND) == pytest.approx(0.02)
    # the loop's own time counts: a round's bookkeeping beyond a step's (0.01 s) against a step of 0.1 s + 0.005 s
    busy = CostModel(COMPUTE_BOUND.target_s, 1000.0, 0.004, COMPUTE_BOUND.draft_s, 4000.0, step_overhead_s=0.005,
                     round_overhead_s=0.011)
    assert gate_threshold(busy) == pytest.approx((0.035 + 0.004 + 0.011 - 0.005) / 0.105, abs=1e-3)
    assert gate_threshold(CostModel((STEP, 2 * STEP), 1000.0, 0.0)) == 0.0  # no draft model: no gate


def test_a_round_the_gate_turns_back_costs_its_draft_step_and_a_plain_step():
    assert gated_out_cost(COMPUTE_BOUND) == pytest.approx(0.04 + 0.1)
    # every round turned back: 1 token for 1.4 steps
    assert gated_speedup(COMPUTE_BOUND, 0.0, Acceptance.geometric(1.0), 4) == pytest.approx(1 / 1.4)
    # every round let through: the round of K drafts as priced without a gate
    full = Acceptance.geometric(0.9)
    assert gated_speedup(MEMORY_BOUND, 1.0, full, 4) == pytest.approx(
        full.expected_tokens(4) * 0.1 / (0.1 * (1 + 0.02 * 4) + 4 * 0.025), rel=0.05)


def test_where_no_fixed_k_pays_the_planner_plans_gated_rounds_that_can_pay():
    policy = KPolicy.auto(8)
    assert best_k(COMPUTE_BOUND, Acceptance.geometric(0.8), 8)[0] == 0  # every fixed K loses
    plan = make_plan(COMPUTE_BOUND, MASKED_STRATEGY, Acceptance.geometric(0.8), policy)
    assert plan.k > 0 and plan.gate == gate_threshold(COMPUTE_BOUND)
    assert isinstance(plan.rule(), GatedK)
    assert "gated rounds can pay at best" in plan.reason and "at least 0.35" in plan.reason
    # a draft so poor that even a perfect gate cannot pay it, or a curve so steep: the target alone
    assert make_plan(COMPUTE_BOUND, MASKED_STRATEGY, Acceptance.geometric(0.2), policy).k == 0
    assert make_plan(machine(0.425, 0.57), MASKED_STRATEGY, Acceptance.geometric(0.9), policy).k == 0


def test_where_a_fixed_k_pays_the_gate_stays_off():
    for policy in (KPolicy.auto(8), KPolicy.fixed(4)):
        plan = make_plan(MEMORY_BOUND, MASKED_STRATEGY, Acceptance.geometric(0.8), policy)
        assert plan.k > 0 and plan.gate == 0.0
    assert make_plan(COMPUTE_BOUND, MASKED_STRATEGY, Acceptance.geometric(0.8), KPolicy.fixed(4)).gate == 0.0


@pytest.mark.parametrize("draft_p, right", [(0.34, True), (0.99, False), (0.6, False)],
                         ids=["never confident", "confident and always wrong", "confident enough and wrong"])
@pytest.mark.parametrize("costs, alpha", GATED, ids=CURVES)
def test_gated_rounds_never_fall_below_097_of_the_target_alone(draft_p, right, costs, alpha):
    """Priced on the curve, not timed: whatever the draft, gating stops once it has cost LOSS_LIMIT steps."""
    speculative, autoregressive = gated_run(draft_p, right, costs, alpha)
    assert speculative.ids == autoregressive.ids
    assert priced_speedup(costs, speculative, autoregressive) >= 0.97
    assert speculative.rounds[-1].k == 0  # it stopped gating


@pytest.mark.parametrize("costs, alpha", GATED, ids=CURVES)
def test_gated_rounds_pay_where_the_draft_is_confident_and_right(costs, alpha):
    speculative, autoregressive = gated_run(0.97, True, costs, alpha)
    assert speculative.ids == autoregressive.ids
    assert priced_speedup(costs, speculative, autoregressive) > 1.05
    assert all(r.k or r.rescored for r in speculative.rounds[1:-1])  # it never stopped gating (its first two rounds:
    #                                                                  re-scoring probes, as no run has checked the curve)


def test_greedy_gated_rounds_write_the_autoregressive_text_and_keep_the_caches_in_step():
    """Half the rounds turned back, half drafted and some rejected: the text is the target's own, and after the run
    the draft's cache holds a prefix of the text (it saw the target's tokens of the rounds it sat out)."""
    target = FakeModel(3, "target", scale=2.0)
    draft = FakeModel(3, "draft", scale=2.0)  # its own function: often wrong, sometimes unsure
    settings = GenerationSettings(max_new_tokens=60, k_policy=KPolicy.fixed(3))
    drafter = ModelDrafter(draft, settings, np.random.default_rng(0), gate=0.7)
    run = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set()))
    autoregressive = drain(loops.autoregressive(FakeModel(3, "target", scale=2.0), FakeTokenizer(), PROMPT, settings, set()))
    assert run.ids == autoregressive.ids
    gated = [r.gated for r in run.rounds[1:]]
    assert 0.2 < sum(gated) / len(gated) < 0.8
    assert any(r.rejected for r in run.rounds) and any(r.accepted for r in run.rounds)
    text = PROMPT + run.ids
    assert target.cache == text[:-1] and draft.cache == text[: draft.length]
    assert run.summary.gated == sum(gated) and run.summary.rounds == sum(r.drafted > 0 for r in run.rounds)


def test_a_gated_lane_says_what_the_gate_did():
    plan = make_plan(COMPUTE_BOUND, MASKED_STRATEGY, Acceptance.geometric(0.8), KPolicy.auto(8))
    assert plan.describe(1.64, drafted=40, gated=12) == "K chosen by the planner (mean 1.6); gated: 40 of 52 rounds drafted"
    assert plan.to_dict()["gate"] == plan.gate


def test_gating_stops_once_it_has_cost_the_loss_limit():
    rule = GatedK(ZEN_3, 2)
    from specdemo.decoding.events import Round

    def turned_back(i):  # a draft step, then a plain step: 0.45 of a step lost
        return Round(i, 0, 2, "", [(1, 0.0)], 0.0, 1, 0.0, 0, 0, 1, 0.0, 0.0)

    prefill = Round(0, 0, 0, "", [], 0.0, 5, 0.0, 0, 0, 1, 0.0, 0.0)
    rounds = [prefill]
    ks = []
    for i in range(1, 10):
        ks.append(rule.next_k(rounds))
        rounds.append(turned_back(i))
    lost = math.ceil(LOSS_LIMIT / 0.45)  # rounds turned back until the loss passes the limit
    assert ks == [2] * lost + [0] * (9 - lost)


def test_the_benchs_curves_are_the_issues_compute_bound_class_and_gate_where_no_fixed_k_pays():
    from specdemo.bench.gating import CURVES, leave_one_out

    for costs in CURVES.values():
        assert costs.verify_steps(5) >= 2.4 and costs.d(1) / costs.t(1) >= 0.4
    # three answers whose drafts match 9 in 10: each one's prior is what the other two teach
    masks = [[1] + [0 if j % 10 == 0 else 1 for j in range(1, 101)] for _ in range(3)]
    prior = leave_one_out(masks, 0, 8)
    assert 0.85 < prior.rate(1) < 0.95
    edge = CURVES["t(5) = 2.4 steps, draft 0.40"]
    assert make_plan(edge, MASKED_STRATEGY, Acceptance.geometric(0.8), KPolicy.auto(8)).gate == gate_threshold(edge)
