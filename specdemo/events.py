"""What the decoding loops yield: one event per emitted token, then one summary.

The CLI, the app and the benchmark all consume these plain objects; nothing here knows how they
are shown. Times are seconds from `time.perf_counter()`, relative to the start of generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

# Where a token came from.
TARGET = "target"  # the target's own choice: every autoregressive token, and speculation's first
ACCEPTED = "accepted"  # proposed by the drafter and accepted by the target
CORRECTED = "corrected"  # the target's replacement for the first rejected draft token
BONUS = "bonus"  # the target's extra token after a round in which every draft token was accepted
SOURCES = (TARGET, ACCEPTED, CORRECTED, BONUS)


@dataclass
class TokenEvent:
    """One emitted token."""

    id: int  # token id
    text: str  # the text this token adds (may be "" while a multibyte character is incomplete)
    source: str  # one of SOURCES
    step: int  # target call that produced or confirmed it (0 is the prefill)
    t: float  # seconds since generation started
    rejected: list[int] = field(default_factory=list)  # draft proposals rejected at this position
    rejected_text: str = ""  # those proposals decoded, for display
    p_target: float | None = None  # p(token) under the target's processed distribution (sampling)
    p_draft: float | None = None  # q(token) under the draft's distribution, if it was a draft token
    margin: float | None = None  # greedy: the target's top-2 logit gap where it chose this token

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Summary:
    """Figures for one finished generation."""

    mode: str  # "autoregressive" or "speculative"
    tokens: int = 0  # new tokens emitted
    wall_s: float = 0.0  # from the start (prompt in hand) to the last token
    ttft_s: float = 0.0  # time to the first token
    tokens_per_s: float = 0.0
    target_calls: int = 0  # inference calls on the target, prefill included
    draft_calls: int = 0  # inference calls on the draft model, prefill included
    proposed: int = 0  # draft tokens proposed to the target
    accepted: int = 0  # draft tokens the target accepted
    rounds: int = 0  # speculative rounds that drafted (plain target steps at K = 0 not counted)
    rejections: int = 0  # rounds that ended in a rejected draft
    alpha: float = 0.0  # α̂ = accepted / (accepted + rejections): the per-token acceptance estimate
    draft_acceptance_rate: float = 0.0  # accepted / proposed: drafts after a rejection count as failures too
    tokens_per_call: float = 0.0  # tokens emitted per target call after the prefill
    accepted_histogram: list[int] = field(default_factory=list)  # rounds by how many drafts were kept
    target_s: float = 0.0  # time inside target calls
    draft_s: float = 0.0  # time inside draft calls (or in the lookup for prompt lookup)
    rollback_s: float = 0.0  # time spent trimming KV caches
    target_step_s: float = 0.0  # mean time of one target call after the prefill (a verify call when speculative)
    draft_step_s: float = 0.0  # mean time of one draft call after the prefill
    cost_ratio: float = 0.0  # c = draft step / target verify call (Leviathan's c; he assumes a verify call costs one step)
    expected_speedup: float = 0.0  # Leviathan's eq. 1 from α̂, mean K and c (assumes a verify call costs one step)
    predicted_speedup: float = 0.0  # from this machine's measured call costs, α̂, mean K, N and the prompt (planner.py)
    mean_k: float = 0.0  # mean draft length per round (differs from K when adaptive)
    near_ties: int = 0  # greedy tokens whose margin was below NEAR_TIE_LOGIT_GAP (the choice could flip)
    stop_reason: str = ""  # "eos", "max_new_tokens" or "cancelled"
    drafter: str = ""  # speculative: "model" or "prompt-lookup", as the run used it
    plan: str = ""  # speculative: the planner's sentence on the drafter and K it chose, and why
    kv_cache_bytes: dict[str, int] = field(default_factory=dict)  # per model, at the end

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Result:
    """One lane's events, drained: the tokens in order and the closing summary."""

    tokens: list[TokenEvent]
    summary: Summary

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


def drain(events: Iterable[TokenEvent | Summary], on_token: Callable[[TokenEvent], None] | None = None) -> Result:
    """The one way to consume a decoding loop: collect its tokens (calling `on_token` for each as it comes)
    until its summary. A loop that ends without a summary is a bug in the loop, not a user error."""
    tokens = []
    try:
        for event in events:
            if isinstance(event, Summary):
                return Result(tokens, event)
            tokens.append(event)
            if on_token is not None:
                on_token(event)
    finally:
        # An engine yields its summary while still holding its lock; closing the generator now releases it,
        # whoever keeps a reference to the generator (a caller's frame, a traceback) and for however long.
        close = getattr(events, "close", None)
        if close is not None:
            close()
    raise RuntimeError("the decoding loop ended without a summary")


def measured_speedup(autoregressive: Summary, speculative: Summary) -> float:
    """The one definition of speedup used by the CLI, the page and the benchmark: speculative tokens/s over
    autoregressive tokens/s, each lane timed from its prompt in hand to its last token (warm-up excluded).

    It equals the wall-time ratio when both lanes emit the same number of tokens (greedy), and stays
    fair when sampling makes their lengths differ.
    """
    return speculative.tokens_per_s / autoregressive.tokens_per_s if autoregressive.tokens_per_s else 0.0


def expected_speedup(alpha: float, k: float, c: float) -> float:
    """Leviathan et al. eq. 1: expected walltime improvement for acceptance rate alpha, K drafts, cost c."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return (k + 1) / (c * k + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (c * k + 1))


class Detokenizer:
    """Decodes a growing token list incrementally without splitting a multibyte character.

    Decoding only a short window (from `prefix` on) keeps each step O(1); the window's first
    tokens are decoded again only to get spacing right at its start.
    """

    def __init__(self, tokenizer, prompt_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids or [])[-4:]  # a little context for spacing
        self.prefix = 0  # start of the window
        self.read = len(self.ids)  # tokens before this are already emitted

    def add(self, token_id: int) -> str:
        """Append one token; return the text that is now complete ("" if a character is pending)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
