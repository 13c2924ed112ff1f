"""Suffix decoding: no draft model; what followed the text's longest suffix where it occurred before, in this run's
prompt and text and in its owner's earlier answers (people re-ask similar things of a code model, and its answers
repeat themselves: the same imports, signatures, idioms). The owner is whoever holds the AnswerStore (the strategy's
memory, drafters.memories()): on the page each visitor's session has its own, so a draft never shows one visitor what
the model answered another; a bench lane has its own; a run given none draws on itself alone.

Learnt from SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975) as vLLM's Arctic Inference and llama.cpp's n-gram
cache read it: find the deepest match of the text's suffix, then follow the most frequent continuation for as long as
the earlier occurrences agree. A suffix tree gives that walk; here each text keeps a dict from its every MIN_MATCH
tokens to the places after them, each match is extended backwards to its length, and the walk is the same.

Measured on AMD EPYC (family 25 model 17, 2 cores shared with other work, load 5-8), CPython 3.11, code tokens of the
default pair's tokenizer, K = 8, a 2,000-token run: a proposal costs a median 20 µs (90th percentile 45 µs) with 7,000
tokens stored, 40 µs (110 µs) with 52,000, and 60-90 µs (300-470 µs) with 256 answers held; storing costs 1-2 µs per
confirmed token, and a store full at 200,000 tokens holds 26 MB.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Sequence

from specdemo.decoding.drafters import lookup
from specdemo.decoding.drafters.base import Planning, Proposal, Strategy, Walking

# A match's length counts the text's last tokens that agree with an earlier place. Two is the shortest drafted from: a
# single token such as "," or an indent is one in 25-35 tokens of code, so with the store full a round counting its
# matches took 1.5 ms at the 90th percentile (0.3 ms from two), while the drafts gained were within the noise; the
# walk's vote and confidence stop already drop the pairs that do not pin a place.
# Sixteen is the longest told apart: a match of sixteen tokens (a line or two of code) singles out its place, so
# comparing further only costs time.
MIN_MATCH = 2
MAX_MATCH = 16
# The walk stops once the share of the matches behind each draft, multiplied over the drafts so far, falls below this:
# the matches' estimate of the chance the whole draft is right (as the draft model's confidence stop multiplies its
# probabilities). The estimate flatters (one match is "certain"), so the bar is higher than a further verified token's
# cost (about 0.06 of a step here: t(9) / t(1) = 1.50, docs/amd-epyc-zen5/benchmarks.md) would suggest: teacher-forced
# on this repository's code (its tests as the text, its modules as earlier answers, K = 8), tokens per step-cost were
# 1.19 at 0.25, 1.21 at 0.5, 1.22 at 0.6 and 1.215 at 0.75: a broad optimum, of which this is the plainest point
# (the matches favour the draft over all other continuations together).
MIN_CONFIDENCE = 0.5

Match = tuple[int, list[int], int]  # (n, tokens, i): tokens[i - n:i] are the text's last n tokens, tokens[i] followed


class IndexedText:
    """Token ids with, for each MIN_MATCH tokens in them, the positions just after their occurrences (oldest first)."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        # Tuples rather than lists: Python's garbage collector stops tracking a tuple of ints, and a full store holds
        # some 140,000 of them (as lists they made each full collection of the process 37 ms longer, as tuples 3 ms).
        self.index: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        for end in range(max(start, MIN_MATCH), len(self.tokens) + 1):
            key = tuple(self.tokens[end - MIN_MATCH:end])
            self.index[key] = self.index.get(key, ()) + (end,)

    def matches(self, text: list[int]) -> list[Match]:
        """Each earlier occurrence here of text's last n tokens (MIN_MATCH <= n <= MAX_MATCH, as long as it agrees)
        with something after it, the latest first."""
        tokens, found = self.tokens, []
        for end in reversed(self.index.get(tuple(text[-MIN_MATCH:]), ())):
            if end < len(tokens):
                n, limit = MIN_MATCH, min(MAX_MATCH, end, len(text))
                while n < limit and tokens[end - 1 - n] == text[-1 - n]:
                    n += 1
                found.append((n, tokens, end))
        return found


class AnswerStore:
    """The answers one owner's runs gave (a visitor's, a bench lane's), as token ids, each indexed for lookup; bounded
    and thread-safe.

    Holds at most `max_answers` answers and `max_tokens` tokens of them; beyond either, the oldest answers are dropped
    whole (each has its own index, so dropping one costs nothing). An answer is written while it is being decided (open,
    then extend as its tokens are confirmed), so it is there for the next run however the run that wrote it ended. Each
    keeps the MIN_MATCH - 1 tokens before it, the end of its prompt (for a chat, the template's "assistant" turn), so
    that its first tokens can be matched as well.
    """

    def __init__(self, max_answers: int = 256, max_tokens: int = 200_000):
        self.max_answers, self.max_tokens = max_answers, max_tokens
        self._lock = threading.Lock()
        self._answers: dict[int, IndexedText] = {}  # by id(), oldest first
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def tokens(self) -> int:
        """Tokens held, over all answers."""
        return self._tokens

    def open(self, lead: Sequence[int]) -> IndexedText:
        """A new answer after `lead` (the tokens before it), to be extended by its writer."""
        answer = IndexedText(lead[max(0, len(lead) - (MIN_MATCH - 1)):])
        with self._lock:
            self._answers[id(answer)] = answer
            self._tokens += len(answer.tokens)
            self._drop_oldest()
        return answer

    def extend(self, answer: IndexedText, tokens: Sequence[int]) -> None:
        """Append confirmed `tokens` to `answer` (nothing once the answer has been dropped)."""
        with self._lock:
            if self._answers.get(id(answer)) is answer:
                answer.extend(tokens)
                self._tokens += len(tokens)
                self._drop_oldest()

    def matches(self, text: list[int], own: IndexedText | None) -> list[Match]:
        """IndexedText.matches over the answers held, the newest first, but `own` (the asker's running answer, which
        its text holds already)."""
        key = tuple(text[-MIN_MATCH:])
        with self._lock:
            return [match for answer in reversed(self._answers.values()) if key in answer.index and answer is not own
                    for match in answer.matches(text)]

    def _drop_oldest(self) -> None:
        while self._answers and (len(self._answers) > self.max_answers or self._tokens > self.max_tokens):
            self._tokens -= len(self._answers.pop(next(iter(self._answers))).tokens)


def walk(found: list[Match], k: int) -> list[int]:
    """Up to k tokens from the longest matches in `found` (as IndexedText.matches gives them): at each step the token
    most of the matches still agreeing continue with (ties: the earliest in `found`), until the matches run out or their
    agreement, multiplied over the steps, falls below MIN_CONFIDENCE."""
    if not found:
        return []
    longest = max(n for n, _, _ in found)
    places = [(tokens, i) for n, tokens, i in found if n == longest]
    draft, confidence = [], 1.0
    while len(draft) < k and places:
        token, votes = Counter(tokens[i] for tokens, i in places).most_common(1)[0]
        confidence *= votes / len(places)
        if confidence < MIN_CONFIDENCE:
            break
        draft.append(token)
        places = [(tokens, i + 1) for tokens, i in places if tokens[i] == token and i + 1 < len(tokens)]
    return draft


class SuffixDrafter:
    """No draft model: the continuation of the text's longest suffix that occurred before, in this run's text or in
    an answer of `store` (its owner's earlier answers), by a frequency-weighted walk (module docstring). Deterministic proposals (q is None).

    The loop has no end-of-run call to a drafter, and the engine makes a new drafter for every run, so an answer cannot
    wait for its end (or for the next reset) to be stored: the drafter opens its answer in the store at its first
    proposal after a reset, takes everything before that proposal's last token for the prompt, and writes each token
    into the answer as it is confirmed (by the next proposal's text, or by keep for a round's accepted drafts).
    """

    kind = "suffix"

    def __init__(self, store: AnswerStore):
        self.store = store
        self.reset()

    def kv_cache_bytes(self) -> dict[str, int]:
        return {}

    def reset(self) -> None:
        self.text = IndexedText()  # prompt + tokens confirmed so far (every proposal's seq extends it)
        self.answer: IndexedText | None = None  # this run's answer in the store, from the first proposal
        self.prompt_tokens = 0
        self.proposed: list[int] = []  # the last proposal, until keep says how much of it was accepted

    def propose(self, seq: list[int], k: int) -> Proposal:
        start = time.perf_counter()
        if self.answer is None:  # the first proposal of a run: seq is the prompt and the target's first token
            self.prompt_tokens = len(seq) - 1
            self.answer = self.store.open(seq[:self.prompt_tokens])
        self._confirm(seq[len(self.text.tokens):])
        text = self.text.tokens
        self.proposed = walk(self.text.matches(text) + self.store.matches(text, self.answer), k)
        return Proposal(self.proposed, None, [], time.perf_counter() - start, self.kind)

    def keep(self, length: int) -> None:
        accepted, self.proposed = self.proposed[:max(0, length - len(self.text.tokens))], []
        self._confirm(accepted)

    def _confirm(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        start = len(self.text.tokens)
        self.text.extend(tokens)
        self.store.extend(self.answer, self.text.tokens[max(start, self.prompt_tokens):])


def make(draft_model, settings, rng, price=None, stops: tuple[float, ...] = (), memory: AnswerStore | None = None
         ) -> SuffixDrafter:
    """`memory`: the owner's earlier answers (make_drafter gives an empty store to a run that has no owner)."""
    return SuffixDrafter(memory if memory is not None else AnswerStore())


# Its drafts are earlier text copied verbatim, as prompt lookup's are, so until this machine's history says otherwise it
# starts from lookup's prior. Teacher-forced on this repository's code (as for MIN_CONFIDENCE) its drafts were accepted
# at α̂ 0.56 with the store and 0.58 without: the prior is the cautious side of that; its own history then prices it.
STRATEGY = Strategy("suffix", "your earlier answers (suffix match)", make,
                    planning=Planning(default_alpha=lookup.STRATEGY.planning.default_alpha,
                                      note=" Drafts continue the text where it, or one of your earlier answers in this "
                                           "session, went on the same way before, without a model call (no one else's "
                                           "answers are drawn on)."),
                    # Not replayed by the counterfactual: the answer it would explain is in the store by then, and a
                    # replay would draft it from itself (and write it there again).
                    counterfactual=Walking(replayable=False),
                    memory=AnswerStore)
