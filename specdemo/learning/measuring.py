"""Measuring this machine's call costs the way the decoding loop makes its calls: the cost model's first estimate
(specdemo/decoding/costs.py says what it holds and how runs correct it).

A single step is timed as the autoregressive lane makes it, again and again on one shape; t(n), n ≥ 2, as a round
makes it: a few draft steps, then one target call on n tokens with n rows of logits, both caches rolled back; each
shape repeated before the next, at a context answers reach. (Timing the sizes interleaved, one after another, made
every call a change of shape, which the CPU plugin pays for: t(1) came out 40 % above what the loop pays on an
AVX-512 EPYC.)

A measurement taken while others load the host (host/load.py: stolen time, others' CPU time, its own repeats far apart)
is taken again, BUSY_REPEATS times at most, each time only once a watch of the host (host.load.busy_now) finds it quiet;
still busy, each call's fastest over the takes is kept and marked (CostModel.busy), and the runs that follow correct it
(costs.fold).

A measurement is kept in the machine profile (specdemo/learning/profile) under cost_key: the models, precisions, device,
threads, CPU and OpenVINO, so a machine is measured once. Measuring runs every shape, so it doubles as the warm-up.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import asdict, replace

from specdemo import strict_json
from specdemo.decoding.costs import CostModel, monotone
from specdemo.host import load, machine
from specdemo.models import kernels
from specdemo.models.runtime import Interrupted, OVModel  # Interrupted: stop_if raises it too, callers catch it here
from specdemo.settings import K_MAX

COSTS_VERSION = 3  # bump when what is measured changes, so old caches are not reused
CONTEXT_TOKENS = 160  # the context every timed call follows: a short prompt and part of an answer
# The quick measurement's context (its prefill gives the prompt rate): the same rate and calls within the host's noise
# as after 160 (1.5B target on our kernels: 102-109 against 102-107 tokens/s; t(1), t(5), t(13) within 5 %), for 2.5 s
# less of a first start where the gemm has no VNNI (the pair's two prefills 5.1 s against 2.0 s on the AVX2 path; Xeon
# family 6 model 207).
QUICK_CONTEXT_TOKENS = 64
PREFILL_TOKENS = 128  # the prompt whose prefill gives the prompt rate
REPEATS = 5  # timed calls per shape, after UNTIMED calls of that shape; the median is kept
FIRST_CALLS_SHARE = 0.4  # measuring ÷ (UNTIMED + REPEATS) × warm-up, at the least: what the warm-up's first calls overpay
UNTIMED = 2  # the first calls after a change of shape are slow (seen: 66, 54, then 45 ms for one step)
ROUND_DRAFT_STEPS = 3  # draft steps before each timed target call (the round's pattern; more would only cost time)
N_MAX = K_MAX + 1  # calls of up to this many tokens are always timed, so one cache serves every K
# The quick first measurement (a page's start): these call sizes, QUICK_REPEATS timed calls each after one untimed, the
# sizes between them interpolated; 67 calls of both models after their first, where the full measurement makes some
# 170. The curve is smooth between them on every CPU class measured (a knee, where the plugin changes kernels, moves the
# interpolated sizes by a step at most), and the full measurement replaces it in the background.
# Its warm-up is each model's first call, on one token (first_call); its untimed calls warm up the shapes it times, its
# prompt rate is the context's own prefill, t(1) is timed once: 27 target calls, one of them a prefill, where warming
# every shape up after a prefill and timing the prompt apart made 38 (4 prefills; on a 2-core Xeon family 6 model 207,
# 1.5B gguf-mixed target: a first prefill of 160 tokens 13 s, the next 3.3 s).
QUICK_SIZES = (2, 3, 5, 9, 13)
QUICK_REPEATS = 2
# A full measurement judged busy (host.load: stolen time, others' CPU time, its repeats far apart) is taken again at
# most this many times, each only where the host, watched for host.load.WATCH_S, is quiet by then (a host still loaded
# gives another busy take); if every take is busy, each call's fastest is kept, marked (CostModel.busy), and runs
# correct it.
# The quick one is not repeated: it is provisional already, and the full measurement that follows is its repeat.
BUSY_REPEATS = 2
# A full measurement still busy after its repeats is taken again at the page's next starts (warmup.remaining), until one
# is clean or this many in a row were busy: the runs that follow correct the calls a plan makes, not the others.
BUSY_MEASUREMENTS = 3


def measure(target: OVModel, draft: OVModel | None, n_max: int, known: CostModel | None = None,
            log=lambda message: None, quick: bool = False, interrupted=lambda: False) -> CostModel:
    """The cost model for these compiled models: `known` (what the machine profile holds for them), or measured;
    `quick`: a provisional one from a few calls (QUICK_SIZES), where nothing is known, in seconds; a provisional
    `known` is measured again in full unless `quick`. A full measurement asks `interrupted()` before each call or stage
    (stop_if): True stops it (Interrupted), both caches emptied, so a visitor waits for one call, not a whole stage.

    Both models' caches are left empty. Every shape a run will use (prefill, 1 and up to n_max tokens)
    has run at least once when this returns, so the first timed lane pays no first-call costs.
    """
    n_max = max(n_max, N_MAX)
    if known is not None and (quick or not known.provisional):
        log(f"cost model from this machine's profile ({known.standing()}); warming up")
        _warm_up(target, n_max)
        if draft is not None:
            _warm_up(draft, 2)
        return known
    start = time.perf_counter()
    if quick:
        sizes = [n for n in QUICK_SIZES if n <= n_max]
        calls = _requests(target, draft)
        for model in (target, draft):
            if model is not None:
                first_call(model)
        warmed = time.perf_counter()
        log(f"warmed up in {warmed - start:.0f} s ({_requests(target, draft) - calls} calls: each model's first, where "
            f"its weights are laid out); measuring this machine quickly (calls of {', '.join(map(str, sizes))} tokens, "
            "the others run once; the full measurement follows in the background)")
        calls = _requests(target, draft)
        costs = _time_loop(target, draft, n_max, sizes=sizes, untimed=1, repeats=QUICK_REPEATS, quick=True)
        log(f"measured quickly in {time.perf_counter() - warmed:.0f} s ({_requests(target, draft) - calls} calls)"
            + (f"; {costs.busy}" if costs.busy else ""))
        return replace(levelled(costs), seconds=time.perf_counter() - start, provisional=True)
    takes = []
    try:
        _warm_up(target, n_max, interrupted)
        if draft is not None:
            _warm_up(draft, 2, interrupted)
        # UNTIMED + REPEATS calls a shape where the warm-up made one, but a first call costs more (Zen 5: 7 s, then 19)
        most = (UNTIMED + REPEATS) * (time.perf_counter() - start)
        log(f"measuring this machine the way the loop calls it ({FIRST_CALLS_SHARE * most:.0f}–{most:.0f} s, once per "
            "machine): single steps, "
            f"then rounds scoring 2..{n_max} tokens" + (" after draft steps" if draft else ""))
        while not takes or takes[-1].busy and len(takes) <= BUSY_REPEATS:
            if takes and (still := load.busy_now(load.WATCH_S)):
                log(f"{takes[-1].busy}; the host is still busy ({load.described(still)}): not measured again now")
                break
            if takes:
                log(f"{takes[-1].busy}: measuring again ({len(takes)} of at most {BUSY_REPEATS} more)")
            takes.append(_time_loop(target, draft, n_max, interrupted=interrupted))
    except Interrupted:
        target.reset()
        if draft is not None:
            draft.reset()
        raise
    costs = quietest(takes)
    if costs.busy:
        log(f"kept as provisional, {costs.busy}: the runs that follow correct it")
    return replace(costs, seconds=time.perf_counter() - start)


def levelled(costs: CostModel) -> CostModel:
    """`costs` with its curve made non-decreasing (costs.monotone), as measured."""
    return replace(costs, target_s=monotone(costs.target_s), measured_target_s=())


def quietest(takes: list[CostModel]) -> CostModel:
    """What the takes of one measurement (each as _time_loop timed it, not yet levelled) say of the quiet host, levelled:
    a clean take as it is; where every take was busy, each call's fastest over the takes (load only ever adds time, and
    a neighbour's burst lands on other calls in each take: one take alone kept a t(6) 2.6× its t(5) on a Xeon beside a
    busy loop; levelled first, a burst would lift every size above it), with the least busy take's host and
    sentence."""
    clean = [costs for costs in takes if not costs.busy]
    if clean:
        return levelled(clean[0])
    least = min(takes, key=lambda costs: (costs.host.get("steal", 0.0) + costs.host.get("others", 0.0),
                                          costs.host.get("spread", 0.0)))
    fastest = lambda field: tuple(map(min, zip(*(getattr(costs, field) for costs in takes))))  # noqa: E731
    return levelled(replace(least, target_s=fastest("target_s"), draft_s=fastest("draft_s"), measured_draft_s=(),
                            target_prefill_tps=max(costs.target_prefill_tps for costs in takes),
                            draft_prefill_tps=max(costs.draft_prefill_tps for costs in takes)))


def _warm_up(model: OVModel, n_max: int, interrupted=lambda: False) -> None:
    """Run each shape once, untimed: the plugin's first call of a shape costs much more than later ones."""
    model.reset()
    stop_if(interrupted, "before warming up")
    model.forward(_ids(CONTEXT_TOKENS))
    _run_once(model, range(1, n_max + 1), interrupted=interrupted)
    model.reset()


def _run_once(model: OVModel, sizes, context: int = CONTEXT_TOKENS, interrupted=lambda: False) -> None:
    """A call of each of `sizes` tokens after the `context` tokens the model's cache holds, untimed, rolled back."""
    for n in sizes:
        stop_if(interrupted, f"before a warm-up call of {n} tokens")
        model.forward(_ids(n), logits_to_keep=n)
        model.rollback(context)


def stop_if(interrupted, where: str) -> None:
    """Interrupted (stopped `where`) if `interrupted()` says something more urgent waits."""
    if interrupted():
        raise Interrupted(f"measuring stopped {where}")


def first_call(model: OVModel) -> None:
    """The first call of a fresh compile, on one token: the CPU plugin lays out its weights then (see QUICK_SIZES), so
    it is paid on the least work. The cache is left empty."""
    model.reset()
    model.forward(_ids(1))
    model.reset()


def _requests(*models: OVModel | None) -> int:
    """Inference requests the models made since they were compiled: what a stage's calls are counted by."""
    return sum(model.requests for model in models if model is not None)


def _time_loop(target: OVModel, draft: OVModel | None, n_max: int, sizes: list[int] | None = None,
               untimed: int = UNTIMED, repeats: int = REPEATS, interrupted=lambda: False,
               quick: bool = False) -> CostModel:
    """Time every call shape the way the decoding loop makes it (see the module's docstring), or only `sizes` (2 and
    n_max among them; the others interpolated), `untimed` + `repeats` calls of each; every shape has run once already
    (_warm_up) but those of `sizes`, whose untimed calls come first. `quick`: the prompt rate from the context's own
    prefill, and t(1) timed once (QUICK_SIZES). The curve as timed, not yet levelled (levelled, quietest)."""
    sizes = sorted(set(sizes or range(2, n_max + 1)) | {2, n_max})
    fields, target_rollback, repeats_by_shape, watch = {}, [], [], load.start()
    context = QUICK_CONTEXT_TOKENS if quick else CONTEXT_TOKENS
    if quick:  # a prefill of the context as a prompt is fed, after each model's first_call; then the shapes not timed
        if draft is not None:
            fields["draft_prefill_tps"] = _timed_prefill(draft, context)
            _run_once(draft, (1, 2), context)
        target_prefill = _timed_prefill(target, context)
        if target.settings.precision not in kernels.ON_KERNELS:  # ours prepare nothing per shape (+5–8 ms on ~100)
            _run_once(target, [n for n in range(1, n_max + 1) if n not in sizes and n != 1], context)
    else:
        target_prefill = _time_prefill(target, repeats, interrupted)
        if draft is not None:
            fields["draft_prefill_tps"] = _time_prefill(draft, repeats, interrupted)
            draft.forward(_ids(CONTEXT_TOKENS))
        target.forward(_ids(CONTEXT_TOKENS))

    # t(1), once now and (in full) once after the rounds: the lower is kept (load only adds time)
    steps = [_time_steps(target, untimed, repeats, interrupted)]
    target_rollback.append(_timed_rollback(target, context))
    calls, draft_steps, draft_pairs, draft_rollback = [], [], [], []
    for n in sizes:  # t(n): a round's pattern, a few draft steps then the verify call
        timed = []
        for i in range(untimed + repeats):  # asked before each round: a size's rounds took 1.3 s on the Zen 3
            stop_if(interrupted, f"before a round scoring {n} tokens")
            if draft is not None and not (quick and i < untimed):  # quick: the pattern only before timed calls
                for _ in range(min(n - 1, ROUND_DRAFT_STEPS)):
                    draft.forward(_ids(1))
                    if i >= untimed:
                        draft_steps.append(draft.last_call_s)
            target.forward(_ids(n), logits_to_keep=n)
            if i >= untimed:
                timed.append(target.last_call_s)
            target_rollback.append(_timed_rollback(target, context))
            if draft is not None:
                draft_rollback.append(_timed_rollback(draft, context))
                if n == 2 and i >= untimed:  # after a fully accepted round the draft is fed two tokens
                    draft.forward(_ids(2))
                    draft_pairs.append(draft.last_call_s)
                    draft.rollback(context)
        calls.append(statistics.median(timed))
        repeats_by_shape.append(timed)
    if not quick:
        steps.append(_time_steps(target, untimed, repeats, interrupted))
    calls = [min(statistics.median(s) for s in steps)] + _interpolated(sizes, calls, n_max)
    target.reset()
    if draft is not None:
        draft.reset()
        fields.update(draft_s=(statistics.median(draft_steps), statistics.median(draft_pairs)),
                      draft_rollback_s=statistics.median(draft_rollback))
    host = load.since(watch, load.spread(steps + repeats_by_shape))
    return CostModel(target_s=tuple(calls), target_prefill_tps=target_prefill,
                     target_rollback_s=statistics.median(target_rollback), cpu=machine.cpu_name(),
                     measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), host=host.to_dict(), busy=load.judge(host),
                     **fields)


def _interpolated(sizes: list[int], seconds: list[float], n_max: int) -> list[float]:
    """t(2) .. t(n_max) from the timed `sizes` (ascending, 2 and n_max among them), straight lines between them."""
    out = []
    for n in range(2, n_max + 1):
        upper = next(i for i, size in enumerate(sizes) if size >= n)
        if sizes[upper] == n:
            out.append(seconds[upper])
            continue
        (a, ta), (b, tb) = (sizes[upper - 1], seconds[upper - 1]), (sizes[upper], seconds[upper])
        out.append(ta + (tb - ta) * (n - a) / (b - a))
    return out


def _time_steps(model: OVModel, untimed: int = UNTIMED, repeats: int = REPEATS,
                interrupted=lambda: False) -> list[float]:
    """Seconds of `repeats` single-token calls made as the autoregressive lane makes them: one after another, the
    context growing (the first `untimed` are left out: a change of shape makes them slow)."""
    steps = []
    for i in range(untimed + repeats):
        stop_if(interrupted, "before a single step")
        model.forward(_ids(1))
        if i >= untimed:
            steps.append(model.last_call_s)
    return steps


def _time_prefill(model: OVModel, repeats: int = REPEATS, interrupted=lambda: False) -> float:
    """Prompt tokens per second: the fastest of `repeats` prefills of PREFILL_TOKENS."""
    rates = []
    for _ in range(repeats):
        stop_if(interrupted, "between timed prefills")
        model.reset()
        model.forward(_ids(PREFILL_TOKENS))
        rates.append(PREFILL_TOKENS / model.last_call_s)
    model.reset()
    return max(rates)


def _timed_prefill(model: OVModel, context: int) -> float:
    """Prompt tokens per second of the prefill of a `context`, once, into an empty cache; it stays."""
    model.reset()
    model.forward(_ids(context))
    return context / model.last_call_s


def _timed_rollback(model: OVModel, length: int) -> float:
    start = time.perf_counter()
    model.rollback(length)
    return time.perf_counter() - start



def _ids(n: int) -> list[int]:
    # Ordinary token ids (common sub-words in any large vocabulary); their values do not change the cost.
    return [(1000 + 37 * i) % 30000 + 100 for i in range(n)]


def describe_key(target: OVModel, draft: OVModel | None, n_max: int) -> dict:
    """What a cost model depends on: the models and how they are compiled, the CPU, OpenVINO, the calls timed (n_max,
    at least N_MAX, as measure times them)."""
    import openvino as ov

    def model_key(model: OVModel) -> dict:
        xml = model.folder / "openvino_model.xml"
        return {"folder": str(model.folder.resolve()), "modified": xml.stat().st_mtime if xml.is_file() else 0,
                **asdict(model.settings), "head_tokens": model.head_tokens}

    natives = [m for m in (target, draft) if m is not None and m.settings.precision in kernels.ON_KERNELS]
    return {
        "version": COSTS_VERSION,
        **({"kernels": kernels.identity()} if natives else {}),  # ours, rebuilt or on another ISA: other costs
        "target": model_key(target),
        "draft": model_key(draft) if draft is not None else None,
        "cpu": machine.cpu_name(),
        "cpu_features": machine.cpu_features(),
        "openvino": ov.get_version(),
        "n_max": max(n_max, N_MAX),
    }


def cost_key(description: dict) -> str:
    """The machine profile's key for the costs (and batching noise) of the compiled models `description`
    (describe_key) names."""
    return hashlib.sha256(strict_json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def measure_again(costs: CostModel) -> bool:
    """Whether a full measurement kept as busy is to be taken again (BUSY_MEASUREMENTS)."""
    return bool(costs.busy) and not costs.provisional and costs.busy_takes < BUSY_MEASUREMENTS


def counted(measured: CostModel, before: CostModel | None) -> CostModel:
    """`measured` (a full measurement) with its busy measurements in a row counted, `before` the curve it replaces."""
    if not measured.busy:
        return measured
    takes = max(before.busy_takes, 1) if before is not None and before.busy and not before.provisional else 0
    return replace(measured, busy_takes=takes + 1)
