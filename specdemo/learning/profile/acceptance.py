"""What earlier runs on this machine taught about drafts: the acceptance prior, kept in the machine profile's
`acceptance` section per model pair, then per drafter and decoding mode:

    {pair: {"model/greedy": {"tested": [per position 1, 2, …], "accepted": [...]}, "prompt-lookup/sampling": ...}}

Older evidence fades (each run scales the totals by DECAY first), so the prior follows what the user actually runs.
"""

from __future__ import annotations

from typing import Sequence

from specdemo.decoding.drafters import STRATEGIES
from specdemo.decoding.pricing import Acceptance

DECAY = 0.9
PRIOR_WEIGHT = 5.0  # the built-in default counts as this many tested drafts


def key(drafter: str, greedy: bool) -> str:
    return f"{drafter}/{'greedy' if greedy else 'sampling'}"


class AcceptanceHistory:
    """One model pair's drafts tested and accepted at each draft position, as the profile holds them (read-only)."""

    def __init__(self, counts: dict | None = None):
        self.counts = {name: value for name, value in (counts or {}).items()
                       if isinstance(value, dict) and {"tested", "accepted"} <= value.keys()}

    def has_evidence(self, drafter: str, greedy: bool) -> bool:
        return sum(self.counts.get(key(drafter, greedy), {}).get("tested", [])) > 0

    def prior(self, drafter: str, greedy: bool) -> Acceptance:
        default = Acceptance.geometric(STRATEGIES[drafter].planning.default_alpha if drafter in STRATEGIES else 0.5)
        counts = self.counts.get(key(drafter, greedy))
        if not counts:
            return default
        return Acceptance.from_counts(counts["tested"], counts["accepted"], default, weight=PRIOR_WEIGHT)


def folded(counts: dict, drafter: str, greedy: bool, tested: Sequence[float], accepted: Sequence[float]) -> dict:
    """`counts` (one pair's) with one run's drafts tested and accepted at each position (1, 2, …) folded in."""
    if not sum(tested):
        return counts
    old = counts.get(key(drafter, greedy), {"tested": [], "accepted": []})
    size = max(len(old["tested"]), len(tested))
    pad = lambda xs: list(xs) + [0.0] * (size - len(xs))  # noqa: E731
    return {**counts, key(drafter, greedy): {
        "tested": [o * DECAY + n for o, n in zip(pad(old["tested"]), pad(tested))],
        "accepted": [o * DECAY + n for o, n in zip(pad(old["accepted"]), pad(accepted))],
    }}
