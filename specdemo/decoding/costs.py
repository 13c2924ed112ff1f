"""What a call costs on this machine: the cost model the planner and the predictions use, measured the way the
loop makes its calls (specdemo/learning/measuring.py) and corrected by every run.

Leviathan et al. assume scoring K+1 tokens in one target call costs one single-token step. That holds
where the target is memory-bound (an AMX Xeon: a 5-token call costs ~1.2 steps) and fails where it
is compute-bound (an AVX2-only CPU: ~2.4 steps), so nothing here assumes it:

    t(n)     one target call scoring n tokens (n logits rows kept), n = 1 .. n_max   (seconds)
    d(n)     one draft call on n tokens, n = 1, 2 (a round after a full accept feeds two)
    prefill  the prompt rate of each model (tokens per second)
    rollback one KV-cache trim of each model (seconds)

**Corrected by every run.** Each lane's records give what its calls really cost (metrics.call_seconds);
`fold` adds that observation, and the model is re-estimated from the measurement and the last WINDOW
observations: t(1) and d(1) as the median of what runs paid, the curve's shape t(n) / t(1) as the median of
the ratios runs paid (a run's t(n) over the same moment's t(1)), sizes no run used by the measured shape
scaled like their nearest neighbours, and the loop's own time per step and per round beyond its calls. One
run under load moves none of these; two runs that agree move them all. A shared machine drifts (the same target step was 47 ms and 35 ms an hour
apart), so the model follows what runs pay now. Runs correct only the calls they make: where a plan drafts nothing, its
run pays a few steps as verify calls (planner.PROBE_ROUNDS) so that a curve saying no K pays is checked too.

Kept in the machine profile (specdemo/learning/profile) keyed by the models, precisions, device, threads, CPU and OpenVINO
(measuring.cost_key), so a machine is measured once; measuring again forgets the corrections.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace

from specdemo.host import load

WINDOW = 5  # the latest observations a correction considers
# A measurement taken on a busy host (CostModel.busy) stands corrected once the latest this many runs were clean (their
# observation not marked "busy": the run's owner watched the host) and agree on t(1) (within host.load.SPREAD_BUSY):
# from 3 observations on, every estimate here is the runs' own median, and the measurement no longer counts.
CLEAN_RUNS = 3
PAIR_WINDOW_S = 30 * 60  # a run's t(n) is compared with a t(1) observed at most this long before or after it


@dataclass(frozen=True)
class CostModel:
    """Seconds per call for one target (and draft) on this machine: as measured, corrected by the runs since."""

    target_s: tuple[float, ...]  # target_s[n - 1] = t(n): one target call on n tokens, n = 1 .. n_max
    target_prefill_tps: float  # target prompt tokens per second (a 128-token prefill)
    target_rollback_s: float  # one trim of the target's KV cache
    draft_s: tuple[float, ...] = ()  # draft_s[n - 1] = d(n) for n = 1, 2; () without a draft model
    draft_prefill_tps: float = 0.0  # draft prompt tokens per second
    draft_rollback_s: float = 0.0
    cpu: str = ""  # what it was measured on, for display
    measured_at: str = ""  # ISO date and time of the measurement
    seconds: float = 0.0  # how long measuring took (0 when read from the machine profile)
    measured_target_s: tuple[float, ...] = ()  # t(n) as measured, before any correction (= target_s until a run)
    measured_draft_s: tuple[float, ...] = ()  # d(n) as measured
    observations: tuple[dict, ...] = ()  # the latest runs' observations: {"at": epoch s, "target": {n: s}, "draft": {n: s},
    #                                     "overhead": {"step": s, "round": s}, "busy": whether the host was busy}
    step_overhead_s: float = 0.0  # a single step's wall time beyond its call (the loop's own Python), as runs paid it
    round_overhead_s: float = 0.0  # a round's wall time beyond its calls and trims, as runs paid it
    runs: int = 0  # runs folded in since the measurement
    corrected_at: str = ""  # ISO date and time of the last fold that changed something
    last_change: str = ""  # what that fold changed, for people ("t(1) 51.0 → 36.8 ms, t(5)/t(1) 1.04 → 1.45")
    # A first quick measurement (measuring.measure(quick=True): a few calls of a few sizes, the sizes between them
    # interpolated), taken so the page is ready in seconds; the full measurement replaces it in the background.
    provisional: bool = False
    host: dict = field(default_factory=dict)  # how loaded the host was while it was measured (host.load.HostLoad's
    #                                           to_dict); {}: not watched (a measurement older than the watch)
    # Why the measurement may not be this host's quiet costs, in one sentence (HostLoad.busy; "" when clean): the plans
    # made on it are provisional until runs have replaced what was measured (fold, CLEAN_RUNS).
    busy: str = ""
    # Full measurements in a row judged busy, this one included (0 when clean): a page measures such a curve again in a
    # turn of its own at its next start, fewer than measuring.BUSY_MEASUREMENTS times in a row, as runs correct only
    # the calls a plan makes (a busy "no K pays" is never corrected by runs that draft nothing)
    busy_takes: int = 0

    def __post_init__(self):
        if not self.measured_target_s:
            object.__setattr__(self, "measured_target_s", tuple(self.target_s))
        if not self.measured_draft_s:
            object.__setattr__(self, "measured_draft_s", tuple(self.draft_s))

    @property
    def n_max(self) -> int:
        return len(self.target_s)

    def observed(self, n: int) -> bool:
        """Whether a run has paid for a target call on n tokens since the measurement (among the observations kept):
        until one has, the curve at n is the measurement's alone. Runs that draft nothing (a plan finding no K that
        pays) observe t(1) only, so they never correct the curve that said so."""
        return any(n in o["target"] for o in self.observations)

    def t(self, n: int) -> float:
        """Seconds of one target call on n tokens (n beyond the measured range: extrapolated linearly)."""
        if n <= self.n_max:
            return self.target_s[n - 1]
        slope = (self.target_s[-1] - self.target_s[0]) / max(self.n_max - 1, 1)
        return self.target_s[-1] + slope * (n - self.n_max)

    def d(self, n: int = 1) -> float:
        """Seconds of one draft call on n (1 or 2) tokens; 0 without a draft model."""
        if not self.draft_s:
            return 0.0
        return self.draft_s[min(n, len(self.draft_s)) - 1]

    def verify_steps(self, n: int) -> float:
        """Cost of scoring n tokens at once, in single target steps: t(n) / t(1)."""
        return self.t(n) / self.t(1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        data = dict(data)
        for key in ("target_s", "draft_s", "measured_target_s", "measured_draft_s"):
            data[key] = tuple(data.get(key, ()))
        data["observations"] = tuple(_observation(o) for o in data.get("observations", ()))
        return cls(**data)

    def sentence(self, k: int = 4) -> str:
        """One sentence on what this curve means for speculation on this machine."""
        steps = self.verify_steps(k + 1)
        if steps <= 1.5:
            kind = "memory-bound: scoring several tokens costs little more than one, so speculation has room to pay"
        elif steps <= 2.2:
            kind = "partly compute-bound: long drafts cost real time to check, so short ones pay best"
        else:
            kind = "compute-bound: checking drafts costs nearly as much as generating them, so speculation barely pays"
        draft = f"; a draft step costs {self.d(1) / self.t(1):.2f} target steps" if self.draft_s else ""
        return f"Scoring {k + 1} tokens costs {steps:.1f} single steps here ({kind}){draft}."

    def standing(self) -> str:
        """Where the model stands: when it was measured, how many runs corrected it, and the last change."""
        text = f"{'a quick first measurement (provisional), ' if self.provisional else ''}measured {self.measured_at.replace('T', ' ')}"
        if self.busy:
            text += f" ({self.busy}: provisional until runs correct it)"
        if not self.runs:
            return text + "; no run has corrected it yet"
        text += f", corrected by {self.runs} run{'s' if self.runs != 1 else ''}"
        if self.last_change:
            text += f"; last change {self.corrected_at.replace('T', ' ')}: {self.last_change}"
        return text


def _observation(o: dict) -> dict:
    """An observation with integer call sizes (JSON keeps keys as strings)."""
    return {"at": float(o.get("at", 0.0)),
            "target": {int(n): float(s) for n, s in o.get("target", {}).items()},
            "draft": {int(n): float(s) for n, s in o.get("draft", {}).items()},
            "overhead": {kind: float(s) for kind, s in o.get("overhead", {}).items()},
            "busy": bool(o.get("busy", False))}


# ---- correction by runs


def fold(costs: CostModel, observation: dict, at: float | None = None) -> CostModel:
    """The cost model re-estimated with one more run's observation ({"target": {n: s}, "draft": {n: s}}, the
    medians metrics.call_seconds gives). Pure: the caller saves the result."""
    observed = _observation({**observation, "at": time.time() if at is None else at})
    if not observed["target"] and not observed["draft"]:
        return costs
    observations = (*costs.observations, observed)[-4 * WINDOW:]
    target = _estimate_curve(costs.measured_target_s, [o["target"] for o in observations], [o["at"] for o in observations])
    draft = _estimate_curve(costs.measured_draft_s, [o["draft"] for o in observations], None) if costs.measured_draft_s else ()
    overheads = {kind: _robust_median([o["overhead"][kind] for o in observations if kind in o["overhead"]], 0.0)
                 for kind in ("step", "round")}
    change = _describe_change(costs, target, draft)
    busy = costs.busy if not _clean_runs_agree(observations) else ""
    if busy != costs.busy:
        change = ", ".join(filter(None, [change, f"no longer provisional: {CLEAN_RUNS} clean runs that agree replaced "
                                                 "a measurement taken while the host was busy"]))
    return replace(costs, target_s=target, draft_s=draft, observations=observations, runs=costs.runs + 1,
                   step_overhead_s=overheads["step"], round_overhead_s=overheads["round"],
                   corrected_at=time.strftime("%Y-%m-%dT%H:%M:%S") if change else costs.corrected_at,
                   last_change=change or costs.last_change, busy=busy)


def _clean_runs_agree(observations: tuple[dict, ...]) -> bool:
    """Whether the latest CLEAN_RUNS runs that paid for single steps ran on a quiet host (none was judged busy: a host
    loaded all along makes runs that agree too) and paid the same, within what a quiet host's repeats spread
    (host.load.SPREAD_BUSY)."""
    latest = [o for o in observations if 1 in o["target"]][-CLEAN_RUNS:]
    ones = [o["target"][1] for o in latest]
    return len(latest) == CLEAN_RUNS and not any(o["busy"] for o in latest) and load.spread([ones]) <= load.SPREAD_BUSY


def _robust_median(values: list[float], base: float) -> float:
    """The median of the latest WINDOW values. While there are fewer than 3, the measurement counts too and the low
    median is taken: one run under load (only ever slower) cannot move it, two runs that agree do. From 3 on, the
    plain median: what runs typically pay, not what the luckiest paid."""
    values = values[-WINDOW:]
    if len(values) < 3:
        return statistics.median_low([base, *values])
    return statistics.median(values)


def _estimate_curve(measured: tuple[float, ...], observed: list[dict[int, float]], at: list[float] | None) -> tuple[float, ...]:
    """One model's curve (seconds by call size) from its measurement and the runs' observations.

    The level, size 1, is what runs paid for it. The shape, size n over size 1, is what runs paid for n over
    what the same moment paid for 1 (the run's own size-1 calls, or with `at`, the nearest run's within
    PAIR_WINDOW_S); sizes no run used keep the measured shape, scaled by the correction of the nearest sizes
    that were used.
    """
    ones = [o[1] for o in observed if 1 in o]
    level = _robust_median(ones, measured[0])
    corrections: dict[int, float] = {}
    for n in range(2, len(measured) + 1):
        ratios = []
        for i, o in enumerate(observed):
            one = o.get(1) or (_nearest_one(observed, at, i) if at is not None else None)
            if n in o and one:
                ratios.append(o[n] / one)
        if ratios:
            corrections[n] = _robust_median(ratios, measured[n - 1] / measured[0]) / (measured[n - 1] / measured[0])
    curve = [level]
    for n in range(2, len(measured) + 1):
        curve.append(level * measured[n - 1] / measured[0] * _interpolate(corrections, n))
    return monotone(curve)


def _nearest_one(observed: list[dict[int, float]], at: list[float], i: int) -> float | None:
    """The size-1 seconds of the run nearest in time to run i, within PAIR_WINDOW_S; None if there is none."""
    near = [(abs(at[j] - at[i]), o[1]) for j, o in enumerate(observed) if 1 in o and abs(at[j] - at[i]) <= PAIR_WINDOW_S]
    return min(near)[1] if near else None


def _interpolate(corrections: dict[int, float], n: int) -> float:
    """The correction at size n: its own, else linear between the nearest corrected sizes, else the nearest one's
    (1.0 where no size was corrected)."""
    if n in corrections or not corrections:
        return corrections.get(n, 1.0)
    below = [m for m in corrections if m < n]
    above = [m for m in corrections if m > n]
    if below and above:
        lo, hi = max(below), min(above)
        w = (n - lo) / (hi - lo)
        return (1 - w) * corrections[lo] + w * corrections[hi]
    return corrections[max(below)] if below else corrections[min(above)]


def _describe_change(old: CostModel, target: tuple[float, ...], draft: tuple[float, ...]) -> str:
    """What a fold changed by more than 2 %, in words ("" if nothing did)."""
    parts = []
    if abs(target[0] / old.target_s[0] - 1) > 0.02:
        parts.append(f"t(1) {old.target_s[0] * 1e3:.1f} → {target[0] * 1e3:.1f} ms")
    for n in (3, 5, 9):
        if n <= len(target):
            before, after = old.target_s[n - 1] / old.target_s[0], target[n - 1] / target[0]
            if abs(after / before - 1) > 0.02:
                parts.append(f"t({n})/t(1) {before:.2f} → {after:.2f}")
    if draft and old.draft_s and abs(draft[0] / old.draft_s[0] - 1) > 0.02:
        parts.append(f"d(1) {old.draft_s[0] * 1e3:.1f} → {draft[0] * 1e3:.1f} ms")
    return ", ".join(parts)


def monotone(seconds: list[float]) -> tuple[float, ...]:
    """The cost curve made non-decreasing: scoring more tokens never costs less than scoring fewer, so a
    dip can only be noise (a burst of load during a shorter call), and the larger of the two is kept."""
    curve, highest = [], 0.0
    for s in seconds:
        highest = max(highest, s)
        curve.append(highest)
    return tuple(curve)
