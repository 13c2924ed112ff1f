"""Prompt lookup: no draft model; the continuation of the text's last n-gram where it occurred before."""

from __future__ import annotations

import time

from specdemo.decoding.drafters.base import Planning, Proposal, Strategy


class PromptLookupDrafter:
    """No draft model: find the latest earlier occurrence of the text's last n-gram and propose what followed.

    Shines when the output repeats the input (summaries, edits, code refactors). Proposals are
    deterministic, so under sampling q is one-hot on the proposed token.
    """

    kind = "prompt-lookup"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def kv_cache_bytes(self) -> dict[str, int]:
        return {}

    def reset(self) -> None:
        pass  # no state

    def propose(self, seq: list[int], k: int) -> Proposal:
        start = time.perf_counter()
        tokens = lookup_continuation(seq, k, self.max_ngram)
        return Proposal(tokens, None, [], time.perf_counter() - start, self.kind)

    def keep(self, length: int) -> None:
        pass  # no state to roll back


def lookup_continuation(seq: list[int], k: int, max_ngram: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of seq's last n-gram (longest n first)."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-n:]
        # Scan right to left so the most recent occurrence wins; it starts at most at len(seq) - n - 1.
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == tail:
                follow = seq[start + n : start + n + k]
                if follow:
                    return follow
    return []




def make(draft_model, settings, rng, price=None, stops: tuple[float, ...] = ()) -> PromptLookupDrafter:
    return PromptLookupDrafter(settings.lookup_ngram)


STRATEGY = Strategy("prompt-lookup", "prompt lookup", make, order=1, planning=Planning(default_alpha=0.5),
                    counterpart="lookup")
