"""The planner: predictions from measured costs, the acceptance model, the choice of K and of the drafter."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdemo.decoding import loops
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.decoding.events import ACCEPTED, Round
from specdemo.decoding.drafters import STRATEGIES
from specdemo.decoding.k_rules import PROBE_EVERY, AutoK, FixedK, GrowShrinkK
from specdemo.decoding.planner import Plan, make_plan, quotes_text, unpriced
from specdemo.decoding.pricing import Acceptance, best_k, predicted_lane_speedup, predicted_speedup
from specdemo.results.lane import drain
from specdemo.results.metrics import alpha_hat, leviathan_speedup
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

MODEL = STRATEGIES["model"]  # the draft model's strategy, which every plan below drafts with
STEP = 0.1  # seconds of one target step in the synthetic machines below


def machine(verify_steps_per_token: float, draft_steps: float = 0.25, n_max: int = 9) -> CostModel:
    """A synthetic machine: t(n) = t(1) * (1 + slope * (n - 1)); a draft step costs `draft_steps` target steps."""
    target = tuple(STEP * (1 + verify_steps_per_token * (n - 1)) for n in range(1, n_max + 1))
    return CostModel(target_s=target, target_prefill_tps=1000.0, target_rollback_s=0.0,
                     draft_s=(STEP * draft_steps, STEP * draft_steps), draft_prefill_tps=4000.0)


MEMORY_BOUND = machine(0.02)  # an AMX Xeon: scoring 9 tokens costs ~1.2 steps
COMPUTE_BOUND = machine(0.35, draft_steps=0.45)  # an AVX2-only CPU: 5 tokens cost ~2.4 steps, a costly draft


def geometric(alpha: float) -> Acceptance:
    return Acceptance.geometric(alpha)


def rounds_of(*outcomes: tuple[int, int]) -> list[Round]:
    """Rounds that drafted `drafted` tokens and kept `accepted` of them, for the K policies."""
    return [Round(i + 1, 0, d, "model", [], 0.0, d + 1, 0.0, d, a, a + 1, 0.0, 0.0) for i, (d, a) in enumerate(outcomes)]


def test_with_a_free_verify_the_prediction_is_leviathans_equation_one():
    flat = CostModel(target_s=(STEP,) * 9, target_prefill_tps=1e9, target_rollback_s=0.0,
                     draft_s=(STEP * 0.2, STEP * 0.2), draft_prefill_tps=1e9)
    assert predicted_speedup(flat, geometric(0.8), 4) == pytest.approx(leviathan_speedup(0.8, 4, 0.2))


def test_expected_tokens_per_round_counts_the_targets_own_token():
    assert geometric(0.0).expected_tokens(4) == 1.0
    assert geometric(1.0).expected_tokens(4) == 5.0
    assert geometric(0.5).expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)


def test_acceptance_by_position_multiplies_the_conditional_rates():
    acceptance = Acceptance((0.9, 0.5))  # the second draft on is accepted half the time, given the first was
    assert acceptance.expected_tokens(3) == pytest.approx(1 + 0.9 + 0.45 + 0.225)
    assert acceptance.all_accepted(3) == pytest.approx(0.9 * 0.5 * 0.5)


def test_few_trials_at_a_position_follow_the_pooled_rate_and_many_speak_for_themselves():
    prior = geometric(0.5)
    few = Acceptance.from_counts([1000, 2], [900, 0], prior)  # the second position: 2 trials, both failed
    assert few.rate(1) == pytest.approx(0.9, abs=0.01) and few.rate(2) > 0.7
    many = Acceptance.from_counts([1000, 800], [900, 400], prior)
    assert many.rate(2) == pytest.approx(0.5, abs=0.02)
    assert Acceptance.from_counts([0, 0], [0, 0], prior).rate(2) == pytest.approx(0.5)  # no evidence: the prior


def test_a_flat_cost_curve_picks_a_long_draft():
    k, speedup = best_k(MEMORY_BOUND, geometric(0.9), k_max=8)
    assert k >= 5 and speedup > 1.9


def test_a_compute_bound_curve_picks_a_short_draft_or_none():
    k, speedup = best_k(COMPUTE_BOUND, geometric(0.9), k_max=8)
    assert k <= 2
    assert best_k(COMPUTE_BOUND, geometric(0.6), k_max=8) == (0, 1.0)  # nothing pays: the target alone


def test_a_better_draft_never_gets_a_shorter_k():
    ks = [best_k(MEMORY_BOUND, geometric(alpha), k_max=8)[0] for alpha in (0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks)


def test_a_plan_that_finds_no_gain_says_so_and_runs_the_target_alone():
    plan = make_plan(COMPUTE_BOUND, MODEL, geometric(0.6), KPolicy.auto(8))
    assert plan.k == 0 and plan.planned_speedup == 1.0
    assert "No K pays" in plan.reason
    # A plan at K = 0 holds for the whole run, whatever its rounds say: such a run teaches the planner through its match
    # mask afterwards (test_counterfactual), not by probing at 5-8 % of its time. A plan that drafts follows its rounds:
    # the same costs and prior, started at K = 4, go up on drafts that agree and to 0 on drafts that fail.
    agreeing, failing = rounds_of(*[(4, 4)] * 12), rounds_of(*[(4, 0)] * 12)
    assert plan.rule().next_k(agreeing) == 0
    assert plan.rule().next_k(failing) == 0
    drafting = replace(plan, k=4)
    assert drafting.rule().next_k(agreeing) == 2
    assert drafting.rule().next_k(failing) == 0


def test_auto_k_follows_the_running_alpha():
    plan = make_plan(MEMORY_BOUND, MODEL, geometric(0.8), KPolicy.auto(8))
    high = plan.rule().next_k(rounds_of(*[(6, 6)] * 60))
    low = plan.rule().next_k(rounds_of(*[(4, 0), (4, 1)] * 40))
    assert 1 <= low < high <= 8


def test_the_whole_lane_prediction_pays_for_the_draft_prefill():
    after_prompt = predicted_speedup(MEMORY_BOUND, geometric(0.9), 4)
    short = predicted_lane_speedup(MEMORY_BOUND, geometric(0.9), 4, tokens=5, prompt_tokens=2000)
    long = predicted_lane_speedup(MEMORY_BOUND, geometric(0.9), 4, tokens=500, prompt_tokens=2000)
    assert short < long < after_prompt


def test_alpha_hat_recovers_a_known_alpha_from_simulated_rounds():
    rng = np.random.default_rng(0)
    alpha, k = 0.83, 4
    outcomes = []
    for _ in range(20_000):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        outcomes.append((k, n))
    rounds = rounds_of(*outcomes)
    assert alpha_hat(rounds) == pytest.approx(alpha, abs=0.01)
    # accepted / proposed, by contrast, counts the untested drafts after a rejection as failures
    assert sum(n for _, n in outcomes) / (20_000 * k) < alpha - 0.05


def test_grow_shrink_k_grows_after_a_full_round_and_shrinks_after_a_rejection_within_its_bounds():
    policy = GrowShrinkK(k=3, k_min=2, k_max=5)
    rounds, ks = [], []
    for full in (None, True, True, True, True, False, False, False, False):
        if full is not None:
            rounds += rounds_of((3, 3 if full else 1))
        ks.append(policy.next_k(rounds))
    assert ks == [3, 4, 5, 5, 5, 4, 3, 2, 2]


@given(k_min=st.integers(1, 8), span=st.integers(0, 8), start=st.integers(0, 8),
       rounds=st.lists(st.one_of(st.none(), st.booleans()), max_size=40))
def test_grow_shrink_k_moves_one_step_a_round_and_never_leaves_its_bounds(k_min, span, start, rounds):
    k_max = k_min + span
    k = k_min + min(start, span)
    policy = GrowShrinkK(k, k_min, k_max)
    seen = []
    for full in rounds:  # None: a round that drafted nothing (one token left), nothing to learn from
        seen += rounds_of((2, 2 if full else 0)) if full is not None else [Round(0, 0, 0, "", [], 0.0, 1, 0.0, 0, 0, 1, 0.0, 0.0)]
        expected = k if full is None else min(k + 1, k_max) if full else max(k - 1, k_min)
        k = policy.next_k(seen)
        assert k == expected and k_min <= k <= k_max


def _adaptive_rounds(draft: FakeModel, settings: GenerationSettings) -> list[tuple[int, int, int]]:
    """Run the real loop with an adaptive K on fake models: (K drafted, drafts kept, tokens left) per round."""
    prompt, drafted = [0, 1, 2], []
    drafter = ModelDrafter(draft, settings, np.random.default_rng(0))
    propose = drafter.propose

    def spy(seq, k):
        drafted.append((k, settings.max_new_tokens - (len(seq) - len(prompt))))
        return propose(seq, k)

    drafter.propose = spy
    run = drain(loops.speculative(FakeModel(3, "target"), drafter, FakeTokenizer(), prompt, settings, set()))
    kept = [sum(t.source == ACCEPTED and t.step == step for t in run.tokens) for step in range(1, len(drafted) + 1)]
    return [(k, n, left) for (k, left), n in zip(drafted, kept)]


@pytest.mark.parametrize("draft, outcome", [
    (FakeModel(3, "target"), "every draft kept"),  # the target's own function: K grows to k_max and stays
    (FakeModel(3, "target", scale=-1.0), "every round rejects"),  # its argmin: K shrinks to k_min and stays
    (FakeModel(3, "draft"), "both"),
])
def test_the_loop_drafts_as_many_tokens_as_grow_shrink_k_asks(draft, outcome):
    settings = GenerationSettings(max_new_tokens=80, k_policy=KPolicy("adaptive", k=3, k_min=2, k_max=6))
    rounds = _adaptive_rounds(draft, settings)
    policy = settings.k_policy
    k = policy.k
    for drafted, kept, left in rounds:
        assert drafted == min(k, left - 1)  # never past max_new_tokens
        if drafted:  # a round with one token left drafts nothing and teaches nothing
            k = min(k + 1, policy.k_max) if kept == drafted else max(k - 1, policy.k_min)
    fulls = {kept == drafted for drafted, kept, _ in rounds if drafted}
    assert fulls == {"every draft kept": {True}, "every round rejects": {False}, "both": {True, False}}[outcome]
    if outcome == "every draft kept":
        assert [drafted for drafted, _, _ in rounds[:4]] == [3, 4, 5, 6]
    if outcome == "every round rejects":
        assert [drafted for drafted, _, _ in rounds[:3]] == [3, 2, 2]


def test_an_instruction_that_quotes_code_is_recognised():
    edit = "Rename x to total in this function:\n```python\ndef f(values):\n    x = 0\n    for v in values:\n        x += v\n    return x\n```"
    assert quotes_text(edit)
    assert not quotes_text("Write a Python function that checks whether a string is a palindrome.")


def test_auto_k_keeps_its_k_for_a_gain_within_the_hold_margin():
    """A new verify size makes its first calls slow, so a predicted gain of a percent or two is not worth one. On this
    machine, at α = 0.9, K = 5 is predicted 1.3 % faster than K = 4; at α = 0.93, K = 7 is 4 % faster."""


    running_at_four = replace(make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.auto(8)), k=4)
    assert best_k(MEMORY_BOUND, geometric(0.9), k_max=8)[0] == 5
    assert running_at_four.rule().next_k([]) == 4
    assert replace(running_at_four, acceptance_prior=geometric(0.93)).rule().next_k([]) == 7


def test_auto_k_that_falls_to_zero_mid_run_probes_and_drafts_again_when_the_drafts_agree():
    plan = make_plan(MEMORY_BOUND, MODEL, geometric(0.8), KPolicy.auto(8))
    policy = plan.rule()
    rounds = rounds_of(*[(4, 0)] * 30)  # the drafts stop agreeing: no K pays
    assert policy.next_k(rounds) == 0
    ks = []
    for _ in range(200):  # the target alone; every probe's one draft is accepted
        k = policy.next_k(rounds)
        ks.append(k)
        rounds += rounds_of((k, k)) if k else rounds_of((0, 0))
        if k > 1:
            break
    assert ks[:PROBE_EVERY + 2] == [0] * PROBE_EVERY + [1, 0]  # a probe after PROBE_EVERY plain steps
    assert ks[-1] > 1  # the probes' evidence brought K back (30 rejections are a lot to outweigh: ~12 probes)


def test_auto_k_at_zero_does_not_probe_while_the_drafts_keep_failing():
    plan = make_plan(MEMORY_BOUND, MODEL, geometric(0.8), KPolicy.auto(8))
    policy = plan.rule()
    rounds = rounds_of(*[(4, 0)] * 30)
    ks = []
    for _ in range(40):
        k = policy.next_k(rounds)
        ks.append(k)
        rounds += rounds_of((k, 0)) if k else rounds_of((0, 0))
    assert set(ks) == {0, 1} and ks.count(1) == 40 // (PROBE_EVERY + 1)  # probes only, and they change nothing


def test_the_confidence_stop_is_where_one_more_draft_stops_paying_on_this_machine():
    from specdemo.decoding.planner import with_confidence_stop
    from specdemo.decoding.pricing import confidence_stops

    # the draft after the j-th costs a draft step and one more verified token, against a target step's worth of token
    assert confidence_stops(MEMORY_BOUND, 8) == pytest.approx([(0.25 * STEP + 0.02 * STEP) / STEP] * 7)  # 0.27
    assert confidence_stops(COMPUTE_BOUND, 8) == pytest.approx([(0.45 * STEP + 0.35 * STEP) / STEP] * 7)  # 0.8
    assert confidence_stops(MEMORY_BOUND, 1) == ()  # one draft a round: nothing to stop
    plan = make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.auto(8))
    assert with_confidence_stop(plan, None).stops == pytest.approx([0.27] * 7)
    assert "falls below 0.27" in with_confidence_stop(plan, None).reason
    assert with_confidence_stop(plan, 0.0).stops == ()  # asked off
    assert with_confidence_stop(plan, 0.6).stops == (0.6,)  # asked: one threshold everywhere
    fixed = make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.fixed(4))
    assert with_confidence_stop(fixed, None).stops == ()  # a fixed K drafts K


def cliff_after(n: int, before: float = 0.0, after: float = 1.2, n_max: int = 13) -> CostModel:
    """A machine whose verify calls cost one step up to n tokens, then jump (the Zen 5 before its tune: 5 tokens 1.0
    step, 6 tokens 2.2)."""
    target = tuple(STEP * (1 + before * (i - 1) + (after if i > n else 0.0)) for i in range(1, n_max + 1))
    return CostModel(target_s=target, target_prefill_tps=1000.0, target_rollback_s=0.0,
                     draft_s=(STEP * 0.25, STEP * 0.25), draft_prefill_tps=4000.0)


@pytest.mark.parametrize("costs", [cliff_after(5), machine(0.02, n_max=13)], ids=["cliff after the plan", "no cliff"])
def test_a_confident_round_drafts_its_planned_k_whatever_lies_past_it(costs):
    """Each draft position is priced by its own marginal cost, d(1) + t(j + 2) − t(j + 1): a cliff right after the
    planned verify size raises the price of the draft past K alone, so drafts whose confidence pays the cliff-free
    positions are never cut below the planned K."""
    from specdemo.decoding.pricing import confidence_stops

    k = 4  # verify size 5: the last one before the cliff
    stops = confidence_stops(costs, 12)
    draft = SureDraft(0.8)  # confident enough for the cliff-free positions, not for the cliff's
    proposal = ModelDrafter(draft, GenerationSettings(k_policy=KPolicy.fixed(k)), np.random.default_rng(0), stops).propose([1, 2, 3], k)
    assert max(stops[: k - 1]) < 0.8 ** (k - 1)
    assert len(proposal.tokens) == k
    if costs.t(6) > 2 * costs.t(5):
        assert stops[k - 1] > 0.9  # the draft whose row crosses the cliff would have to be nearly certain


class SureDraft(FakeModel):
    """A draft whose top token always has probability `p` (of 3 tokens)."""

    def __init__(self, p: float):
        super().__init__(3, "sure")
        self.row = np.log(np.array([p, (1 - p) / 2, (1 - p) / 2], dtype=np.float32))

    def logits(self, prefix):
        return self.row




def test_a_fixed_k_lane_beside_ours_takes_our_k_or_the_plans_first():
    plan = lambda policy, k: Plan(policy, MODEL, k)  # noqa: E731
    assert plan(KPolicy.fixed(5), 3).first_k == 5 and plan(KPolicy.adaptive(2), 3).first_k == 2
    assert plan(KPolicy.auto(k=4), 6).first_k == 6  # auto K: the plan's first K
    assert plan(KPolicy.auto(k=4), 0).first_k == 4  # the target alone: ours
    assert unpriced(KPolicy.auto(k=4), MODEL).first_k == 4  # no costs to plan by: ours


def test_a_plan_runs_by_the_rule_its_policy_names():
    auto = make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.auto(8))
    assert isinstance(auto.rule(), AutoK)  # the best K at the running acceptance, from this machine's costs
    assert isinstance(unpriced(KPolicy.auto(k=3), MODEL).rule(), FixedK)  # no costs to plan by: the policy's K
    assert unpriced(KPolicy.auto(k=3), MODEL).rule().next_k([]) == 3
    assert isinstance(make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.adaptive(3)).rule(), GrowShrinkK)
    assert make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.fixed(5)).rule().next_k(rounds_of((5, 0))) == 5
    assert auto.rule() is not auto.rule()  # a rule keeps what it saw of its run: each run of the lane gets its own


def test_a_plan_is_recorded_by_its_strategys_name_and_whether_k_was_automatic():
    plan = make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.auto(8))
    recorded = plan.to_dict()
    assert list(recorded) == ["drafter", "k", "acceptance_prior", "planned_speedup", "auto", "reason", "stops",
                              "gate", "provisional", "rescore"]
    assert recorded["drafter"] == "model" and recorded["auto"] is True
    assert recorded["acceptance_prior"] == {"rates": (0.9,)}


def test_a_plan_says_how_its_lane_chose_k():
    assert make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.fixed(3)).describe(3.0) == "K = 3"
    assert make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.adaptive(3)).describe(3.24) == "K adaptive (mean 3.2)"
    auto = make_plan(MEMORY_BOUND, MODEL, geometric(0.9), KPolicy.auto(8))
    assert auto.describe(5.06) == "K chosen by the planner (mean 5.1)"
