"""Drafting strategies: whatever proposes the next few tokens for the target to check.

Every drafter answers two calls (the shape of transformers' candidate generators):
- propose(seq, k): up to k candidate tokens to follow `seq` (prompt + generated so far), with the
  distributions they were drawn from when drafting was random;
- keep(length): the first `length` tokens of `seq` are confirmed; forget anything after them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from specdemo.runtime import OVModel
from specdemo.settings import GenerationSettings
from specdemo.verification import process_logits, sample


@dataclass
class Proposal:
    tokens: list[int]  # up to k draft token ids
    q: np.ndarray | None  # (len(tokens), V) draft distributions when sampled; None when deterministic
    calls: list[tuple[int, float]] = field(default_factory=list)  # (tokens fed, seconds) of each draft-model call
    seconds: float = 0.0  # the whole proposal's time (model calls, or the lookup)
    drafter: str = ""  # who drafted it ("model" or "prompt-lookup"), where a drafter has several ways


class Drafter(Protocol):
    kind: str  # "model", "prompt-lookup" or "hybrid", as in GenerationSettings.drafter

    def kv_cache_bytes(self) -> dict[str, int]: ...

    def reset(self) -> None: ...

    def propose(self, seq: list[int], k: int) -> Proposal: ...

    def keep(self, length: int) -> None: ...


class ModelDrafter:
    """A small LLM drafts token by token with its own KV cache.

    Invariant between rounds: the draft's cache holds a prefix of `seq`; propose() first feeds the
    part it has not seen (the whole prompt on the first round, then one or two tokens).

    With `p_min` > 0 (the confidence stop), a round ends early once the product of the draft's probabilities for the
    tokens it drafted falls below it: the low-confidence draft is still proposed (its step is paid), the steps after
    it are saved. The stop looks at the draft alone, so the acceptance rule stays exact.
    """

    kind = "model"

    def __init__(self, model: OVModel, settings: GenerationSettings, rng: np.random.Generator, p_min: float = 0.0):
        self.model = model
        self.settings = settings
        self.rng = rng
        self.p_min = p_min

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
        head = self.model.head_ids  # (V',) token ids of the LM head's rows when it was trimmed, else None
        confidence = 1.0  # the product of the draft's probabilities for this round's drafts so far
        for _ in range(k):
            if confidence < self.p_min:
                break  # the confidence stop: the next draft would likely be rejected, and its step costs
            logits = self.model.forward(feed)  # (1, V or V'): scores for the token after `feed`
            calls.append((len(feed), self.model.last_call_s))
            if self.settings.greedy:
                best = int(logits[0].argmax())
                token = best if head is None else int(head[best])
                if self.p_min:
                    confidence *= top_probability(logits[0])
            else:
                q = process_logits(logits, self.settings)[0]
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


class HybridDrafter:
    """Free drafts where the text repeats: where an n-gram of the text so far has a continuation, it is drafted from
    there without a model call; elsewhere the draft model drafts. Each round goes to whichever `price(drafter, k)`
    (this machine's predicted speedup of a round, planner.py) rates higher. Lossless like every drafter: a lookup
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
        if found.tokens and self.price("prompt-lookup", len(found.tokens)) > self.price("model", k):
            return found
        return self.model.propose(seq, k)

    def keep(self, length: int) -> None:
        self.model.keep(length)


def top_probability(logits: np.ndarray) -> float:
    """The softmax probability of the largest of `logits` (V,): the draft's confidence in its greedy token."""
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())


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


def make_drafter(kind: str, draft_model: OVModel | None, settings: GenerationSettings, rng: np.random.Generator,
                 price: Callable[[str, int], float] | None = None, p_min: float = 0.0) -> Drafter:
    """The drafter `kind` names ("model" and "hybrid" need the draft model, "prompt-lookup" needs nothing; "hybrid"
    needs `price` too); `p_min`: the draft model's confidence stop (0: off)."""
    if kind == "prompt-lookup":
        return PromptLookupDrafter(settings.lookup_ngram)
    if draft_model is None:
        raise ValueError("no draft model is loaded; use the prompt-lookup drafter")
    if kind == "hybrid":
        return HybridDrafter(ModelDrafter(draft_model, settings, rng, p_min), PromptLookupDrafter(settings.lookup_ngram),
                             price or (lambda drafter, k: float(k)))
    return ModelDrafter(draft_model, settings, rng, p_min)
