"""A first benchmark: autoregressive vs speculative decode time on code instructions.

Warm-up first (compilation and first-call allocations are not what we measure), then every
instruction runs in both modes back to back, so each pair of timings shares the machine's state.
Figures are medians and ratios measured in this one run; the machine is shared and noisy, so
absolute seconds mean less than the ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field

from specdemo.events import Summary
from specdemo.settings import RunSettings

CODE_INSTRUCTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that counts the words in a text file.",
]


@dataclass
class BenchResult:
    instructions: int
    repeats: int
    max_new_tokens: int
    k: int
    ar_s: list[float] = field(default_factory=list)  # autoregressive wall times
    spec_s: list[float] = field(default_factory=list)  # speculative wall times, same order
    acceptance: list[float] = field(default_factory=list)
    tokens_per_call: list[float] = field(default_factory=list)
    cost_ratio: list[float] = field(default_factory=list)
    expected_speedup: list[float] = field(default_factory=list)
    identical: int = 0  # runs whose speculative tokens equal the autoregressive ones

    def figures(self) -> dict:
        ratios = [a / s for a, s in zip(self.ar_s, self.spec_s)]
        return {
            "runs": len(self.ar_s),
            "max_new_tokens": self.max_new_tokens,
            "k": self.k,
            "median_autoregressive_s": statistics.median(self.ar_s),
            "median_speculative_s": statistics.median(self.spec_s),
            "speedup_of_medians": statistics.median(self.ar_s) / statistics.median(self.spec_s),
            "median_speedup": statistics.median(ratios),
            "min_speedup": min(ratios),
            "max_speedup": max(ratios),
            "acceptance_rate": statistics.mean(self.acceptance),
            "tokens_per_target_call": statistics.mean(self.tokens_per_call),
            "cost_ratio_c": statistics.mean(self.cost_ratio),
            "expected_speedup": statistics.mean(self.expected_speedup),
            "identical_outputs": f"{self.identical}/{len(self.ar_s)}",
        }


def run(engine, settings: RunSettings, instructions: list[str], repeats: int = 1, progress=print) -> BenchResult:
    generation = settings.generation
    result = BenchResult(len(instructions), repeats, generation.max_new_tokens, generation.k)
    progress("warming up")
    for mode in (engine.autoregressive, engine.speculative):
        _drain(mode(instructions[0], generation))
    for r in range(repeats):
        for i, instruction in enumerate(instructions):
            ar_ids, ar = _drain(engine.autoregressive(instruction, generation))
            spec_ids, spec = _drain(engine.speculative(instruction, generation))
            result.ar_s.append(ar.wall_s)
            result.spec_s.append(spec.wall_s)
            result.acceptance.append(spec.acceptance_rate)
            result.tokens_per_call.append(spec.tokens_per_call)
            result.cost_ratio.append(spec.cost_ratio)
            result.expected_speedup.append(spec.expected_speedup)
            result.identical += ar_ids == spec_ids
            progress(
                f"[{r * len(instructions) + i + 1}/{repeats * len(instructions)}] "
                f"autoregressive {ar.wall_s:.2f}s, speculative {spec.wall_s:.2f}s, "
                f"speedup {ar.wall_s / spec.wall_s:.2f}x, acceptance {spec.acceptance_rate:.0%}"
            )
    return result


def _drain(events) -> tuple[list[int], Summary]:
    ids = []
    for event in events:
        if isinstance(event, Summary):
            return ids, event
        ids.append(event.id)
    raise RuntimeError("the decoding loop ended without a summary")


def add_arguments(parser) -> None:
    """The bench command's own flags (model and generation flags come from the CLI)."""
    parser.add_argument("--repeats", type=int, default=1, help="runs of each instruction after the warm-up")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def main(args, settings: RunSettings) -> int:
    from specdemo.engine import Engine

    repeats, as_json = args.repeats, args.json
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    engine = Engine.load(settings, with_draft=settings.generation.drafter == "model")
    log = (lambda message: print(message, file=sys.stderr)) if as_json else print
    figures = run(engine, settings, CODE_INSTRUCTIONS, repeats, log).figures()
    if as_json:
        print(json.dumps(figures, indent=2))
    else:
        print()
        for key, value in figures.items():
            print(f"{key:26} {value:.3f}" if isinstance(value, float) else f"{key:26} {value}")
    return 0
