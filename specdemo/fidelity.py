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
    compile_settings: str  # in the model panel's words (engine.describe_compile)
    positions: int  # answer tokens compared
    top1_agreement: float  # share of positions with the reference's greedy token
    mean_abs_logit_error: float  # logits


def reference_settings(target: ModelSettings) -> ModelSettings:
    """The GGUF reference: its own blocks, f32 arithmetic, no dynamic quantization."""
    return replace(target, precision="gguf", inference_precision="f32", kv_cache_precision="f32",
                   dynamic_quantization_group_size=0, num_threads=0)


def teacher_forced_logits(model, prompt: list[int], answer: list[int]) -> np.ndarray:
    """(len(answer) − 1, V) logits of `model` at each answer position, the answer fed as context."""
    model.reset()
    model.forward(prompt)
    logits = model.forward(answer[:-1], logits_to_keep=len(answer) - 1)
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
