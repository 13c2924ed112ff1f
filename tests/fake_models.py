"""Stand-ins for a compiled model and a tokenizer, for running the real decoding loops in microseconds.

A FakeModel has OVModel's interface as the loops and ModelDrafter use it (forward, rollback, reset,
length and the counters) and keeps the tokens of its "KV cache" themselves, so a test can check what
the cache holds, not only how long it is. Its logits for the token after a prefix are a fixed
pseudo-random function of the *whole* prefix: every position of a round gets its own distribution,
so a loop that verified a draft against the wrong row would sample from the wrong one.
"""

from __future__ import annotations

import hashlib

import numpy as np

from specdemo.models.logits import top_probability


class FakeModel:
    """A causal LM over `vocab_size` tokens whose next-token logits are a hash of the prefix and `salt`."""

    head_ids = None  # the whole vocabulary in the LM head, as OVModel without a trimmed head
    greedy_rows = rest_rows = 0  # as OVModel's counters: a whole head never asks for other rows

    def __init__(self, vocab_size: int, salt: str, scale: float = 1.0, seconds=None):
        """seconds(n): what a call on n tokens is reported to take (last_call_s); None: 0."""
        self.vocab_size = vocab_size
        self.salt = salt
        self.scale = scale  # spread of the logits: larger is more peaked
        self.seconds = seconds
        self.cache: list[int] = []  # the tokens whose keys and values the model holds
        self.calls = 0
        self.last_call_s = 0.0
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    @property
    def length(self) -> int:
        return len(self.cache)

    def logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        """Scores (V,) float32 for the token that follows `prefix`."""
        row = self._rows.get(prefix)
        if row is None:
            digest = hashlib.blake2b(repr((self.salt, prefix)).encode(), digest_size=8).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            row = (self.scale * rng.standard_normal(self.vocab_size)).astype(np.float32)
            self._rows[prefix] = row
        return row

    def forward(self, ids: list[int], logits_to_keep: int = 1) -> np.ndarray:
        """Feed `ids` after the cached tokens; rows (logits_to_keep, V) for the last positions, as OVModel."""
        if not ids:
            raise ValueError("forward() needs at least one token")
        self.cache.extend(int(i) for i in ids)
        self.calls += 1
        self.last_call_s = self.seconds(len(ids)) if self.seconds is not None else 0.0
        n, keep = len(self.cache), min(logits_to_keep, len(ids))
        return np.stack([self.logits(tuple(self.cache[: j + 1])) for j in range(n - keep, n)])

    def greedy_ids(self, logits: np.ndarray, confidence: bool = False):
        """The argmax of each row (and its softmax probability), as OVModel.greedy_ids with the whole head."""
        ids = logits.argmax(axis=-1)
        return (ids, top_probability(logits)) if confidence else ids

    def sampling_logits(self, logits: np.ndarray) -> tuple[np.ndarray, None]:
        """The logits as they are, over every token: OVModel.sampling_logits with the whole head."""
        return logits, None

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a {self.length}-token cache to {length} tokens")
        del self.cache[length:]

    def reset(self) -> None:
        self.cache.clear()
        self.calls = 0

    def kv_cache_bytes(self) -> int:
        return len(self.cache)


class FakeTokenizer:
    """Token i is the text "<i>"."""

    def decode(self, ids, **kwargs) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


class StaleRollbackModel(FakeModel):
    """A FakeModel with a rollback bug: the first token each rollback forgets stays visible to every later call (a mask
    one position short), while `length` says it is gone. Its single steps and its batched calls agree exactly; only a
    cache that was rolled back is wrong."""

    def __init__(self, vocab_size: int, salt: str, scale: float = 1.0):
        super().__init__(vocab_size, salt, scale)
        self.stale: list[int] = []  # indices into self.cache of tokens rolled back but still attended to

    @property
    def length(self) -> int:
        return len(self.cache) - len(self.stale)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a {self.length}-token cache to {length} tokens")
        if length == self.length:
            return
        first_forgotten = [i for i in range(len(self.cache)) if i not in self.stale][length]
        del self.cache[first_forgotten + 1:]
        self.stale = [i for i in self.stale if i < first_forgotten] + [first_forgotten]

    def reset(self) -> None:
        super().reset()
        self.stale = []
