"""What every drafting strategy answers, and how each describes itself to the rest of specdemo.

Every drafter answers two calls (the shape of transformers' candidate generators):
- propose(seq, k): up to k candidate tokens to follow `seq` (prompt + generated so far), with the
  distributions they were drawn from when drafting was random;
- keep(length): the first `length` tokens of `seq` are confirmed; forget anything after them.

And every strategy carries a Strategy: its name, label and maker, whether it needs the draft model (and so how its
round and prefill are priced), and a part for each concern that reads more: the planner's (Planning), the
counterfactual's (Walking), the peers' (counterpart) and its owners' (memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

if TYPE_CHECKING:
    from specdemo.decoding.costs import CostModel


@dataclass
class Proposal:
    tokens: list[int]  # up to k draft token ids
    q: np.ndarray | None  # (len(tokens), V) draft distributions when sampled; None when deterministic
    calls: list[tuple[int, float]] = field(default_factory=list)  # (tokens fed, seconds) of each draft-model call
    seconds: float = 0.0  # the whole proposal's time (model calls, or the lookup)
    drafter: str = ""  # the strategy that drafted it (a hybrid's rounds name the part that drafted)


class Drafter(Protocol):
    kind: str  # its Strategy's name, as in GenerationSettings.drafter

    def kv_cache_bytes(self) -> dict[str, int]: ...

    def reset(self) -> None: ...

    def propose(self, seq: list[int], k: int) -> Proposal: ...

    def keep(self, length: int) -> None: ...


def stop_threshold(stops: tuple[float, ...], drafted: int) -> float:
    """The confidence a round's drafts must keep for the draft after the first `drafted` to be drafted: stops[drafted -
    1], the last for positions past the end, 0 (never stop) before the first draft or without stops."""
    if not stops or drafted < 1:
        return 0.0
    return stops[min(drafted, len(stops)) - 1]


@dataclass(frozen=True)
class Planning:
    """What the planner reads of a strategy (planner.py, the engine's plan, the K rules, the acceptance profile)."""

    default_alpha: float = 0.5  # the acceptance a plan assumes before any evidence on this machine
    # Whose acceptance history prices its K: "" its own (a hybrid's is the model's: its lookup rounds are free extras)
    prior: str = ""
    when_quoting: str = ""  # under auto K, the strategy that drafts instead where the instruction quotes text to copy
    note: str = ""  # what a plan adds to its reason for people, when it runs this strategy


@dataclass(frozen=True)
class Walking:
    """How the counterfactual (results/counterfactual.py) walks a strategy over a finished answer: by the draft's
    teacher-forced match mask, by replaying its drafter on the answer, or not at all (a mix of the two, as the hybrid)."""

    # The draft model's own strategy (drafters.MASKED): its acceptance is what the draft's match mask shows (warm-up's
    # first evidence, the counterfactual's fixed-K walks and oracle).
    taught_by_mask: bool = False
    # Whether the counterfactual may replay the drafter of a model-free strategy on a finished answer: its proposals
    # depend on the text alone, unless it keeps state across runs (the answer being explained would already be in it).
    replayable: bool = True


@dataclass(frozen=True)
class Strategy:
    """One way of drafting: what every caller needs, and one part for each concern that reads more (its comment says
    whose). A model-free strategy written elsewhere needs only its name, label and maker, and a planning part when
    its drafts are accepted more or less often than half the time:

        STRATEGY = Strategy("echo", "echo of the text", make, planning=Planning(default_alpha=0.3))
    """

    name: str  # as GenerationSettings.drafter, Round.drafter and the run JSON say it
    label: str  # for people: "draft model", "prompt lookup", …
    make: Callable[..., "Drafter"]  # make(draft_model, settings, rng, price, stops) -> Drafter
    # Drafts with the draft model: it needs one loaded (the engine, the CLI, the page and the bench ask), prefills it,
    # and pays draft steps (draft_seconds, prefill_seconds); the peers run a draft model or prompt lookup for it.
    needs_model: bool = False
    order: int = 100  # its place among the page's and the CLI's choices (the built-in ones first)
    planning: Planning = Planning()  # the planner's: its prior acceptance, whose history prices its K, what a plan says
    counterfactual: Walking = Walking()  # the counterfactual's: how it walks this strategy over a finished answer
    # The peers' (OpenVINO GenAI, llama.cpp): what they run in its place: "draft" (a draft model: GenAI's draft_model=),
    # "lookup" (prompt lookup: GenAI's prompt_lookup=True), "": they have nothing like it
    counterpart: str = ""
    # Its owners' (the page's visitors, the bench's lanes; drafters.memories()): what it keeps across runs (earlier
    # answers), made empty by calling it: None, it keeps nothing. Each owner of runs holds one of its own and hands it
    # to make_drafter, so a drafter draws on its owner's earlier runs and on no one else's; a run given none remembers
    # only itself.
    memory: Callable[[], object] | None = None

    def __post_init__(self):
        if not self.planning.prior:  # its own history prices its K (frozen: set once, here)
            object.__setattr__(self, "planning", replace(self.planning, prior=self.name))

    @property
    def choice(self) -> str:
        """How the page names it among the drafting choices: its label, capitalised."""
        return self.label[:1].upper() + self.label[1:]

    def draft_seconds(self, costs: "CostModel", k: int, full: float) -> float:
        """Seconds of drafting K tokens in one round (and trimming the draft's cache after it). `full`: the chance
        (or 0/1) that the previous round kept every draft, so this round's first draft step feeds two tokens."""
        if not self.needs_model or k == 0:
            return 0.0
        return k * costs.d(1) + full * (costs.d(2) - costs.d(1)) + costs.draft_rollback_s

    def prefill_seconds(self, costs: "CostModel", prompt_tokens: int) -> float:
        """Seconds of the draft's own prefill of the prompt (0 without a draft model)."""
        if not self.needs_model or not costs.draft_prefill_tps:
            return 0.0
        return prompt_tokens / costs.draft_prefill_tps
