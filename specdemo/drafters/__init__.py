"""Drafting strategies: whatever proposes the next few tokens for the target to check.

Each strategy is one module here holding its drafter (propose / keep, specdemo/drafters/base.py) and its STRATEGY
(name, pricing, prior, maker); this package finds them, so adding a drafter is adding its module (and its test):

    model.py    a small LLM drafts token by token with its own KV cache
    lookup.py   prompt lookup: what followed the text's last n-gram where it occurred before, no model
    hybrid.py   lookup where the text repeats, the model elsewhere
"""

from __future__ import annotations

import importlib
import pkgutil

from specdemo.drafters.base import Drafter, Proposal, Strategy

__all__ = ["Drafter", "Proposal", "Strategy", "STRATEGIES", "strategy", "make_drafter"]


def _discover() -> dict[str, Strategy]:
    """Every module of this package that defines a STRATEGY, by the strategy's name (the draft model first)."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "model", m.name)):
        described = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STRATEGY", None)
        if isinstance(described, Strategy):
            found[described.name] = described
    return found


STRATEGIES: dict[str, Strategy] = _discover()


def strategy(name: str) -> Strategy:
    """The strategy `name` names, or ValueError with the names there are."""
    if name not in STRATEGIES:
        raise ValueError(f"drafter must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name]


def make_drafter(kind: str, draft_model, settings, rng, price=None, stops: tuple[float, ...] = ()) -> Drafter:
    """The drafter of strategy `kind` (one that needs a model refuses to be made without one); `price(drafter, k)`
    for a strategy choosing between parts each round; `stops`: the draft model's confidence stop per draft position
    ((): off)."""
    return strategy(kind).make(draft_model, settings, rng, price, stops)
