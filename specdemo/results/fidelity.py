"""How faithful a compiled model is to the GGUF it came from.

The reference is the GGUF itself: its own blocks (precision gguf, specdemo/models/gguf_weights.py) compiled with f32
arithmetic and no dynamic quantization, so its weights are gguf's dequantization and its arithmetic is exact to f32.
Each candidate (a weight precision under the compile settings it runs with) is teacher forced over the built-in
answers (assets/calibration.json) beside it, and compared at every position:

- top-1 agreement: the share of positions where both choose the same greedy token;
- mean |logit error|: the mean over positions and vocabulary of |logit − reference logit|.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specdemo.settings import ModelSettings


@dataclass
class Fidelity:
    """One candidate's agreement with the GGUF reference."""

    precision: str  # the weights: int8, int4, gguf, …
    compile_settings: str  # in the model panel's words (models.describe_compile)
    positions: int  # answer tokens compared
    top1_agreement: float  # share of positions with the reference's greedy token
    mean_abs_logit_error: float  # logits


def reference_settings(target: ModelSettings) -> ModelSettings:
    """The GGUF reference: its own blocks, f32 arithmetic, no dynamic quantization."""
    return replace(target, precision="gguf", inference_precision="f32", kv_cache_precision="f32",
                   dynamic_quantization_group_size=0, num_threads=0)


def teacher_forced_logits(model, prompt: list[int], answer: list[int], piece: int = 0) -> np.ndarray:
    """(len(answer) − 1, V) logits of `model` at each answer position, the answer fed as context; with `piece`, fed
    that many tokens a call (the CPU plugin keeps memory sized by a compile's longest call after the compile is let go:
    tune, which lets go of a dozen compiles, feeds pieces)."""
    model.reset()
    fed = answer[:-1]
    size = piece or max(len(prompt), len(fed), 1)
    for begin in range(0, len(prompt), size):
        model.forward(prompt[begin:begin + size])
    logits = np.concatenate([model.forward(fed[begin:begin + size], logits_to_keep=len(fed[begin:begin + size]))
                             for begin in range(0, len(fed), size)])
    model.reset()
    return logits


def reference_logits(reference, examples: list[tuple[list[int], list[int]]], piece: int = 0) -> list[np.ndarray]:
    """The reference's teacher-forced logits on each of `examples` (prompt ids, answer ids), kept so that the reference's
    compile can be let go before a candidate is compiled: (positions, V) f32 each, ~170 MB for the 285 positions of
    the built-in answers against a 1.6 GiB compile."""
    return [teacher_forced_logits(reference, prompt, answer, piece) for prompt, answer in examples]


def compare(reference: list[np.ndarray], model, examples: list[tuple[list[int], list[int]]], piece: int = 0) -> tuple:
    """(positions, top-1 agreement, mean |logit error|) of `model` against the `reference` logits of the same
    `examples` (reference_logits)."""
    n, kept, error = 0, 0, 0.0
    for ref, (prompt, answer) in zip(reference, examples):
        logits = teacher_forced_logits(model, prompt, answer, piece)
        n += len(ref)
        kept += int((logits.argmax(axis=-1) == ref.argmax(axis=-1)).sum())
        error += float(np.abs(logits - ref).mean(axis=-1).sum())
    return (n, kept / n, error / n) if n else (0, float("nan"), float("nan"))


# ---- how far one compile's batched calls differ from its single steps

NOISE_POSITIONS = 96  # answer tokens compared: ~30 s of target calls on a 2-core Zen 5, once per compile
NOISE_SIZES = (2, 4, 8, 13)  # tokens per batched call: the verify calls of K = 1, 3, 7 and 12
REJECTED = 3  # drafts each rolled-back batched call also scores and then rolls back, as a round with rejections does
# logits: more than any sound compile's calls moved a top-2 gap. On a 2-core Zen 5 the 1.5B target's moved one by at
# most 0.19-0.24 logits with drafts rolled back at f32 (INT8 with a KV cache of f32 or u8, the GGUF's blocks) and 0.375
# at bf16 (3 of bf16's steps at logits of 16-32), over 96 and 320 positions; by 0.0 with nothing rolled back.
NOISE_CEILING = 0.5


@dataclass
class BatchingNoise:
    """How much a target's top-2 gap moves between a single-token call and a batched call on the same positions: the
    rounding the kernels for one and for several rows, and for a cache with masked positions, do differently. Greedy
    lanes may part where a margin is within it.

    Measured twice. With rejected drafts rolled back between calls, as the speculative lane leaves its cache: on a
    sound compile that is where the lanes' partings come from (clean batched calls of the Zen 5's tuned INT8 target
    reproduced its single steps bit for bit, yet its lanes parted at margins of 0.01–0.07 logits). And from a cache
    nothing was rolled back in: the kernels alone, which no rollback bug can widen. A compile whose calls move a gap
    beyond NOISE_CEILING either way is suspect, and its partings are judged by the second."""

    max_gap_change: float  # logits: the largest |gap single − gap batched| over positions and sizes, drafts rolled back
    positions: int  # answer positions compared
    sizes: tuple[int, ...]  # tokens per batched call tried
    flips: int = 0  # positions where a rolled-back batched call's greedy token differs from the single step's (any size)
    clean_gap_change: float = 0.0  # logits: the same largest change with nothing rolled back (the kernels alone)

    @property
    def parting_rate(self) -> float:
        """Positions per 1,000 where greedy lanes would part: a batched call choosing another token than a single step."""
        return 1000 * self.flips / self.positions if self.positions else float("nan")

    @property
    def suspect(self) -> str | None:
        """Why this compile's calls are out of line with every sound compile measured, in words; None when they are
        not."""
        if self.max_gap_change <= NOISE_CEILING and self.clean_gap_change <= NOISE_CEILING:
            return None
        return (f"its batched calls moved a top-2 gap by up to {self.max_gap_change:.2f} logits with rejected drafts "
                f"rolled back and {self.clean_gap_change:.2f} with nothing rolled back, beyond the {NOISE_CEILING} "
                "logits of any sound compile measured: a defect, not rounding")

    @property
    def trusted_gap_change(self) -> float:
        """Logits: the change a parting is judged by: as the lane runs (drafts rolled back), or where this compile is
        suspect, with nothing rolled back, so that a rollback bug cannot buy its partings a wider band."""
        return self.clean_gap_change if self.suspect else self.max_gap_change

    def to_dict(self) -> dict:
        return {"max_gap_change": self.max_gap_change, "positions": self.positions, "sizes": list(self.sizes),
                "flips": self.flips, "parting_rate": self.parting_rate, "clean_gap_change": self.clean_gap_change,
                "suspect": self.suspect}

    @classmethod
    def from_dict(cls, data: dict) -> "BatchingNoise":
        """KeyError for a measurement made before clean_gap_change was kept, so it is measured again: without it a
        suspect compile would have nothing to be judged by."""
        return cls(float(data["max_gap_change"]), int(data["positions"]), tuple(data["sizes"]), int(data.get("flips", 0)),
                   float(data["clean_gap_change"]))


def batching_noise(model, examples: list[tuple[list[int], list[int]]], positions: int = NOISE_POSITIONS,
                   sizes: tuple[int, ...] = NOISE_SIZES, clean: bool = True, check=lambda: None) -> BatchingNoise:
    """Score up to `positions` answer tokens of `examples` (prompt ids, answer ids) one token per call, as the
    autoregressive lane does, then `size` tokens per call for each size, as verify calls do: once from a fresh cache
    with nothing rolled back, once with REJECTED more tokens scored by each call and rolled back out of the cache (as
    the loop rolls back rejected drafts). Compare the gap between the single steps' top two tokens at each position.

    `clean` False skips the calls with nothing rolled back (a third of the time; clean_gap_change then NaN, so the
    result judges no parting): where only the flips count (identity's parting rate). `check()` is called before each
    answer's calls of each size: it may raise to stop the measurement there (the caller empties the cache)."""
    clean_change = 0.0 if clean else float("nan")
    rolled_change = 0.0
    compared = flips = 0
    for prompt, answer in examples:
        fed = answer[: min(len(answer), positions - compared + 1)][:-1]
        if not fed:
            break
        check()
        single = _scored(model, prompt, fed, 1)  # (n, V)
        top2 = np.argsort(single, axis=-1)[:, -2:]  # (n, 2): runner-up, best
        rows = np.arange(len(fed))

        def moved(logits: np.ndarray) -> float:
            gap = logits[rows, top2[:, 1]] - logits[rows, top2[:, 0]]
            return float(np.abs(gap - (single[rows, top2[:, 1]] - single[rows, top2[:, 0]])).max())

        flipped = np.zeros(len(fed), dtype=bool)
        for size in sizes:
            check()
            if clean:
                clean_change = max(clean_change, moved(_scored(model, prompt, fed, size)))
            rolled = _scored(model, prompt, fed, size, REJECTED)
            rolled_change = max(rolled_change, moved(rolled))
            flipped |= rolled.argmax(axis=-1) != top2[:, 1]
        compared += len(fed)
        flips += int(flipped.sum())
        if compared >= positions:
            break
    model.reset()
    return BatchingNoise(rolled_change, compared, tuple(sizes), flips, clean_change)


def _scored(model, prompt: list[int], fed: list[int], size: int, rejected: int = 0) -> np.ndarray:
    """(len(fed), V) logits of `model` at each token of `fed` after `prompt`, from an empty cache, `size` tokens per
    call; each call also scoring `rejected` more tokens that are then rolled back out of the cache."""
    model.reset()
    model.forward(prompt)
    pieces = []
    for i in range(0, len(fed), size):
        piece = fed[i:i + size]
        drafts = [fed[(i + 7 * j + 3) % len(fed)] for j in range(rejected)]  # any tokens will do
        pieces.append(model.forward(piece + drafts, logits_to_keep=len(piece) + rejected)[:len(piece)])
        if rejected:
            model.rollback(model.length - rejected)
    return np.concatenate(pieces)
