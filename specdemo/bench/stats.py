"""Statistics of benchmark runs, pure functions over `Run` records (tested without a model). Conventions:
- a *spread* is the median with min, max, mean, std and n of a list of numbers;
- ratios are *paired*: per (repeat, instruction) between two lanes that ran back to back, so a slow moment of the
  shared machine hits both sides, and only then summarised; lanes are paired by their fields, never by label;
- a speedup (a speculative lane over its own framework's autoregressive one) divides seconds per new token, prefill
  included, as the paper does, because two lanes may stop at different lengths;
- a ratio across frameworks divides decode rates (tokens after the first per second of their time), as each
  framework's own tools report them: prefill is a figure of its own (lane_figures), not folded into the ratio.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from itertools import zip_longest

from specdemo.bench.schema import Row
from specdemo.bench.table import Lane, Run
from specdemo.names import SPECULATIVE
from specdemo.results import metrics


@dataclass(frozen=True)
class Spread:
    """A list of numbers summarised, NaNs dropped; in JSON, these six keys."""

    median: float = math.nan
    min: float = math.nan
    max: float = math.nan
    mean: float = math.nan
    std: float = math.nan  # sample standard deviation, 0 for one value
    n: int = 0  # how many numbers (0: nothing measured, the rest NaN)

    def scaled(self, factor: float) -> Spread:  # the same spread in another unit
        return Spread(*(v * factor for v in (self.median, self.min, self.max, self.mean, self.std)), self.n)


def spread(values: list[float]) -> Spread:
    if not (values := [v for v in values if not math.isnan(v)]):
        return Spread()
    return Spread(statistics.median(values), min(values), max(values), statistics.fmean(values),
                  statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


def lane_runs(runs: list[Run], lane: Lane) -> list[Run]:
    return [r for r in runs if r.lane == lane]


@dataclass(frozen=True)
class Pass:
    """A section's runs at one N under one setting (Run.setting), and their lanes in the order they first ran."""

    n: int  # new tokens asked of each run (max_new_tokens)
    runs: list[Run]
    lanes: list[Lane]

    def lane(self, which: tuple[str, str]) -> Lane:
        """Its first lane of `which`, (framework, kind) as schema.OURS_SPEC (one autoregressive lane per framework)."""
        return next(lane for lane in self.lanes if (lane.framework, lane.kind) == which)

    def speedup(self, which: tuple[str, str]) -> Spread:
        return speedup(self.runs, self.lane(which))

    def ratio(self, numerator: tuple[str, str], denominator: tuple[str, str]) -> Spread:
        return spread(decode_ratios(self.runs, self.lane(numerator), self.lane(denominator)))


def section(runs: list[Run], name: str, setting: str = "", n: int | None = None) -> Pass | None:
    """Section `name`'s pass `setting` in the table at N = `n` (default: its largest N, the paper's 100), None where it
    has no runs there."""
    mine = [r for r in runs if r.section == name and r.setting == setting]
    n = n or max((r.max_new_tokens for r in mine), default=0)
    mine = [r for r in mine if r.max_new_tokens == n]
    return Pass(n, mine, list(dict.fromkeys(r.lane for r in mine))) if mine else None


def tokens(runs: list[Run], name: str) -> list[int]:
    """The Ns section `name` ran its lanes at, ascending (the paper's 40 and 100)."""
    return sorted({r.max_new_tokens for r in runs if r.section == name})


def paired_runs(runs: list[Run], numerator: Lane, denominator: Lane) -> list[tuple[Run, Run]]:
    """(numerator's run, denominator's run) per (repeat, instruction), where both produced tokens."""
    by_key = {(r.repeat, r.instruction): r for r in lane_runs(runs, denominator)}
    pairs = [(run, by_key.get((run.repeat, run.instruction))) for run in lane_runs(runs, numerator) if run.tokens]
    return [(run, other) for run, other in pairs if other is not None and other.tokens]


def paired_ratios(runs: list[Run], numerator: Lane, denominator: Lane) -> list[float]:
    """Per (repeat, instruction): numerator lane's seconds per token / denominator lane's (autoregressive over
    speculative: the speedup)."""
    return [a.per_token_s / b.per_token_s for a, b in paired_runs(runs, numerator, denominator)]


def ratio_of_sums(runs: list[Run], numerator: Lane, denominator: Lane) -> float:
    """Numerator lane's summed seconds per summed token over the denominator lane's, on the pairs paired_ratios uses
    (Spec-Bench's other speedup: long answers weigh more)."""
    if not (pairs := paired_runs(runs, numerator, denominator)):
        return math.nan
    return (sum(a.wall_s for a, _ in pairs) / sum(a.tokens for a, _ in pairs)) / \
        (sum(b.wall_s for _, b in pairs) / sum(b.tokens for _, b in pairs))


def decode_ratios(runs: list[Run], numerator: Lane, denominator: Lane) -> list[float]:
    """Per (repeat, instruction): the denominator lane's decode rate over the numerator lane's, i.e. the numerator's
    decoding time per token over the denominator's (above 1: the numerator decodes slower)."""
    return [b.decode_rate / a.decode_rate for a, b in paired_runs(runs, numerator, denominator)]


def speedup(runs: list[Run], lane: Lane) -> Spread:
    """The Spread of `lane`'s speedups over its baseline (paired_ratios)."""
    return spread(paired_ratios(runs, lane.baseline, lane))


def prediction_errors(runs: list[Run], lane: Lane) -> list[float]:
    """(predicted − measured) / measured speedup of `lane` over its baseline, per instruction and repeat."""
    return [(run.summary.predicted_speedup - measured) / measured for run, b in paired_runs(runs, lane, lane.baseline)
            if run.summary and run.summary.predicted_speedup and (measured := b.per_token_s / run.per_token_s)]


def acceptance(runs: list[Run]) -> float | None:
    """Drafts kept / drafts offered over `runs` (None where none were offered)."""
    proposed = sum(r.proposed for r in runs)
    return sum(r.accepted for r in runs) / proposed if proposed else None


def same_as_reference(runs: list[Run]) -> str:
    """"3/5": how many of `runs` wrote their reference's tokens, of how many."""
    return f"{sum(r.same_as_reference for r in runs)}/{len(runs)}"


@dataclass(frozen=True)
class Times:
    """Times of one lane's runs, each a Spread over them (lane_figures)."""

    wall_s: Spread  # seconds of a whole run
    per_token_s: Spread  # wall seconds per new token
    prefill_s: Spread  # seconds to the first token
    decode_tokens_per_s: Spread  # Run.decode_rate
    tokens: Spread  # new tokens of a run
    same_as_reference: str  # "3/5": runs that wrote their reference's tokens


def lane_figures(runs: list[Run], lane: Lane) -> Times:
    mine = lane_runs(runs, lane)
    return Times(*(spread([how(r) for r in mine]) for how in (lambda r: r.wall_s, lambda r: r.per_token_s,
                 lambda r: r.prefill_s, lambda r: r.decode_rate, lambda r: float(r.tokens))), same_as_reference(mine))


@dataclass(frozen=True)
class Drafting:
    """How a speculative lane's runs drafted, pooled (long runs weigh more), by metrics.py's names."""

    alpha_hat: float  # α̂: accepted / (accepted + rounds that ended in a rejection), over every round
    draft_cost: float  # c: the median of the runs' draft step in single target steps
    mean_k: float  # drafts per round that drafted
    leviathan_speedup: float  # Leviathan's eq. 1 from α̂, mean K and c
    predicted_speedup: Spread  # this machine's, from its call costs
    mean_acceptance_length: Spread  # tokens per verify call
    accepted_histogram: list[int]  # rounds by how many drafts they kept (0..K), summed over the runs
    verify_call_s: Spread
    draft_step_s: Spread


def speculative_figures(runs: list[Run]) -> Drafting:
    """The Drafting of `runs` (ours: their summaries; a peer's: its counts of drafts proposed and accepted)."""
    proposed, accepted = sum(r.proposed for r in runs), sum(r.accepted for r in runs)
    ours = [r.summary for r in runs if r.summary is not None]
    rejections = sum(s.rejections for s in ours)
    rounds = sum(sum(s.accepted_histogram) for s in ours)
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    mean_k = proposed / rounds if rounds else 0.0
    c = statistics.median([s.draft_cost for s in ours]) if ours else 0.0
    histogram = [sum(kept) for kept in zip_longest(*(s.accepted_histogram for s in ours), fillvalue=0)]  # by drafts kept
    return Drafting(alpha, c, mean_k, metrics.leviathan_speedup(alpha, mean_k, c),
                    spread([s.predicted_speedup for s in ours]), spread([s.mean_acceptance_length for s in ours]),
                    histogram, spread([s.verify_call_s for s in ours]), spread([s.draft_step_s for s in ours]))


@dataclass(frozen=True)
class SweepRow(Drafting):
    """One speculative lane of a sweep (sweep_rows): how it drafted, and what it measured against its baseline."""

    lane: Lane
    measured_speedup: Spread  # over its baseline (speedup)
    per_token_s: Spread
    reference_per_token_s: Spread  # its baseline's
    same_as_reference: str  # "3/5"
    prediction_error: Spread  # (predicted − measured) / measured speedup


def sweep_rows(runs: list[Run], name: str, framework: str | None = None) -> list[SweepRow]:
    """A row per speculative lane of sweep section `name` in the table (of `framework` only, where given: the K sweep's
    rows are ours, GenAI's lanes at the same K its columns), in the order they ran."""
    at = section(runs, name)
    return [SweepRow(**vars(speculative_figures(mine)), lane=lane, measured_speedup=speedup(at.runs, lane),
                     per_token_s=spread([r.per_token_s for r in mine]),
                     reference_per_token_s=spread([r.per_token_s for r in lane_runs(at.runs, lane.baseline)]),
                     same_as_reference=same_as_reference(mine), prediction_error=spread(prediction_errors(at.runs, lane)))
            for lane in (at.lanes if at else []) if lane.kind == SPECULATIVE and framework in (None, lane.framework)
            for mine in [lane_runs(at.runs, lane)]]


def with_k_policy(rows: list[SweepRow], policy: str) -> list[SweepRow]:  # policy: "fixed", "adaptive" or "auto"
    return [row for row in rows if row.lane.k_policy == policy]


def same_k(runs: list[Run], lane: Lane) -> Lane | None:
    """GenAI's speculative lane at fixed-K `lane`'s K among `runs` (beside ours in the K sweep), or None."""
    if lane.k_policy != "fixed":
        return None
    return next((r.lane for r in runs if (r.lane.framework, r.lane.kind, r.lane.k) == ("genai", SPECULATIVE, lane.k)),
                None)


@dataclass(frozen=True)
class Counterfactual(Row):
    """What the counterfactual said of a K sweep lane: a fixed-K lane's first five fields, any other's last four."""

    counterfactual_speedup: Spread = Spread()  # its speedup at the lane's K, on the answers the lane wrote the same
    counterfactual_error: Spread = Spread()  # (counterfactual − measured) / measured speedup
    counterfactual_calls_off: int = 0  # the largest gap between the target calls it said and the run made
    counterfactual_calls: list[int] = field(default_factory=list)  # that gap per answer
    answers_differ: int = 0  # answers the lane wrote otherwise than its baseline, where the walk says nothing
    oracle_speedup: Spread = Spread()  # the best K for every round
    best_fixed_k: list[int] = field(default_factory=list)  # the best fixed K per answer
    best_fixed_counterfactual: Spread = Spread()  # its speedup
    over_best_fixed: Spread = Spread()  # the lane's measured speedup over the measured fixed-K lane at that K


def counterfactual_figures(runs: list[Run], lane: Lane, would: dict) -> Counterfactual:
    """What the counterfactual (`would` by (instruction, repeat), on the baseline's greedy answer) said of `lane`,
    beside what the lane measured. A fixed-K lane: the speedup at its K, its error and the target calls it was off by,
    on the answers the lane wrote as the baseline did, and how many it wrote otherwise. Any other lane: the per-round
    oracle, the best fixed K, and the lane's speedup over the measured fixed-K lane at that K (if the sweep ran it)."""
    baseline = {(r.instruction, r.repeat): r for r in lane_runs(runs, lane.baseline)}
    fixed = {(r.lane.k, r.instruction, r.repeat): r for r in runs if r.lane.k_policy == "fixed" and r.lane.framework == "specdemo"}
    said, errors, calls, oracle, best_k, best, over_best, differ = [], [], [], [], [], [], [], 0
    for run in lane_runs(runs, lane):
        key = (run.instruction, run.repeat)
        w, base = would.get(key), baseline.get(key)
        if w is None or base is None or not w.fixed or not run.tokens:
            continue
        measured = base.per_token_s / run.per_token_s
        if lane.k_policy == "fixed" and run.ids != base.ids:
            differ += 1  # another answer at this K: the walk over the baseline's answer says nothing of this run
            continue
        if lane.k_policy == "fixed" and lane.k <= len(w.fixed):
            walk = w.fixed[lane.k - 1]
            said.append(walk.speedup)
            errors.append((walk.speedup - measured) / measured)
            calls.append(walk.target_calls - run.summary.target_calls)
            continue
        top = w.best_fixed()
        oracle.append(w.oracle.speedup)
        best_k.append(top.k)
        best.append(top.speedup)
        partner = fixed.get((top.k, *key))
        if partner is not None and partner.tokens:
            over_best.append(measured / (base.per_token_s / partner.per_token_s))
    if lane.k_policy == "fixed":
        return Counterfactual(lane.label, spread(said), spread(errors), max((abs(c) for c in calls), default=0), calls,
                              differ)
    return Counterfactual(lane.label, oracle_speedup=spread(oracle), best_fixed_k=best_k,
                          best_fixed_counterfactual=spread(best), over_best_fixed=spread(over_best))


def step_seconds(runs: list[Run]) -> float:
    """Median seconds of one target call after the prefill (an autoregressive step, or a verify call)."""
    steps = [r.summary.target_step_s for r in runs if r.summary is not None and r.summary.target_step_s]
    return statistics.median(steps) if steps else math.nan


PYTHON = "our Python"  # the share of wall time outside model calls and rollbacks (time_shares)
# Where a speculative run's wall time goes, in the order the report lists it.
COMPONENTS = (*metrics.TIME_PARTS, PYTHON)


def time_shares(runs: list[Run]) -> dict[str, float]:
    """Fractions of the summed wall time of `runs` in each of COMPONENTS (they sum to 1), from the runs' round records
    (metrics.time_split); PYTHON is the rest: the loop, acceptance, logits copies, detokenizing."""
    wall = sum(r.wall_s for r in runs)
    seconds = dict.fromkeys(COMPONENTS, 0.0)
    for r in runs:
        for part, value in metrics.time_split(r.rounds).items():
            seconds[part] += value
    seconds[PYTHON] = wall - sum(seconds.values())
    return {name: value / wall if wall else 0.0 for name, value in seconds.items()}
