"""Turning logits into distributions, and the rule that accepts or rejects draft tokens.

Notation (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023): p is the *target* model's distribution, q the *draft*'s, both after
the same temperature / top-k / top-p processing. A draft token x drawn from q is kept with
probability min(1, p(x) / q(x)); on rejection the replacement is drawn from
normalize(max(0, p - q)). If every draft token is kept, one bonus token is drawn from p at the
position after them. The tokens produced this way are distributed exactly as p alone would produce.
"""

from __future__ import annotations

import numpy as np

from specdemo.settings import GenerationSettings

# Two logits closer than this are a near-tie: batched and single-token kernels may order them
# differently, so greedy speculative output may legitimately differ from autoregressive there.
# Measured on the INT8 target: the same position scored in a 5-token call and in a 1-token call
# differs by up to 0.27 in its logits, and with bf16 inference logits near 20 are rounded to steps
# of 0.125, so exact ties happen.
NEAR_TIE_LOGIT_GAP = 0.5


def process_logits(logits: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    """Logits (N, V) -> probabilities (N, V) after temperature, top-k and top-p.

    Both models go through this same function, so p and q are comparable.
    """
    # Subtract the maximum before dividing: with a tiny temperature (1e-308) the quotient of raw logits
    # overflows to inf and inf - inf is NaN, while (logit - max) / T is 0 at the maximum and -inf elsewhere.
    scores = logits.astype(np.float64)
    with np.errstate(over="ignore"):
        scores = (scores - scores.max(axis=-1, keepdims=True)) / settings.temperature
    if 0 < settings.top_k < scores.shape[-1]:
        kth = np.partition(scores, -settings.top_k, axis=-1)[:, -settings.top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    if settings.top_p < 1.0:
        probs = _keep_top_p(probs, settings.top_p)
    return probs


def _keep_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero every token outside the smallest most-likely set holding top_p of the mass; renormalize."""
    order = np.argsort(-probs, axis=-1)
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the most likely token always stays (mass_before == 0)
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id drawn from a probability vector (V,)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), probs.size - 1))


def verify_greedy(draft_tokens: list[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Greedy rule: keep draft tokens while they equal the target's argmax.

    draft_tokens: K ids; target_logits: (K+1, V), row i scores the position of draft token i
    (row K scores the position after the last draft token).
    Returns (n accepted, the target's token at position n: a correction or, when n == K, the bonus).
    """
    choices = target_logits.argmax(axis=-1)
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == choices[n]:
        n += 1
    return n, int(choices[n])


def verify_sampled(
    draft_tokens: list[int], q: np.ndarray | None, p: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """The exact speculative sampling rule.

    draft_tokens: K ids drawn from q; q: (K, V) draft distributions, or None when the drafter is
    deterministic (prompt lookup: q(x) = 1 for the proposed x); p: (K+1, V) target distributions.
    Returns (n accepted, the next token: drawn from the residual at n, or the bonus from p[K]).
    """
    for i, x in enumerate(draft_tokens):
        q_x = 1.0 if q is None else q[i, x]
        if rng.random() * q_x < p[i, x]:  # accept with probability min(1, p(x) / q(x))
            continue
        residual = p[i].copy()
        if q is None:
            residual[x] = 0.0  # max(0, p - onehot(x)): p without x
        else:
            np.maximum(residual - q[i], 0.0, out=residual)
        if residual.sum() <= 0.0:  # only possible through rounding when p == q
            residual = p[i]
        return i, sample(residual, rng)
    return len(draft_tokens), sample(p[len(draft_tokens)], rng)


def top2_gap(row: np.ndarray) -> float:
    """Logit gap between the best and second-best token of one row (V,); small gaps are near-ties."""
    best = int(row.argmax())
    top = row[best]
    row[best] = -np.inf
    second = row.max()
    row[best] = top
    return float(top - second)
