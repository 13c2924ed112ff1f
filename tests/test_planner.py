"""The planner: predictions from measured costs, the α̂ estimator, the choice of K and of the drafter."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdemo import decoding
from specdemo.costs import CostModel
from specdemo.drafting import ModelDrafter
from specdemo.events import ACCEPTED, drain, expected_speedup
from specdemo.planner import (
    AlphaHistory,
    AutoK,
    GrowShrinkK,
    best_k,
    estimate_alpha,
    expected_tokens,
    make_plan,
    predicted_lane_speedup,
    predicted_speedup,
    quotes_text,
)
from specdemo.settings import GenerationSettings
from tests.fake_models import FakeModel, FakeTokenizer

STEP = 0.1  # seconds of one target step in the synthetic machines below


def machine(verify_steps_per_token: float, draft_steps: float = 0.25, n_max: int = 9) -> CostModel:
    """A synthetic machine: t(n) = t(1) * (1 + slope * (n - 1)); a draft step costs `draft_steps` target steps."""
    target = tuple(STEP * (1 + verify_steps_per_token * (n - 1)) for n in range(1, n_max + 1))
    return CostModel(target_s=target, target_prefill_tps=1000.0, target_rollback_s=0.0,
                     draft_s=(STEP * draft_steps, STEP * draft_steps), draft_prefill_tps=4000.0)


MEMORY_BOUND = machine(0.02)  # an AMX Xeon: scoring 9 tokens costs ~1.2 steps
COMPUTE_BOUND = machine(0.35, draft_steps=0.45)  # an AVX2-only CPU: 5 tokens cost ~2.4 steps, a costly draft


def test_with_a_free_verify_the_prediction_is_leviathans_equation_one():
    flat = CostModel(target_s=(STEP,) * 9, target_prefill_tps=1e9, target_rollback_s=0.0,
                     draft_s=(STEP * 0.2, STEP * 0.2), draft_prefill_tps=1e9)
    assert predicted_speedup(flat, 0.8, 4) == pytest.approx(expected_speedup(0.8, 4, 0.2))


def test_expected_tokens_per_round_counts_the_targets_own_token():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_a_flat_cost_curve_picks_a_long_draft():
    k, speedup = best_k(MEMORY_BOUND, 0.9, k_max=8)
    assert k >= 5 and speedup > 1.9


def test_a_compute_bound_curve_picks_a_short_draft_or_none():
    k, speedup = best_k(COMPUTE_BOUND, 0.9, k_max=8)
    assert k <= 2
    assert best_k(COMPUTE_BOUND, 0.6, k_max=8) == (0, 1.0)  # nothing pays: the target alone


def test_a_better_draft_never_gets_a_shorter_k():
    ks = [best_k(MEMORY_BOUND, alpha, k_max=8)[0] for alpha in (0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks)


def test_a_plan_that_finds_no_gain_says_so_and_runs_the_target_alone():
    plan = make_plan(COMPUTE_BOUND, "model", 0.6, k_max=8, auto=True, k=4)
    assert plan.k == 0 and plan.predicted_speedup == 1.0
    assert "No K pays" in plan.reason
    policy = AutoK(COMPUTE_BOUND, plan, k_max=8)
    assert policy.next_k(accepted=50, rejections=0, last_full=True) == 0


def test_auto_k_follows_the_running_alpha():
    plan = make_plan(MEMORY_BOUND, "model", 0.8, k_max=8, auto=True, k=4)
    policy = AutoK(MEMORY_BOUND, plan, k_max=8)
    high = policy.next_k(accepted=400, rejections=10, last_full=True)
    low = policy.next_k(accepted=40, rejections=60, last_full=False)
    assert 1 <= low < high <= 8


def test_the_whole_lane_prediction_pays_for_the_draft_prefill():
    after_prompt = predicted_speedup(MEMORY_BOUND, 0.9, 4)
    short = predicted_lane_speedup(MEMORY_BOUND, 0.9, 4, tokens=5, prompt_tokens=2000)
    long = predicted_lane_speedup(MEMORY_BOUND, 0.9, 4, tokens=500, prompt_tokens=2000)
    assert short < long < after_prompt


def test_alpha_hat_recovers_a_known_alpha_from_simulated_rounds():
    rng = np.random.default_rng(0)
    alpha, k = 0.83, 4
    accepted = rejections = 0
    for _ in range(20_000):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        accepted += n
        rejections += n < k
    assert estimate_alpha(accepted, rejections, prior=0.0, weight=0.0) == pytest.approx(alpha, abs=0.01)
    # accepted / proposed, by contrast, counts the untested drafts after a rejection as failures
    assert accepted / (20_000 * k) < alpha - 0.05


def test_the_prior_gives_way_to_evidence():
    assert estimate_alpha(0, 0, prior=0.7) == 0.7
    assert estimate_alpha(900, 100, prior=0.2) == pytest.approx(0.9, abs=0.02)


def test_grow_shrink_k_grows_after_a_full_round_and_shrinks_after_a_rejection_within_its_bounds():
    policy = GrowShrinkK(k=3, k_min=2, k_max=5)
    ks = [policy.next_k(0, 0, full) for full in (None, True, True, True, True, False, False, False, False)]
    assert ks == [3, 4, 5, 5, 5, 4, 3, 2, 2]


@given(k_min=st.integers(1, 8), span=st.integers(0, 8), start=st.integers(0, 8),
       rounds=st.lists(st.one_of(st.none(), st.booleans()), max_size=40))
def test_grow_shrink_k_moves_one_step_a_round_and_never_leaves_its_bounds(k_min, span, start, rounds):
    k_max = k_min + span
    k = k_min + min(start, span)
    policy = GrowShrinkK(k, k_min, k_max)
    for full in rounds:  # None: the first round, nothing to learn from yet
        expected = k if full is None else min(k + 1, k_max) if full else max(k - 1, k_min)
        k = policy.next_k(0, 0, full)
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
    run = drain(decoding.speculative(FakeModel(3, "target"), drafter, FakeTokenizer(), prompt, settings, set()))
    kept = [sum(t.source == ACCEPTED and t.step == step for t in run.tokens) for step in range(1, len(drafted) + 1)]
    return [(k, n, left) for (k, left), n in zip(drafted, kept)]


@pytest.mark.parametrize("draft, outcome", [
    (FakeModel(3, "target"), "every draft kept"),  # the target's own function: K grows to k_max and stays
    (FakeModel(3, "target", scale=-1.0), "every round rejects"),  # its argmin: K shrinks to k_min and stays
    (FakeModel(3, "draft"), "both"),
])
def test_the_loop_drafts_as_many_tokens_as_grow_shrink_k_asks(draft, outcome):
    settings = GenerationSettings(max_new_tokens=80, k=3, adaptive=True, k_min=2, k_max=6)
    rounds = _adaptive_rounds(draft, settings)
    k = settings.k
    for drafted, kept, left in rounds:
        assert drafted == min(k, left - 1)  # never past max_new_tokens
        if drafted:  # a round with one token left drafts nothing and teaches nothing
            k = min(k + 1, settings.k_max) if kept == drafted else max(k - 1, settings.k_min)
    fulls = {kept == drafted for drafted, kept, _ in rounds if drafted}
    assert fulls == {"every draft kept": {True}, "every round rejects": {False}, "both": {True, False}}[outcome]
    if outcome == "every draft kept":
        assert [drafted for drafted, _, _ in rounds[:4]] == [3, 4, 5, 6]
    if outcome == "every round rejects":
        assert [drafted for drafted, _, _ in rounds[:3]] == [3, 2, 2]


def test_alpha_history_remembers_runs_and_fades(tmp_path):
    path = tmp_path / "alpha.json"
    history = AlphaHistory(path)
    assert history.prior("model", greedy=True) == pytest.approx(0.8)  # the default before any run
    history.record("model", True, accepted=95, rejections=5)
    again = AlphaHistory(path)
    assert again.prior("model", greedy=True) > 0.9
    assert again.prior("model", greedy=False) == pytest.approx(0.8)  # sampling is kept apart


def test_a_damaged_history_only_loses_the_prior(tmp_path):
    path = tmp_path / "alpha.json"
    path.write_text("{not json")
    assert AlphaHistory(path).prior("prompt-lookup", greedy=True) == pytest.approx(0.5)


def test_an_instruction_that_quotes_code_is_recognised():
    edit = "Rename x to total in this function:\n```python\ndef f(values):\n    x = 0\n    for v in values:\n        x += v\n    return x\n```"
    assert quotes_text(edit)
    assert not quotes_text("Write a Python function that checks whether a string is a palindrome.")


def test_the_cost_model_survives_a_round_trip_through_json():
    assert CostModel.from_dict(MEMORY_BOUND.to_dict()) == MEMORY_BOUND
    assert MEMORY_BOUND.verify_steps(1) == 1.0 and MEMORY_BOUND.t(12) > MEMORY_BOUND.t(9)


def test_a_dip_in_a_measured_cost_curve_is_noise_and_is_levelled():
    from specdemo.costs import monotone

    assert monotone([1.0, 1.2, 1.1, 1.5]) == (1.0, 1.2, 1.2, 1.5)
