"""Turning logits into distributions, and the rule that accepts or rejects draft tokens.

Notation (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023): p is the *target* model's distribution, q the *draft*'s, both after
the same temperature / top-k / top-p processing. A draft token x drawn from q is kept with
probability min(1, p(x) / q(x)); on rejection the replacement is drawn from
normalize(max(0, p - q)). If every draft token is kept, one bonus token is drawn from p at the
position after them. The tokens produced this way are distributed exactly as p alone would produce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specdemo.settings import GenerationSettings

# Two logits closer than this are a near-tie: batched and single-token kernels may order them
# differently, so greedy speculative output may legitimately differ from autoregressive there.
# Measured on the INT8 target: the same position scored in a 5-token call and in a 1-token call
# differs by up to 0.27 in its logits, and with bf16 inference logits near 20 are rounded to steps
# of 0.125, so exact ties happen.
NEAR_TIE_LOGIT_GAP = 0.5


TOP_P_CANDIDATES = (1024, 16384)  # top-p sorts the most likely tokens first, the whole vocabulary only if it must


def process_logits(logits: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    """Logits (N, V) -> probabilities (N, V) after temperature, top-k and top-p.

    Both models go through this same function, so p and q are comparable. Only the tokens that can keep
    mass are exponentiated and sorted (the top k; for top-p the most likely tokens), which makes a row of
    151,936 logits ~5x cheaper than sorting all of it; the result is the same distribution.
    """
    return np.stack([_distribution(row, settings) for row in logits])


def _distribution(row: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    # Subtract the maximum before dividing: with a tiny temperature (1e-308) the quotient of raw logits
    # overflows to inf and inf - inf is NaN, while (logit - max) / T is 0 at the maximum and -inf elsewhere.
    scores = row.astype(np.float64)
    with np.errstate(over="ignore"):
        scores = (scores - scores.max()) / settings.temperature
    ids = None  # every token can keep mass
    if 0 < settings.top_k < scores.size:
        kth = np.partition(scores, -settings.top_k)[-settings.top_k]
        ids = np.flatnonzero(scores >= kth)  # the top k, and any token tied with the k-th
    weights = np.exp(scores if ids is None else scores[ids])
    weights /= weights.sum()
    if settings.top_p < 1.0:
        ids, weights = _keep_top_p(ids, weights, settings.top_p)
    if ids is None:
        return weights
    probs = np.zeros(scores.size)
    probs[ids] = weights
    return probs


def _keep_top_p(ids: np.ndarray | None, weights: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest most-likely subset of `ids` (None: of every token) holding top_p of the mass, renormalized.

    Sorting only the most likely few (TOP_P_CANDIDATES) is exact whenever they already hold top_p: every
    token outside them then comes after the cut. Ties are broken by token id, lowest first.
    """
    n = weights.size
    for size in (*[c for c in TOP_P_CANDIDATES if c < n], n):
        head = np.argpartition(weights, n - size)[n - size :] if size < n else None
        order = _descending(weights, head)
        sorted_weights = weights[order]
        mass = np.cumsum(sorted_weights)
        if head is None or mass[-1] >= top_p:  # the next token's mass before it is mass[-1]: it is cut
            break
    keep = mass - sorted_weights < top_p  # the most likely token always stays
    kept = sorted_weights[keep]
    order = order[keep]
    return (order if ids is None else ids[order]), kept / kept.sum()


def _descending(weights: np.ndarray, among: np.ndarray | None) -> np.ndarray:
    """Indices into `weights` (of `among`, or of all), most likely first, equal ones by index."""
    if among is None:
        return np.argsort(-weights, kind="stable")
    among = np.sort(among)
    return among[np.argsort(-weights[among], kind="stable")]


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id drawn from a probability vector (V,)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), probs.size - 1))


def shared_vocabulary(target_logits: np.ndarray, q: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Target logits (K+1, Vt) and draft distributions (K, Vd) over the vocabulary both models share.

    A pair's LM heads can be padded to different widths beyond the tokenizer's vocabulary (Qwen2.5 7B: 152,064 rows,
    0.5B: 151,936); the rows past the narrower one are tokens neither can be asked for. So the wider side is cropped:
    the target's logits before they become p, or the draft's q, renormalized (its mass there is none in practice).
    """
    if q is None or q.shape[1] == target_logits.shape[1]:
        return target_logits, q
    width = min(q.shape[1], target_logits.shape[1])
    if q.shape[1] > width:
        q = q[:, :width] / q[:, :width].sum(axis=1, keepdims=True)
    return target_logits[:, :width], q


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
