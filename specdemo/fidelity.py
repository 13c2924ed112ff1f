"""How faithful a compiled model is to the GGUF it came from.

The reference is the GGUF itself: its own blocks (precision gguf, specdemo/gguf_weights.py) compiled with f32
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


def compare(reference, candidates: dict[str, object], examples: list[tuple[list[int], list[int]]]) -> dict[str, tuple]:
    """(positions, top-1 agreement, mean |logit error|) of each candidate model against `reference`, over
    `examples` of (prompt ids, answer ids); one example's logits in memory at a time."""
    totals = {name: [0, 0, 0.0] for name in candidates}
    for prompt, answer in examples:
        ref = teacher_forced_logits(reference, prompt, answer)
        choices = ref.argmax(axis=-1)
        for name, model in candidates.items():
            logits = teacher_forced_logits(model, prompt, answer)
            total = totals[name]
            total[0] += len(choices)
            total[1] += int((logits.argmax(axis=-1) == choices).sum())
            total[2] += float(np.abs(logits - ref).mean(axis=-1).sum())
    return {name: (n, kept / n if n else float("nan"), error / n if n else float("nan"))
            for name, (n, kept, error) in totals.items()}


# ---- how far one compile's batched calls differ from its single steps

NOISE_POSITIONS = 96  # answer tokens scored both ways: ~7 s of single target steps on a 2-core Zen 5, once per compile
NOISE_SIZES = (2, 4, 8, 13)  # tokens per batched call: the verify calls of K = 1, 3, 7 and 12
REJECTED = 3  # drafts each batched call also scores and then rolls back, as a round with rejections does


@dataclass
class BatchingNoise:
    """How much a target's top-2 gap moves between a single-token call and a batched call on the same positions, with
    rejected drafts rolled back between batched calls as the loop leaves them: the rounding the kernels for one and for
    several rows, and for a cache with masked positions, do differently. Greedy lanes may part where a margin is within
    it."""

    max_gap_change: float  # logits: the largest |gap single − gap batched| over positions and call sizes
    positions: int  # answer positions compared
    sizes: tuple[int, ...]  # tokens per batched call tried
    flips: int = 0  # positions where a batched call's greedy token differs from the single step's (at any size)

    @property
    def parting_rate(self) -> float:
        """Positions per 1,000 where greedy lanes would part: a batched call choosing another token than a single step."""
        return 1000 * self.flips / self.positions if self.positions else float("nan")

    def to_dict(self) -> dict:
        return {"max_gap_change": self.max_gap_change, "positions": self.positions, "sizes": list(self.sizes),
                "flips": self.flips, "parting_rate": self.parting_rate}

    @classmethod
    def from_dict(cls, data: dict) -> "BatchingNoise":
        return cls(float(data["max_gap_change"]), int(data["positions"]), tuple(data["sizes"]), int(data.get("flips", 0)))


def batching_noise(model, examples: list[tuple[list[int], list[int]]], positions: int = NOISE_POSITIONS,
                   sizes: tuple[int, ...] = NOISE_SIZES) -> BatchingNoise:
    """Score up to `positions` answer tokens of `examples` (prompt ids, answer ids) one token per call, as the
    autoregressive lane does, then `size` tokens per call for each size, as verify calls do: each call also scores
    REJECTED more tokens, which are then rolled back out of the cache (masked, as the loop rolls back rejected drafts),
    so the kernels see the cache the speculative lane leaves. Compare the gap between the single steps' top two tokens
    at each position."""
    change, compared, flips = 0.0, 0, 0
    for prompt, answer in examples:
        fed = answer[: min(len(answer), positions - compared + 1)][:-1]
        if not fed:
            break
        model.reset()
        model.forward(prompt)
        single = np.concatenate([model.forward([token]) for token in fed])  # (n, V)
        top2 = np.argsort(single, axis=-1)[:, -2:]  # (n, 2): runner-up, best
        rows = np.arange(len(fed))
        gap = single[rows, top2[:, 1]] - single[rows, top2[:, 0]]
        flipped = np.zeros(len(fed), dtype=bool)
        for size in sizes:
            model.reset()
            model.forward(prompt)
            pieces = []
            for i in range(0, len(fed), size):
                piece = fed[i:i + size]
                rejected = [fed[(i + 7 * j + 3) % len(fed)] for j in range(REJECTED)]  # any tokens will do
                pieces.append(model.forward(piece + rejected, logits_to_keep=len(piece) + REJECTED)[:len(piece)])
                model.rollback(model.length - REJECTED)
            batched = np.concatenate(pieces)
            moved = batched[rows, top2[:, 1]] - batched[rows, top2[:, 0]] - gap
            change = max(change, float(np.abs(moved).max()))
            flipped |= batched.argmax(axis=-1) != top2[:, 1]
        compared += len(fed)
        flips += int(flipped.sum())
        if compared >= positions:
            break
    model.reset()
    return BatchingNoise(change, compared, tuple(sizes), flips)
