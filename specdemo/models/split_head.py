"""A trimmed LM head of blocks in two parts: the kept rows in the model's own compile, every other row in a compile of
its own (graph.head_over_rows), run only where the kept rows may not hold the draft's choice (OtherRows._wanted).

Why: a head trimmed to Python's frequent tokens (specdemo/models/vocab.py) makes the draft's step cheap on code and
loses every other script. The 0.5B draft's 32k head agreed with the 1.5B target on 31 % of a Chinese answer's tokens,
its full head on 85 %; on code the full head's step costs ~8 % more of a round. The other rows are asked for where
either rule below says the kept rows may not hold the draft's choice, so code keeps the trimmed head's step and other
scripts get the full head's choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from specdemo.models.logits import top_probability

if TYPE_CHECKING:  # the machine profile reads RULE, and `show` reads the profile without loading OpenVINO
    import openvino as ov

# A row whose top probability over the kept rows is below this takes the argmax over every row. At 0.9, teacher forced
# on the target's answers (2-core Zen 4): code agreed with the target as with the full head (0.948) with the other
# rows in 24 % of steps. Alone it left Chinese at 0.808 (the full head 0.848): a token the kept rows lack can lose to
# one they hold at high probability.
REST_BELOW = 0.9
# And every row, where at least FOREIGN_SHARE of the last FOREIGN_WINDOW cached tokens are off the kept rows: text
# in a script the head was not trimmed for. Code answers have 2-10 % of their tokens off a 32k head, French 28 %,
# Russian 65 %, Chinese 86 %. Teacher forced as above, this rule beside REST_BELOW gave French, Chinese and Russian
# the full head's agreement (0.700, its other rows in 98 % of steps; REST_BELOW alone 0.646 in 76 %), the page's
# Chinese example 0.848 (0.808), and left code as it was (0.948, 25 %). Windows of 8 to 64 and shares of 0.2 and 0.3
# gave the same; at 0.1, code took its other rows in 36-51 % of steps.
FOREIGN_WINDOW = 16
FOREIGN_SHARE = 0.2
RULE = (REST_BELOW, FOREIGN_WINDOW, FOREIGN_SHARE)  # what a draft plan's acceptance was measured under


class OtherRows:
    """The rows a trimmed head of blocks left out, compiled alone, and which tokens of a model's cache are off the
    kept rows (the model reports each call's tokens: fed, and its rollbacks: keep)."""

    def __init__(self, model: ov.Model, every_row: np.ndarray, head_ids: np.ndarray, vocab_size: int,
                 compile: Callable[[ov.Model], ov.InferRequest]):
        """model: as it will be compiled, its head trimmed to head_ids (sorted); every_row: the head's rows before
        the trim (graph.lm_head_rows). Adds the output "hidden" to `model` (graph.expose_head_input)."""
        from specdemo.models import graph  # OpenVINO's: see the imports

        self.head_ids = head_ids
        self.ids = np.setdiff1d(np.arange(vocab_size), head_ids)  # the other rows' token ids, sorted
        self.request = compile(graph.head_over_rows(model, every_row[self.ids]))
        graph.expose_head_input(model)
        self._kept = np.zeros(vocab_size, dtype=bool)
        self._kept[head_ids] = True
        self._off = np.zeros(0, dtype=bool)  # per cached position: its token is off the kept rows

    def fed(self, ids: list[int]) -> None:
        self._off = np.concatenate([self._off, ~self._kept[np.asarray(ids, dtype=np.int64)]])

    def keep(self, length: int) -> None:
        self._off = self._off[:length]

    def choose(self, logits: np.ndarray, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """For `logits` (n, kept rows), the rows of the cache's last n positions: the greedy token ids (n,) int64, each
        one's softmax probability (n,) over the rows it was chosen from (the kept rows, or every row), and how many
        took the other rows. hidden: (≥ n, width) the head's input at the latest call's kept positions."""
        best = logits.argmax(axis=-1)
        ids, top = self.head_ids[best], top_probability(logits)
        unsure = np.flatnonzero(self._wanted(top))
        if len(unsure):
            rest = self.logits(len(logits) - unsure, hidden)  # (unsure, other rows)
            wins = rest.max(axis=-1) > logits[unsure, best[unsure]]
            ids[unsure[wins]] = self.ids[rest[wins].argmax(axis=-1)]
            # Over every row: the kept rows' top probability says little where their choice was not sure to be theirs
            # (text in another script: the confidence stop ended the page's Chinese example's rounds at 2 drafts)
            top[unsure] = top_probability(np.concatenate([logits[unsure], rest], axis=1))
        return ids, top, len(unsure)

    def whole(self, logits: np.ndarray, hidden: np.ndarray) -> np.ndarray | None:
        """(1, vocabulary) the logits of every row for the last of `logits` (n, kept rows) where the rules want the
        other rows there, else None: what a sampled draft draws from. Exact either way: the rules read the logits and
        the cache, both known before the draw, so the draft's q is the distribution its token came from."""
        if not self._wanted(top_probability(logits[-1:]))[0]:
            return None
        every = np.empty((1, len(self._kept)), dtype=logits.dtype)
        every[0, self.head_ids] = logits[-1]
        every[0, self.ids] = self.logits(np.ones(1, dtype=np.int64), hidden)[0]
        return every

    def _wanted(self, top: np.ndarray) -> np.ndarray:
        """(n,) bool for the kept rows' top probabilities `top` (n,) at the cache's last n positions: unsure
        (REST_BELOW) or foreign."""
        return (top < REST_BELOW) | self._foreign(len(top))

    def _foreign(self, n: int) -> np.ndarray:
        """(n,) bool: for each of the cache's last n positions, whether FOREIGN_SHARE of the FOREIGN_WINDOW tokens up
        to it are off the kept rows. Sums the last n + FOREIGN_WINDOW - 1 flags only, not the whole cache's."""
        off = self._off[-(n + FOREIGN_WINDOW - 1):]
        counts = np.concatenate([[0], np.cumsum(off)])
        ends = np.arange(len(off) - n, len(off)) + 1
        starts = np.maximum(ends - FOREIGN_WINDOW, 0)
        return counts[ends] - counts[starts] >= FOREIGN_SHARE * (ends - starts)

    def logits(self, back: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """(len(back), other rows) f32: the other rows on `hidden`'s positions `back` from its last (1: the last), a
        call each (their compile takes one position)."""
        rows = []
        for position in len(hidden) - back:
            self.request.infer({0: np.ascontiguousarray(hidden[position][None, None])})
            rows.append(np.array(self.request.get_output_tensor(0).data[0, 0]))
        return np.stack(rows)
