"""The acceptance rule, on small synthetic distributions (p = target, q = draft)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from specdemo.decoding.verification import (process_logits, sample, shared_vocabulary, top2_gap, verify_greedy,
                                    verify_sampled)
from specdemo.settings import GenerationSettings

P = np.array([0.05, 0.40, 0.10, 0.25, 0.20])  # the target's distribution
Q = np.array([0.30, 0.10, 0.35, 0.05, 0.20])  # a draft that disagrees with it a lot
DRAWS = 60_000


def _speculative_first_token(p, q, rng, k=1):
    """One speculative round with a context-free draft and target; returns the first emitted token."""
    drafts = [sample(q, rng) for _ in range(k)]
    n, token = verify_sampled(drafts, np.tile(q, (k, 1)), np.tile(p, (k + 1, 1)), rng)
    return drafts[0] if n > 0 else token


def test_sampled_speculation_follows_the_target_distribution():
    rng = np.random.default_rng(1234)
    counts = np.bincount([_speculative_first_token(P, Q, rng) for _ in range(DRAWS)], minlength=P.size)
    assert chisquare(counts, P * DRAWS).pvalue > 0.001


def test_sampled_speculation_does_not_follow_the_draft_distribution():
    # The same test must be able to fail: the draft's own samples are rejected by it.
    rng = np.random.default_rng(1234)
    counts = np.bincount([sample(Q, rng) for _ in range(DRAWS)], minlength=P.size)
    assert chisquare(counts, P * DRAWS).pvalue < 1e-6


def test_every_token_of_a_long_round_follows_the_target_distribution():
    # With K = 3 and position-independent p and q, each emitted position must still be distributed as p.
    rng = np.random.default_rng(99)
    k = 3
    seconds = []
    for _ in range(DRAWS):
        drafts = [sample(Q, rng) for _ in range(k)]
        n, token = verify_sampled(drafts, np.tile(Q, (k, 1)), np.tile(P, (k + 1, 1)), rng)
        emitted = drafts[:n] + [token]
        if len(emitted) >= 2:
            seconds.append(emitted[1])
    counts = np.bincount(seconds, minlength=P.size)
    assert chisquare(counts, P * len(seconds)).pvalue > 0.001


def test_deterministic_proposals_follow_the_target_distribution():
    # Prompt lookup proposes a fixed token (q is one-hot): the output must still be distributed as p.
    rng = np.random.default_rng(7)
    counts = np.bincount([_lookup_first(rng) for _ in range(DRAWS)], minlength=P.size)
    assert chisquare(counts, P * DRAWS).pvalue > 0.001


def _lookup_first(rng):
    """Draft token 3 proposed deterministically; returns the first emitted token."""
    n, token = verify_sampled([3], None, np.tile(P, (2, 1)), rng)
    return 3 if n else token


def test_acceptance_rate_equals_the_overlap_of_p_and_q():
    # Leviathan et al.: a draft token is accepted with probability sum_x min(p(x), q(x)).
    rng = np.random.default_rng(5)
    accepted = sum(verify_sampled([sample(Q, rng)], Q[None, :], np.tile(P, (2, 1)), rng)[0] for _ in range(DRAWS))
    assert accepted / DRAWS == pytest.approx(np.minimum(P, Q).sum(), abs=0.01)


def test_greedy_accepts_the_prefix_that_matches_the_target_argmax():
    logits = np.array([[0, 5, 0], [9, 0, 0], [0, 0, 7], [0, 3, 0]], dtype=np.float32)  # argmax 1, 0, 2, 1
    assert verify_greedy([1, 0, 1], logits) == (2, 2)  # third draft rejected; the target says 2


def test_greedy_gives_a_bonus_when_every_draft_is_accepted():
    logits = np.array([[0, 5, 0], [9, 0, 0], [0, 4, 0]], dtype=np.float32)
    assert verify_greedy([1, 0], logits) == (2, 1)


def test_greedy_with_no_drafts_is_a_plain_target_step():
    assert verify_greedy([], np.array([[0.0, 1.0, 0.5]])) == (0, 1)


def test_temperature_sharpens_and_flattens():
    logits = np.array([[1.0, 2.0, 3.0]])
    cold = process_logits(logits, GenerationSettings(temperature=0.1))
    hot = process_logits(logits, GenerationSettings(temperature=10.0))
    assert cold[0, 2] > 0.99
    assert hot.max() - hot.min() < 0.1


def test_top_k_keeps_only_the_k_best():
    probs = process_logits(np.array([[1.0, 4.0, 3.0, 2.0]]), GenerationSettings(temperature=1.0, top_k=2))
    assert (probs[0] > 0).tolist() == [False, True, True, False]
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    probs = process_logits(logits, GenerationSettings(temperature=1.0, top_p=0.7))
    assert (probs[0] > 0).tolist() == [True, True, False, False]
    assert probs[0, 0] == pytest.approx(0.5 / 0.8)


def test_top2_gap_measures_near_ties_and_leaves_the_row_unchanged():
    row = np.array([1.0, 3.0, 2.99, 0.0])
    assert top2_gap(row) == pytest.approx(0.01)
    assert row.tolist() == [1.0, 3.0, 2.99, 0.0]


def test_a_tiny_temperature_is_greedy_in_the_limit_not_nan():
    logits = np.array([[1.0, 3.0, 2.0, 3.0]])
    p = process_logits(logits, GenerationSettings(temperature=1e-308))
    assert not np.isnan(p).any()
    np.testing.assert_allclose(p, [[0.0, 0.5, 0.0, 0.5]])  # the mass splits between the tied maxima


def reference_distribution(logits: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    """The definition, over the whole vocabulary: softmax(logits / T) with everything below the k-th best
    removed, then the smallest most-likely set holding top_p of the mass, renormalized."""
    scores = (logits - logits.max()) / settings.temperature
    if 0 < settings.top_k < scores.size:
        scores = np.where(scores < np.sort(scores)[-settings.top_k], -np.inf, scores)
    probs = np.exp(scores) / np.exp(scores).sum()
    if settings.top_p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")  # equal probabilities: the lower token id first
    before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(probs.size, dtype=bool)
    keep[order[before < settings.top_p]] = True
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize("spread", [0.5, 3.0, 12.0])  # flat (top-p reaches past the first 1,024 tokens) to peaked
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (50, 1.0), (0, 0.9), (40, 0.8), (3000, 0.95), (0, 0.999)])
def test_processing_only_the_candidates_gives_the_distribution_of_the_definition(spread, top_k, top_p):
    rng = np.random.default_rng(int(spread * 10) + top_k)
    logits = rng.standard_normal((3, 20_000)) * spread
    logits[1, :40] = logits[1].max()  # ties at the top, across the k-th place
    settings = GenerationSettings(temperature=0.7, top_k=top_k, top_p=top_p)
    fast = process_logits(logits, settings)
    for row, expected in zip(fast, (reference_distribution(r, settings) for r in logits)):
        np.testing.assert_allclose(row, expected, rtol=1e-9, atol=1e-15)


def test_a_target_with_a_wider_padded_head_samples_from_the_shared_vocabulary():
    # Qwen2.5 7B's head has 152,064 rows, the 0.5B draft's 151,936: the rows past the draft's are padding.
    settings = GenerationSettings(temperature=1.0)
    padded = np.log(np.concatenate([P, [0.3, 0.3]]))  # two padding logits that would take mass if kept
    logits, q = shared_vocabulary(np.tile(padded, (2, 1)), Q[None])
    assert logits.shape == (2, P.size) and q.shape == (1, P.size)
    p = process_logits(logits, settings)
    rng = np.random.default_rng(7)
    counts = np.bincount([_speculative_first_token(p[0], Q, rng) for _ in range(DRAWS)], minlength=P.size)
    assert chisquare(counts, P / P.sum() * DRAWS).pvalue > 0.001


def test_a_draft_with_a_wider_head_is_cropped_and_renormalized():
    logits, q = shared_vocabulary(np.zeros((2, 5)), np.array([[0.2, 0.2, 0.2, 0.2, 0.1, 0.1]]))
    assert logits.shape == (2, 5) and np.allclose(q, [[0.2, 0.2, 0.2, 0.2, 0.1]] / np.float64(0.9))


def test_equal_widths_and_deterministic_drafts_pass_through():
    logits = np.zeros((2, 5))
    assert shared_vocabulary(logits, None)[0] is logits and shared_vocabulary(logits, Q[None])[1].shape == (1, 5)
