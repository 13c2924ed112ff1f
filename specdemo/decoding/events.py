"""What the decoding loops yield: a TokenEvent per emitted token, a Round per target call, then an End.

The CLI, the app and the benchmark all consume these plain objects through specdemo/results/lane.py (LaneLog,
drain); nothing here knows how they are shown, and nothing here computes a figure: the summary is
derived from the records by specdemo/results/metrics.py. Times are seconds from
`time.perf_counter()`, relative to the start of generation.
"""

from __future__ import annotations

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
class Round:
    """One target call and the drafting that led to it: the loops' record of what happened and what it cost.

    The speculative lane records its prefill (index 0), then one Round per verify call; the autoregressive
    lane one per step (k = 0, nothing drafted). Every figure of a run is derived from these by
    specdemo/results/metrics.py; the loops themselves count nothing.
    """

    index: int  # 0 is the prefill
    context: int  # tokens in the target's KV cache before this call
    k: int  # drafts asked for (0: a plain target step)
    drafter: str  # what drafted: "model", "prompt-lookup", or "" when nothing was drafted
    draft_calls: list[tuple[int, float]]  # (tokens fed, seconds) of each draft-model call; a draft prefill feeds the prompt
    draft_s: float  # seconds spent drafting: the draft calls, or the n-gram lookup
    verify_tokens: int  # tokens fed to the target call: the prompt at the prefill, K + 1 in a round
    verify_s: float  # seconds of the target call
    drafted: int  # draft tokens the target scored
    accepted: int  # of them, kept by the acceptance rule
    emitted: int  # tokens this round added to the text (fewer than accepted + 1 when an EOS or the budget ended it)
    rollback_s: float  # seconds trimming both KV caches after the call
    t: float  # seconds since the lane began, when the round's last token was emitted

    @property
    def kept(self) -> int:
        """Accepted drafts that reached the text: all of them, unless an EOS (or the budget) ended it among them."""
        return min(self.accepted, self.emitted)

    @property
    def cut(self) -> bool:
        """Whether the text ended among the accepted drafts (the drafts after the end were never part of it)."""
        return self.emitted <= self.accepted and self.drafted > 0

    @property
    def rejected(self) -> bool:
        """Whether the round ended in a rejected draft (not counting a text that ended before the rejection)."""
        return self.accepted < self.drafted and not self.cut

    @property
    def gated(self) -> bool:
        """Whether the gate turned this round back (gated rounds): K drafts were asked for and the draft stepped, but
        its first draft's confidence was too low to verify, so the call was a plain target step."""
        return self.k > 0 and not self.drafted and bool(self.draft_calls)

    @property
    def rescored(self) -> bool:
        """Whether this was a re-scoring probe (planner.PROBE_ROUNDS): a plain step paid as a verify call, the target's
        last tokens fed again with the new one so that the run observes what a verify call costs."""
        return self.index > 0 and not self.drafted and self.verify_tokens > 1

    def tested(self) -> tuple[int, int]:
        """(drafts tested, of them accepted) in the sense of the acceptance model: drafts 1 … kept were tested and
        accepted, and a rejected draft right after them was tested too; later drafts were never tested."""
        return self.kept + self.rejected, self.kept

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class End:
    """A loop's last word: how it ended and what the figures need beside the rounds (what happened, nothing it was
    planned with: the prediction prices the lane on the plan it ran under, metrics.summarize)."""

    mode: str  # "autoregressive" or "speculative"
    stop_reason: str  # "eos", "max_new_tokens" or "cancelled"
    wall_s: float  # from the prompt in hand to the last token
    prompt_tokens: int
    kv_cache_bytes: dict[str, int] = field(default_factory=dict)  # per model, at the end
    k_max: int = 0  # the largest K the lane could ask for (the length of its per-position figures)
    drafter: str = ""  # speculative: the drafter the lane ran with ("model", "prompt-lookup", "hybrid")


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
