"""What a call costs on this machine: the measured cost model the planner and the predictions use.

Leviathan et al. assume scoring K+1 tokens in one target call costs one single-token step. That holds
where the target is memory-bound (an AMX Xeon: a 5-token call costs ~1.2 steps) and fails where it
is compute-bound (an AVX2-only CPU: ~2.4 steps), so nothing here assumes it: we time

    t(n)     one target call scoring n tokens after a short prompt, n = 1 .. n_max   (seconds)
    d(n)     one draft call on n tokens, n = 1, 2 (a round after a full accept feeds two)
    prefill  the prompt rate of each model (tokens per second)
    rollback one KV-cache trim of each model (seconds)

for the models, precisions, device and thread count in use, and cache the result under
SPECDEMO_HOME/costs keyed by those and the CPU, so a machine is measured once (a few seconds) and
`measure(..., fresh=True)` re-measures on request. Measuring also warms every shape up, so it
doubles as the warm-up.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specdemo import machine
from specdemo.runtime import OVModel

COSTS_VERSION = 1  # bump when what is measured changes, so old caches are not reused
CONTEXT_TOKENS = 64  # the prompt every timed call follows (a short instruction in the chat template)
PREFILL_TOKENS = 128  # the prompt whose prefill gives the prompt rate
REPEATS = 7  # timings per shape; the fastest is kept (another process can only add time, never take it away)
N_MAX = 13  # calls of up to this many tokens are always timed (K up to 12, the page's largest), so one cache serves all


@dataclass(frozen=True)
class CostModel:
    """Measured seconds per call for one target (and draft) on this machine."""

    target_s: tuple[float, ...]  # target_s[n - 1] = t(n): one target call on n tokens, n = 1 .. n_max
    target_prefill_tps: float  # target prompt tokens per second (a 128-token prefill)
    target_rollback_s: float  # one trim of the target's KV cache
    draft_s: tuple[float, ...] = ()  # draft_s[n - 1] = d(n) for n = 1, 2; () without a draft model
    draft_prefill_tps: float = 0.0  # draft prompt tokens per second
    draft_rollback_s: float = 0.0
    cpu: str = ""  # what it was measured on, for display
    measured_at: str = ""  # ISO date and time
    seconds: float = 0.0  # how long measuring took (0 when read from the cache)

    @property
    def n_max(self) -> int:
        return len(self.target_s)

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
        data["target_s"] = tuple(data["target_s"])
        data["draft_s"] = tuple(data.get("draft_s", ()))
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


def measure(target: OVModel, draft: OVModel | None, n_max: int, cache: Path | None = None, fresh: bool = False,
            log=lambda message: None) -> CostModel:
    """The cost model for these compiled models, from `cache` when it holds one for them and this CPU.

    Both models' caches are left empty. Every shape a run will use (prefill, 1 and up to n_max tokens)
    has run at least once when this returns, so the first timed lane pays no first-call costs.
    """
    n_max = max(n_max, N_MAX)
    path = cache / f"{cost_key(target, draft, n_max)}.json" if cache is not None else None
    if path is not None and path.is_file() and not fresh:
        costs = CostModel.from_dict(json.loads(path.read_text())["costs"])
        log("cost model from the cache; warming up")
        _warm_up(target, n_max)
        if draft is not None:
            _warm_up(draft, 2)
        return costs
    log(f"measuring this machine: target calls on 1..{n_max} tokens" + (", draft steps" if draft else ""))
    start = time.perf_counter()
    target_s, target_prefill, target_rollback = _time_model(target, range(1, n_max + 1))
    fields = {}
    if draft is not None:
        draft_s, draft_prefill, draft_rollback = _time_model(draft, (1, 2))
        fields = {"draft_s": draft_s, "draft_prefill_tps": draft_prefill, "draft_rollback_s": draft_rollback}
    costs = CostModel(target_s=target_s, target_prefill_tps=target_prefill, target_rollback_s=target_rollback,
                      cpu=machine.cpu_name(), measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
                      seconds=time.perf_counter() - start, **fields)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps({"key": describe_key(target, draft, n_max), "costs": costs.to_dict()}, indent=2))
        scratch.replace(path)
    return costs


def _warm_up(model: OVModel, n_max: int) -> None:
    """Run each shape once, untimed: the plugin's first call of a shape costs much more than later ones."""
    model.reset()
    model.forward(_ids(CONTEXT_TOKENS))
    for n in range(1, n_max + 1):
        model.forward(_ids(n))
        model.rollback(CONTEXT_TOKENS)
    model.reset()


def _time_model(model: OVModel, sizes) -> tuple[tuple[float, ...], float, float]:
    """(fastest seconds per call for each size, prompt tokens per second, fastest rollback seconds).

    The fastest of REPEATS timings, not the median: on a shared machine other processes only ever add
    time, and a cost model measured during a burst of load would mislead every later plan.
    """
    sizes = list(sizes)
    _warm_up(model, max(sizes))
    prefills = []
    for _ in range(REPEATS):
        model.reset()
        start = time.perf_counter()
        model.forward(_ids(PREFILL_TOKENS))
        prefills.append(time.perf_counter() - start)
    model.reset()
    model.forward(_ids(CONTEXT_TOKENS))
    calls = {n: [] for n in sizes}
    rollbacks = []
    for _ in range(REPEATS):
        for n in sizes:  # sizes interleaved, so a burst of load on the machine touches them all alike
            start = time.perf_counter()
            model.forward(_ids(n))
            calls[n].append(time.perf_counter() - start)
            start = time.perf_counter()
            model.rollback(CONTEXT_TOKENS)
            rollbacks.append(time.perf_counter() - start)
    model.reset()
    return monotone([min(calls[n]) for n in sizes]), PREFILL_TOKENS / min(prefills), min(rollbacks)


def monotone(seconds: list[float]) -> tuple[float, ...]:
    """The cost curve made non-decreasing: scoring more tokens never costs less than scoring fewer, so a
    dip can only be noise (a burst of load during a shorter call), and the larger of the two is kept."""
    curve, highest = [], 0.0
    for s in seconds:
        highest = max(highest, s)
        curve.append(highest)
    return tuple(curve)


def _ids(n: int) -> list[int]:
    # Ordinary token ids (common sub-words in any large vocabulary); their values do not change the cost.
    return [(1000 + 37 * i) % 30000 + 100 for i in range(n)]


def describe_key(target: OVModel, draft: OVModel | None, n_max: int) -> dict:
    """What a cost model depends on: the models and how they are compiled, the CPU, OpenVINO, n_max."""
    import openvino as ov

    def model_key(model: OVModel) -> dict:
        xml = model.folder / "openvino_model.xml"
        return {"folder": str(model.folder.resolve()), "modified": xml.stat().st_mtime if xml.is_file() else 0,
                **asdict(model.settings), "head_tokens": model.head_tokens}

    return {
        "version": COSTS_VERSION,
        "target": model_key(target),
        "draft": model_key(draft) if draft is not None else None,
        "cpu": machine.cpu_name(),
        "cpu_features": machine.cpu_features(),
        "openvino": ov.get_version(),
        "n_max": n_max,
    }


def cost_key(target: OVModel, draft: OVModel | None, n_max: int) -> str:
    text = json.dumps(describe_key(target, draft, n_max), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
