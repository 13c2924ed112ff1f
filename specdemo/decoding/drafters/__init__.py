"""Drafting strategies: whatever proposes the next few tokens for the target to check.

Each strategy is one module here holding its drafter (propose / keep, specdemo/decoding/drafters/base.py) and its STRATEGY
(name, label, maker, whether it needs the draft model, and what the planner, the counterfactual, the peers and its
owners read of it: base.Strategy); this package finds them, so adding a drafter is adding its module (and its test):

    model.py    a small LLM drafts token by token with its own KV cache
    lookup.py   prompt lookup: what followed the text's last n-gram where it occurred before, no model
    hybrid.py   lookup where the text repeats, the model elsewhere
    suffix.py   what followed the text's longest suffix in this run or in its owner's earlier answers, no model
"""

from __future__ import annotations

import importlib
import pkgutil

from specdemo import settings
from specdemo.decoding.drafters.base import Drafter, Proposal, Strategy

__all__ = ["Drafter", "Proposal", "Strategy", "STRATEGIES", "DEFAULT", "MASKED", "MASKED_STRATEGY", "strategy", "when_quoting",
           "checked", "make_drafter", "memories", "choices", "with_counterpart"]


def _discover() -> dict[str, Strategy]:
    """Every module of this package that defines a STRATEGY, by the strategy's name, in the order of their choices."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        described = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STRATEGY", None)
        if isinstance(described, Strategy):
            found.append(described)
    return {s.name: s for s in sorted(found, key=lambda s: (s.order, s.name))}


STRATEGIES: dict[str, Strategy] = _discover()
DEFAULT = next(iter(STRATEGIES))  # the first choice: the draft model
assert DEFAULT == settings.DRAFTER, f"settings.DRAFTER names {settings.DRAFTER!r}, the first strategy is {DEFAULT!r}"
# The draft model's own strategy (the one its match mask teaches; what a price is of when it names none), and its name
MASKED_STRATEGY = next(s for s in STRATEGIES.values() if s.counterfactual.taught_by_mask)
MASKED = MASKED_STRATEGY.name


def strategy(name: str) -> Strategy:
    """The strategy `name` names, or ValueError with the names there are."""
    if name not in STRATEGIES:
        raise ValueError(f"drafter must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name]


def when_quoting(asked: Strategy) -> Strategy | None:
    """The strategy that drafts instead of `asked` where the instruction quotes text to copy (Planning.when_quoting),
    or None."""
    return STRATEGIES[asked.planning.when_quoting] if asked.planning.when_quoting else None


def checked(generation: settings.GenerationSettings) -> settings.GenerationSettings:
    """`generation` if its drafter is a strategy here, else ValueError naming the ones there are: the check the edges
    (the CLI, the page, the bench) make on settings a user gave, since settings know nothing of this registry."""
    strategy(generation.drafter)
    return generation


def make_drafter(described: Strategy, draft_model, settings, rng, price=None, stops: tuple[float, ...] = (),
                 memories: dict[str, object] | None = None, gate: float = 0.0) -> Drafter:
    """The drafter of strategy `described` (one that needs a model refuses to be made without one); `price(drafter, k)`
    for a strategy choosing between parts each round; `stops`: the draft model's confidence stop per draft position
    ((): off); `memories`: what its owner's earlier runs left (memories()), for a strategy that keeps something across
    runs (without it, such a drafter starts empty: it draws on its own run alone); `gate`: gated rounds, the draft
    model's own strategy only (planner.with_gate plans them; 0: off, and not handed to other makers)."""
    if gate:
        return described.make(draft_model, settings, rng, price, stops, gate=gate)
    if described.memory is None:
        return described.make(draft_model, settings, rng, price, stops)
    memory = (memories or {}).get(described.name)
    return described.make(draft_model, settings, rng, price, stops, memory=memory if memory is not None else described.memory())


def memories() -> dict[str, object]:
    """A new owner's empty memory of every strategy that keeps one (Strategy.memory), by name: hold it for as long as
    that owner's runs may draw on each other (a visitor's session on the page, one bench lane), and only for them."""
    return {s.name: s.memory() for s in STRATEGIES.values() if s.memory is not None}


def choices() -> list[tuple[str, str]]:
    """(what people see, name) of every strategy, in order: the page's and the CLI's drafting choices."""
    return [(s.choice, s.name) for s in STRATEGIES.values()]


def with_counterpart(kind: str) -> Strategy:
    """The strategy whose own drafting a peer's `kind` ("draft", "lookup": Strategy.counterpart) is: what a peer's
    lane records as its drafter."""
    return next(s for s in STRATEGIES.values() if s.counterpart == kind)
