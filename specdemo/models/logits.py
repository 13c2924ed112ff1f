"""What a model's logits say beyond their argmax, shared by the runtime (a trimmed head's other rows, wanted where its
choice is unsure), the draft's confidence stop and gate, and the counterfactual's walk of them. Imports numpy only."""

from __future__ import annotations

import numpy as np


def top_probability(logits: np.ndarray) -> float | np.ndarray:
    """The softmax probability of the largest of `logits` along the last axis ((V,) -> a float, (n, V) -> (n,)): a
    model's confidence in its greedy token."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return 1.0 / np.exp(shifted, dtype=np.float64).sum(axis=-1)
