"""The issue's targets (settings.py), judged on one run's figures."""

from __future__ import annotations

from dataclasses import dataclass

from specdemo.bench import stats
from specdemo.bench.schema import GENAI_SPEC, HF_SPEC, OURS_SPEC, Sections
from specdemo.bench.table import Run
from specdemo.bench.settings import (TARGET_AUTO_SPEEDUP, TARGET_GENAI_RATIO, TARGET_OVERHEAD, TARGET_PREDICTION_ERROR,
                                     TARGET_SPEEDUP, TARGET_TRANSFORMERS)
from specdemo.names import SPECULATIVE


@dataclass(frozen=True)
class Target:
    """One target judged on a run; in benchmarks.json, these keys."""

    id: str
    target: str  # what it asks, in a sentence
    where: str  # what it was judged on: "N=100", a sweep row's label
    goal: float
    sense: str  # "≤": at most the goal; "≥": at least
    unit: str  # "ratio" or "share"
    measured: float
    met: bool
    gap: float  # measured / goal − 1: how far over or under the goal, as a fraction


def judge_targets(sections: Sections, runs: list[Run]) -> list[Target]:
    """Each target, from the sections' figures and the table's `runs`: what it asks, what we measured, met or not, and
    by how much."""
    targets = []
    if at := stats.section(runs, "paper"):
        where = f"N={at.n}"
        targets.append(_target("genai_ratio", "our speculative / GenAI speculative time", where,
                               at.ratio(OURS_SPEC, GENAI_SPEC).median, TARGET_GENAI_RATIO, "≤"))
        targets.append(_target("speedup", "speculative speedup over autoregressive (code)", where,
                               at.speedup(OURS_SPEC).median, TARGET_SPEEDUP, "≥"))
        overhead = sections.paper.time_shares[SPECULATIVE][stats.PYTHON]
        targets.append(_target("overhead", "our loop's share of wall time outside model calls", where, overhead,
                               TARGET_OVERHEAD, "≤", "share"))
    if k_rows := stats.sweep_rows(runs, "k", "specdemo"):
        best = fastest(k_rows)
        targets.append(_target("speedup_best_k", "speculative speedup over autoregressive (code), best K", best.lane.label,
                               best.measured_speedup.median, TARGET_SPEEDUP, "≥"))
    if auto := stats.with_k_policy(k_rows, "auto"):
        where = auto[0].lane.label
        targets.append(_target("auto_speedup", "auto K speedup over autoregressive (code)", where,
                               auto[0].measured_speedup.median, TARGET_AUTO_SPEEDUP, "≥"))
        if (error := auto[0].prediction_error).n:
            targets.append(_target("prediction_error", "|predicted − measured| / measured, auto K, median", where,
                                   abs(error.median), TARGET_PREDICTION_ERROR, "≤", "share"))
    hf = stats.section(runs, "transformers")
    if hf and (ratio := hf.ratio(HF_SPEC, OURS_SPEC)).n:
        targets.append(_target("transformers", "transformers assisted time / our speculative time", f"N={hf.n}",
                               ratio.median, TARGET_TRANSFORMERS, "≥"))
    return targets


def fastest(rows: list[stats.SweepRow]) -> stats.SweepRow:
    return max(rows, key=lambda row: row.measured_speedup.median)


def _target(id: str, name: str, where: str, measured: float, goal: float, sense: str, unit: str = "ratio") -> Target:
    met = measured <= goal if sense == "≤" else measured >= goal
    return Target(id, name, where, goal, sense, unit, measured, met, measured / goal - 1)
