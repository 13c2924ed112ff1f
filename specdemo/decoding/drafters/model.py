"""The draft model: a small LLM drafts token by token with its own KV cache."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from specdemo.decoding.drafters.base import Planning, Proposal, Strategy, Walking, stop_threshold
from specdemo.decoding.verification import process_logits, sample

if TYPE_CHECKING:
    from specdemo.models.runtime import OVModel
    from specdemo.settings import GenerationSettings


class ModelDrafter:
    """A small LLM drafts token by token with its own KV cache.

    Invariant between rounds: the draft's cache holds a prefix of `seq`; propose() first feeds the
    part it has not seen (the whole prompt on the first round, then one or two tokens).

    With `stops` (the confidence stop, per draft position: pricing.confidence_stops), a round ends early once the
    product of the draft's probabilities for the j tokens it drafted falls below stops[j - 1]: the low-confidence draft
    is still proposed (its step is paid), the steps after it are saved. The stop looks at the draft alone, so the
    acceptance rule stays exact.

    With a `gate` (gated rounds: pricing.gate_threshold), a round whose first draft step leaves the draft's top
    probability below it proposes nothing: the loop's round is then a plain target step, and the draft, whose cache
    now holds all of `seq`, is fed the target's token next round. The gate reads the top probability of the draft's
    distribution, never the probability of the token it samples: a sampled draft thrown back for its own low q(x)
    would leave the acceptance rule verifying drafts drawn from q cut to its likely tokens, not from q, and the text
    would lean towards them (q = (0.9, 0.1), p = (0.5, 0.5), a gate of 0.5: 0.55 / 0.45). The top probability is
    known before the draw, so a gated round's draft is still drawn from q, and a plain step samples p: both exact.
    """

    kind = "model"

    def __init__(self, model: "OVModel", settings: "GenerationSettings", rng: np.random.Generator,
                 stops: tuple[float, ...] = (), gate: float = 0.0):
        self.model = model
        self.settings = settings
        self.rng = rng
        self.stops = stops
        self.gate = gate  # the first draft's top probability below which a round proposes nothing; 0: every round drafts

    def kv_cache_bytes(self) -> dict[str, int]:
        return {"draft": self.model.kv_cache_bytes()}

    def reset(self) -> None:
        self.model.reset()

    def propose(self, seq: list[int], k: int) -> Proposal:
        start = time.perf_counter()
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        calls: list[tuple[int, float]] = []
        feed = seq[self.model.length :]
        confidence = 1.0  # the product of the draft's probabilities for this round's drafts so far
        for drafted in range(k):
            if confidence < stop_threshold(self.stops, drafted):
                break  # the confidence stop: the next draft would likely be rejected, and its step costs
            logits = self.model.forward(feed)  # (1, V or V'): scores for the token after `feed`
            if self.settings.greedy:
                if self.stops or self.gate:  # a trimmed head's other rows too, where wanted
                    ids, top = self.model.greedy_ids(logits, confidence=True)
                    confidence *= float(top[0])
                else:
                    ids = self.model.greedy_ids(logits)
                token = int(ids[0])
                calls.append((len(feed), self.model.last_call_s))
                if not drafted and confidence < self.gate:
                    break  # gated out: a plain target step this round
            else:
                scores, head = self.model.sampling_logits(logits)  # a trimmed head's other rows too, where wanted
                calls.append((len(feed), self.model.last_call_s))
                q = process_logits(scores, self.settings)[0]
                if not drafted and float(q.max()) < self.gate:
                    break  # gated out, by the distribution before the draw (see the class's docstring)
                if head is not None:  # a proper distribution over the whole vocabulary, zero off the head
                    full = np.zeros(self.model.vocab_size, dtype=q.dtype)
                    full[head] = q
                    q = full
                token = sample(q, self.rng)
                rows.append(q)
                confidence *= float(q[token])
            tokens.append(token)
            feed = [token]
        # The last token is not fed: if it is accepted, the next round feeds it together with the target's.
        return Proposal(tokens, np.stack(rows) if rows else None, calls, time.perf_counter() - start, self.kind)

    def keep(self, length: int) -> None:
        self.model.rollback(min(length, self.model.length))


def make(draft_model, settings, rng, price=None, stops: tuple[float, ...] = (), gate: float = 0.0) -> ModelDrafter:
    if draft_model is None:
        raise ValueError("no draft model is loaded; use the prompt-lookup drafter")
    return ModelDrafter(draft_model, settings, rng, stops, gate)


STRATEGY = Strategy("model", "draft model", make, needs_model=True, order=0,
                    planning=Planning(default_alpha=0.8, when_quoting="hybrid"),
                    counterfactual=Walking(taught_by_mask=True), counterpart="draft")
