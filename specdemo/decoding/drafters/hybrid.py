"""The hybrid: prompt lookup where the text repeats, the draft model elsewhere, round by round by predicted speedup."""

from __future__ import annotations

from typing import Callable

from specdemo.decoding.drafters import lookup, model
from specdemo.decoding.drafters.base import Planning, Proposal, Strategy
from specdemo.decoding.drafters.lookup import PromptLookupDrafter
from specdemo.decoding.drafters.model import ModelDrafter


class HybridDrafter:
    """Free drafts where the text repeats: where an n-gram of the text so far has a continuation, it is drafted from
    there without a model call; elsewhere the draft model drafts. Each round goes to whichever `price(drafter, k)`
    (this machine's predicted speedup of a round, pricing.py) rates higher. Lossless like every drafter: a lookup
    proposal is deterministic (q one-hot), a model proposal carries its q.

    The draft model's cache may fall behind by the tokens of lookup rounds; its next proposal feeds them first.
    """

    kind = "hybrid"

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter, price: Callable[[str, int], float]):
        self.model, self.lookup, self.price = model, lookup, price

    def kv_cache_bytes(self) -> dict[str, int]:
        return self.model.kv_cache_bytes()

    def reset(self) -> None:
        self.model.reset()

    def propose(self, seq: list[int], k: int) -> Proposal:
        found = self.lookup.propose(seq, k)
        if found.tokens and self.price(lookup.STRATEGY.name, len(found.tokens)) > self.price(model.STRATEGY.name, k):
            return found
        return self.model.propose(seq, k)

    def keep(self, length: int) -> None:
        self.model.keep(length)


def make(draft_model, settings, rng, price=None, stops: tuple[float, ...] = ()) -> HybridDrafter:
    """`price(drafter, k)`: this machine's predicted speedup of a round (without one: the longer proposal wins)."""
    return HybridDrafter(model.make(draft_model, settings, rng, stops=stops), lookup.make(None, settings, rng),
                         price or (lambda drafter, k: float(k)))


# A hybrid round is priced as the draft model's: its lookup rounds are the free exceptions. Its rounds name the part
# that drafted them, so what they teach goes to those strategies' histories.
STRATEGY = Strategy("hybrid", "draft model and prompt lookup", make, needs_model=True, order=2,
                    planning=Planning(default_alpha=0.8, prior=model.STRATEGY.name,
                                      note=" Where the text so far repeats, drafts come from it by lookup instead, "
                                           "without a model call."),
                    counterpart="draft")
