"""The sweeps: one setting varied at a time (K, the draft's LM head, weight precision, KV cache precision, the drafter),
each measured by `sweep` into the table, where each speculative lane is a row of the report's (stats.sweep_rows); a
section keeps what the table does not hold of its lanes (its rows: schema.Row)."""

from __future__ import annotations

import gc
import math
from dataclasses import replace

from specdemo.bench import stats
from specdemo.bench.harness import Context, log_progress, measure, our_lane
from specdemo.bench.schema import Head, KvCache, Pair, Sweep
from specdemo.bench.settings import EDIT_INSTRUCTIONS
from specdemo.bench.table import Lane, Run
from specdemo.decoding.drafters import with_counterpart
from specdemo.models import kernels
from specdemo.models.loading import load_model
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.run.engine import Engine
from specdemo.settings import K_MAX, KPolicy


def sweep(ctx: Context, what: str, lanes: list[Lane], instructions: list[str] | None = None) -> list[Run]:
    """Measure `lanes` at the sweep's N on `instructions` (default: the code instructions) into the table; returns
    their runs with the token ids and rounds the table does not keep."""
    n, instructions = ctx.sweep_tokens, instructions or ctx.code_instructions()
    ctx.log(f"{what}: N={n}, {len(lanes)} lanes, {len(instructions)} instructions")
    return ctx.keep(measure(lanes, instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log))


def run_k(ctx: Context) -> Sweep:
    """Fixed K = 1..8, adaptive and auto K against one autoregressive baseline; GenAI at a few K; and on every answer,
    what each K would have given (the counterfactual, greedy), beside what each lane measured."""
    generation = ctx.generation
    ar = our_lane(AUTOREGRESSIVE, ctx.engine, AUTOREGRESSIVE, generation)
    ours = [our_lane(f"K={k}", ctx.engine, SPECULATIVE, ctx.fixed(k), baseline=ar) for k in ctx.bench.k_values]
    adaptive = replace(generation, k_policy=KPolicy.adaptive(min(generation.k_policy.k, K_MAX), 1, K_MAX))
    ours.append(our_lane("adaptive K", ctx.engine, SPECULATIVE, adaptive, baseline=ar))
    auto = replace(generation, k_policy=KPolicy.auto(K_MAX))
    # auto K as it runs by default (with this machine's confidence stop; the first auto row, which the targets and the
    # plots read), then without the stop, to show what it buys
    auto_lane = our_lane("auto K", ctx.engine, SPECULATIVE, auto, baseline=ar)
    ours += [auto_lane, our_lane("auto K, no confidence stop", ctx.engine, SPECULATIVE, replace(auto, draft_p_min=0.0),
                                 baseline=ar)]
    genai = []
    if ctx.bench.genai_k_values:
        genai_ar = ctx.genai_lane("GenAI autoregressive", "plain")
        genai = [genai_ar] + [ctx.genai_lane(f"GenAI K={k}", SPECULATIVE, baseline=genai_ar, k=k) for k in ctx.bench.genai_k_values]
    runs = sweep(ctx, f"K sweep, K in {list(ctx.bench.k_values)}, adaptive and auto", [ar, *ours, *genai])
    would = counterfactuals(ctx, runs, ar, observer=auto_lane)  # corrected by what auto K observed
    return Sweep(ctx.sweep_tokens, [stats.counterfactual_figures(runs, lane, would) for lane in ours],
                 counterfactuals=[dict(instruction=i, repeat=r, **w.to_dict()) for (i, r), w in sorted(would.items())])


def counterfactuals(ctx: Context, runs: list[Run], ar: Lane, observer: Lane) -> dict:
    """What each K would have given on each autoregressive answer, by (instruction, repeat): greedy, with the cost
    model as it stands after the section's runs corrected it. Where the `observer` lane (auto K) wrote the same answer,
    its own drafting corrects the teacher-forced mask (counterfactual.observed_matches); the fixed-K lanes it is
    checked against stay out of it."""
    instructions = ctx.code_instructions()
    settings = replace(ctx.fixed(1), max_new_tokens=ctx.sweep_tokens)  # a fixed K of 1 spans K = 1..K_MAX (KPolicy)
    seen = {(r.instruction, r.repeat): r for r in stats.lane_runs(runs, observer)}
    out = {}
    for run in stats.lane_runs(runs, ar):
        key = (run.instruction, run.repeat)
        watcher = seen.get(key)
        rounds = watcher.rounds if watcher is not None and watcher.ids == run.ids else None
        prompt = ctx.engine.prompt_ids(instructions[run.instruction], settings)
        out[key] = ctx.engine.would_have_given(prompt, settings, run.ids, rounds)
        if out[key] is not None:
            ctx.engine.profile.learn_from_answer(ctx.engine.keys, out[key].evidence)
    return out


def run_vocab(ctx: Context) -> Sweep:
    """The draft's LM head trimmed to its N most frequent tokens: draft step, α̂ and speedup for each N."""
    generation = replace(ctx.generation, k_policy=KPolicy.auto(K_MAX))
    ar = our_lane(AUTOREGRESSIVE, ctx.engine, AUTOREGRESSIVE, generation)
    lanes, heads = [ar], []
    for n_head in ctx.bench.head_tokens:
        label = f"head {n_head // 1000}k" if n_head else "full head"
        if n_head == ctx.engine.draft.settings.head_tokens:
            engine = ctx.engine
        else:
            engine = Engine(ctx.engine.target, load_model(replace(ctx.engine.draft.settings, head_tokens=n_head)))
            engine.warm_up(K_MAX, log=lambda m: ctx.log(f"  {label}: {m}"))
        lane = our_lane(label, engine, SPECULATIVE, generation, baseline=ar)
        step_s = engine.costs.d(1) if engine.costs else math.nan
        heads.append(Head(label, n_head, engine.draft.runtime.head_tokens, step_s))
        lanes.append(lane)
    sweep(ctx, f"draft head sweep, auto K, heads {[head.label for head in heads]}", lanes)
    return Sweep(ctx.sweep_tokens, heads)


def run_precision(ctx: Context) -> Sweep:
    """Every draft precision with every target precision; each speedup is over the same target alone, measured back to
    back with it. One target is held at a time beside the bench's pair, the drafts throughout: all four targets and
    three drafts held at once took 14 GiB of anonymous memory (2-core AMX Xeon), where the bench keeps within 8."""
    drafts = {precision: _loaded(ctx, "draft", precision) for precision in kernels.runnable(ctx.bench.draft_precisions)}
    rows = []
    for tp in kernels.runnable(ctx.bench.target_precisions):
        rows += _sweep_target(ctx, tp, drafts)  # its compile is let go on return, before the next one's
        gc.collect()
    return Sweep(ctx.sweep_tokens, rows, ctx.generation.k_policy.k, ctx.k_label())


def _sweep_target(ctx: Context, precision: str, drafts: dict) -> list[Pair]:
    """One target precision alone, then with each draft in `drafts` ({precision: LoadedModel}): the sweep's rows."""
    generation, target = ctx.generation, _loaded(ctx, "target", precision)
    ar = our_lane(f"target {precision} autoregressive", Engine(target, None), AUTOREGRESSIVE, generation)
    lanes, pairs = [ar], []
    for dp, draft in drafts.items():
        lanes.append(our_lane(f"target {precision} + draft {dp}", Engine(target, draft), SPECULATIVE, generation,
                              baseline=ar, reference=ar))
        pairs.append(Pair(lanes[-1].label, precision, dp, draft.describe().size_on_disk_bytes))
    sweep(ctx, f"precision sweep, target {precision}, {generation.k_policy.describe()}, {len(pairs)} pairs", lanes)
    return pairs


def _loaded(ctx: Context, role: str, precision: str):
    """The engine's `role` model ("target", "draft") at `precision`: its own, or loaded (converted on first use)."""
    if precision == (ours := getattr(ctx.engine, role)).settings.precision:
        return ours
    ctx.log(f"loading the {role} at {precision} (converted once on first use, ~2 min)")
    return load_model(replace(getattr(ctx.settings, role), precision=precision), log_progress(ctx.log, role))


def run_kv(ctx: Context) -> Sweep:
    """KV cache precision of both models: time, acceptance and cache bytes."""
    generation = ctx.generation
    target, draft = ctx.engine.target.settings, ctx.engine.draft.settings  # as loaded: precisions and tune resolved
    lanes, precisions = [], []
    for kv in ctx.bench.kv_cache_precisions:
        if kv == target.kv_cache_precision:
            engine = ctx.engine
        else:
            ctx.log(f"compiling both models with KV cache precision {kv or 'default'}")
            engine = Engine(load_model(replace(target, kv_cache_precision=kv)),
                            load_model(replace(draft, kv_cache_precision=kv)))
        label = engine.target.runtime.kv_cache_precision + ("" if kv else " (default)")
        ar = our_lane(f"KV {label} autoregressive", engine, AUTOREGRESSIVE, generation)
        spec = our_lane(f"KV {label} speculative", engine, SPECULATIVE, generation, baseline=ar, reference=ar)
        lanes += [ar, spec]
        precisions.append(KvCache(spec.label, label))
    sweep(ctx, f"KV cache precision sweep, {generation.k_policy.describe()}, {len(precisions)} precisions", lanes)
    return Sweep(ctx.sweep_tokens, precisions, generation.k_policy.k, ctx.k_label())


def run_lookup(ctx: Context) -> Sweep:
    """Prompt lookup vs the draft model on edits that repeat their input; GenAI's prompt lookup beside."""
    generation = ctx.generation
    ar = our_lane("ours autoregressive", ctx.engine, AUTOREGRESSIVE, generation)
    lookup = replace(ctx.fixed(ctx.k), drafter=with_counterpart("lookup").name)
    planner = replace(generation, k_policy=KPolicy.auto(generation.k_max))
    genai_ar = ctx.genai_lane("GenAI autoregressive", "plain")
    lanes = [ar, our_lane("ours draft model", ctx.engine, SPECULATIVE, ctx.fixed(ctx.k), baseline=ar),
             our_lane("ours prompt lookup", ctx.engine, SPECULATIVE, lookup, baseline=ar),
             our_lane("ours planner (auto)", ctx.engine, SPECULATIVE, planner, baseline=ar),
             genai_ar, ctx.genai_lane("GenAI prompt lookup", "lookup", baseline=genai_ar)]
    sweep(ctx, f"prompt lookup vs draft model, K={ctx.k}, edit instructions", lanes,
          EDIT_INSTRUCTIONS[: ctx.bench.lookup_instructions])
    return Sweep(ctx.sweep_tokens, [], k=ctx.k)  # its lanes are all the table's
