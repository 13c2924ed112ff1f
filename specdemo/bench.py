"""`python -m specdemo bench`: one command that measures speculative decoding against its peers.

Sections, in the order they run (--only picks some):
- paper:        autoregressive vs speculative at N = 40 and 100 new tokens, beside the paper's figures
                (Dolly v2 12B target / 3B draft), with OpenVINO GenAI's own pipelines in the same loop,
                and where our speculative loop's wall time goes;
- k:            K = 1..8 fixed and adaptive: acceptance alpha, cost ratio c, Leviathan's prediction
                (1 - alpha^(K+1)) / ((1 - alpha)(cK + 1)) and the measured speedup; GenAI at some K;
- lookup:       prompt lookup vs the draft model on edits, where the output repeats the input;
- transformers: transformers generate() and assisted generation on the same weights, same prompts;
- precision:    draft int4 / int8 / fp16 x target int8 / int4;
- kv:           KV cache precision;
- memory:       peak RSS and KV cache bytes, autoregressive vs speculative, each in its own process.

Method: every lane is warmed up first (compilation, first-call allocations); then for each
instruction every lane of a section runs back to back, so the shared machine's noise hits them
alike; ratios are taken per instruction and summarised as median with min-max. Output: a markdown
report, a JSON file and PNG plots in --out.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from specdemo import bench_stats as stats
from specdemo import machine, sources
from specdemo.bench_stats import Run
from specdemo.events import Summary, drain
from specdemo.settings import GenerationSettings, ModelSettings, RunSettings

CODE_INSTRUCTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that performs binary search on a sorted list.",
]

# Edits whose answer repeats most of the input: where prompt lookup finds its drafts.
_SNIPPET = '''def average(values):
    total = 0
    count = 0
    for value in values:
        total = total + value
        count = count + 1
    if count == 0:
        return 0
    return total / count


def largest(values):
    best = values[0]
    for value in values:
        if value > best:
            best = value
    return best
'''
EDIT_INSTRUCTIONS = [
    f"Add type hints to both functions. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
    f"Rename the parameter `values` to `numbers` everywhere. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
    f"Add a one-line docstring to each function. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
]

# The paper's measurements: new tokens N -> (autoregressive s, speculative s), Dolly v2 12B target, 3B draft.
PAPER = {40: (19.87, 13.61), 100: (44.25, 26.97)}

SECTIONS = ("paper", "k", "vocab", "lookup", "transformers", "precision", "kv", "memory")  # in the order they run
_USES_GENAI = {"paper", "k", "lookup"}

# The targets: what "as fast as the best" means here.
TARGET_GENAI_RATIO = 1.0  # our speculative time / GenAI's C++ speculative time, at most
TARGET_SPEEDUP = 2.0  # speculative over autoregressive on code instructions, at least
TARGET_TRANSFORMERS = 3.0  # transformers assisted time / our speculative time, at least
TARGET_OVERHEAD = 0.05  # our loop's time outside model calls and rollbacks, at most (share of wall)
TARGET_AUTO_SPEEDUP = 2.2  # auto K over autoregressive on an AVX-512/AMX CPU (issue 8; 1.3 on an AVX2-only CPU)
TARGET_PREDICTION_ERROR = 0.10  # predicted vs measured speedup, per instruction median


@dataclass(frozen=True)
class BenchSettings:
    """What one bench run measures. QUICK and FULL are the two presets."""

    mode: str = "full"  # a name for the report
    instructions: int = 5  # code instructions per section (the first n of CODE_INSTRUCTIONS)
    repeats: int = 1  # passes over the instructions after the warm-up
    paper_tokens: tuple[int, ...] = (40, 100)  # N of the paper experiment
    sweep_tokens: int = 100  # N of the sweeps (capped by --max-new-tokens)
    k_values: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # fixed K of the sweep, plus adaptive and auto
    head_tokens: tuple[int, ...] = (8000, 16000, 32000, 64000, 0)  # draft LM head sizes of the vocab section (0 = full)
    genai_k_values: tuple[int, ...] = (2, 4, 6, 8)  # K at which GenAI's speculative pipeline joins the sweep
    genai_defaults_instructions: int = 3  # a pass with GenAI on its own compile defaults (0 = none)
    target_precisions: tuple[str, ...] = ("int8", "int4")
    draft_precisions: tuple[str, ...] = ("int4", "int8", "fp16")
    kv_cache_precisions: tuple[str, ...] = ("u8", "f16", "")  # "" = our default (f32 on CPU)
    transformers_instructions: int = 3  # transformers is slow on CPU: fewer instructions
    transformers_tokens: int = 40
    lookup_instructions: int = 3  # of EDIT_INSTRUCTIONS
    warmup_tokens: int = 16  # tokens of each lane's warm-up run
    sections: tuple[str, ...] = SECTIONS

    def __post_init__(self):
        unknown = set(self.sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown bench section {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
        if not 1 <= self.instructions <= len(CODE_INSTRUCTIONS):
            raise ValueError(f"instructions must be between 1 and {len(CODE_INSTRUCTIONS)}, got {self.instructions}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")


FULL = BenchSettings()
# A couple of minutes: the default pair only (no conversions), two instructions, short outputs.
QUICK = BenchSettings(
    mode="quick",
    instructions=2,
    paper_tokens=(40,),
    sweep_tokens=40,
    k_values=(1, 2, 4, 8),
    head_tokens=(16000, 0),
    genai_k_values=(),
    genai_defaults_instructions=0,
    target_precisions=(),
    draft_precisions=(),
    kv_cache_precisions=(),
    transformers_instructions=1,
    transformers_tokens=16,
    lookup_instructions=1,
    sections=tuple(s for s in SECTIONS if s not in ("precision", "kv", "memory")),
)


# ---- lanes: one way of generating, measured the same way as every other


@dataclass
class Lane:
    name: str
    run: Callable[[str, list[int], int], Run]  # (instruction, prompt ids, max new tokens) -> Run
    reference: str | None = None  # lane whose token ids this lane should reproduce; None = the section's first


def our_lane(name: str, engine, mode: str, generation: GenerationSettings, reference: str | None = None) -> Lane:
    """specdemo's autoregressive or speculative loop, timed from the call to the last event."""

    def run(instruction: str, prompt_ids: list[int], n: int) -> Run:
        settings = replace(generation, max_new_tokens=n)
        start = time.perf_counter()
        result = drain(getattr(engine, mode)(instruction, settings))
        ids, summary = result.ids, result.summary
        wall = time.perf_counter() - start
        return Run(name, 0, 0, n, wall, len(ids), summary=summary.to_dict(), ids=ids)

    return Lane(name, run, reference)


def peer_lane(name: str, generate: Callable, reference: str | None = None, **options) -> Lane:
    """A peer's generate(prompt_ids, max_new_tokens, **options) -> PeerRun, as a lane."""

    def run(instruction: str, prompt_ids: list[int], n: int) -> Run:
        peer = generate(prompt_ids, n, **options)
        summary = {"proposed": peer.proposed, "accepted": peer.accepted} if peer.proposed else {}
        return Run(name, 0, 0, n, peer.wall_s, len(peer.ids), summary=summary, ids=peer.ids)

    return Lane(name, run, reference)


def measure(lanes: list[Lane], instructions: list[str], prompts: list[list[int]], n: int, bench: BenchSettings, log) -> list[Run]:
    """Warm every lane up, then run all lanes back to back on each instruction, `bench.repeats` times."""
    for lane in lanes:
        lane.run(instructions[0], prompts[0], min(n, bench.warmup_tokens))
    runs = []
    total = bench.repeats * len(instructions)
    for r in range(bench.repeats):
        for i, (instruction, prompt) in enumerate(zip(instructions, prompts)):
            ids_of: dict[str, list[int]] = {}
            line = []
            for lane in lanes:
                run = lane.run(instruction, prompt, n)
                run.instruction, run.repeat = i, r
                ids_of[lane.name] = run.ids
                run.same_as_reference = run.ids == ids_of[lane.reference or lanes[0].name]
                runs.append(run)
                line.append(f"{lane.name} {run.wall_s:.2f}s")
            log(f"  [{r * len(instructions) + i + 1}/{total}] N={n}: " + ", ".join(line))
    return runs


# ---- the sections


GENAI_PIPELINES = 2  # GenAI pipelines kept loaded at once


@dataclass
class Context:
    """What every section needs: the loaded default pair, the settings, and where to log."""

    engine: object  # specdemo.engine.Engine with the default pair
    settings: RunSettings
    bench: BenchSettings
    log: Callable[[str], None]
    genai: OrderedDict = field(default_factory=OrderedDict)  # GenAI pipelines by name, least recently used first

    @property
    def generation(self) -> GenerationSettings:
        return self.settings.generation

    @property
    def k(self) -> int:
        """The K of fixed-K lanes and of GenAI's pipeline: the flag's K, or the planner's first K when auto."""
        if not self.generation.k_auto:
            return self.generation.k
        plan = self.engine.plan(CODE_INSTRUCTIONS[0], self.generation)
        return plan.k or self.generation.k

    def k_label(self, peers: bool = False) -> str:
        """How our lanes chose K in a section that runs the run's own settings ("auto K" or "K = 4")."""
        ours = "auto K (the planner's choice each round)" if self.generation.k_auto else f"K = {self.generation.k}"
        return f"ours {ours}, GenAI K = {self.k}" if peers and self.generation.k_auto else ours

    def fixed(self, k: int) -> GenerationSettings:
        """The run's generation settings with a fixed K."""
        return replace(self.generation, k=k, k_auto=False, adaptive=False)

    @property
    def eos_ids(self) -> set[int]:
        return self.engine.eos_ids

    def code_instructions(self, count: int | None = None) -> tuple[list[str], list[list[int]]]:
        instructions = CODE_INSTRUCTIONS[: count or self.bench.instructions]
        return instructions, self.prompts(instructions)

    def prompts(self, instructions: list[str]) -> list[list[int]]:
        return [self.engine.prompt_ids(text, self.generation) for text in instructions]

    def genai_pipeline(self, name: str):
        """GenAI pipelines on our IR folders: "plain", "speculative", "lookup", and "... (defaults)".

        Each holds its own copy of the target (~3 GiB RSS here), so at most GENAI_PIPELINES stay
        loaded; loading another drops the least recently used one.
        """
        if name in self.genai:
            self.genai.move_to_end(name)
        else:
            from specdemo.bench_peers import GenAIPipeline, compile_properties

            while len(self.genai) >= GENAI_PIPELINES:
                self.genai.popitem(last=False)
                gc.collect()

            target, draft = self.engine.target, self.engine.draft
            own_defaults = name.endswith("(defaults)")
            properties = {} if own_defaults else compile_properties(target.settings)
            kind = name.split()[0]
            self.log(f"loading OpenVINO GenAI pipeline: {name}")
            self.genai[name] = GenAIPipeline(
                target.folder,
                target.settings.device,
                properties,
                draft=draft.folder if kind == "speculative" else None,
                draft_device=draft.settings.device if draft else "",
                prompt_lookup=kind == "lookup",
            )
        return self.genai[name]

    def genai_lane(self, lane: str, pipeline: str, k: int | None = None) -> Lane:
        generate = self.genai_pipeline(pipeline).generate
        return peer_lane(lane, generate, eos_ids=self.eos_ids, k=k or self.k, ngram=self.generation.lookup_ngram)


def run_paper(ctx: Context) -> dict:
    """Autoregressive vs speculative at the paper's N, with GenAI's pipelines in the same loop.

    Then, if asked, a shorter pass with GenAI on its own compile defaults instead of ours.
    """
    generation, k = ctx.generation, ctx.k
    ours = [
        our_lane("ours autoregressive", ctx.engine, "autoregressive", generation),
        our_lane("ours speculative", ctx.engine, "speculative", generation),
    ]
    lanes = ours + [ctx.genai_lane("GenAI autoregressive", "plain"), ctx.genai_lane("GenAI speculative", "speculative")]
    instructions, prompts = ctx.code_instructions()
    by_n = {}
    for n in ctx.bench.paper_tokens:
        ctx.log(f"paper: N={n}, K={k}, {len(lanes)} lanes")
        runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
        by_n[str(n)] = paper_figures(runs, n)
    figures = {"k": k, "k_label": ctx.k_label(peers=True), "k_auto": generation.k_auto, "adaptive": generation.adaptive,
               "by_tokens": by_n}
    if ctx.bench.genai_defaults_instructions:
        n = max(ctx.bench.paper_tokens)
        del lanes  # let the pipelines above go before two more copies of the target load
        lanes = ours + [
            ctx.genai_lane("GenAI autoregressive (its defaults)", "plain (defaults)"),
            ctx.genai_lane("GenAI speculative (its defaults)", "speculative (defaults)"),
        ]
        instructions, prompts = ctx.code_instructions(ctx.bench.genai_defaults_instructions)
        ctx.log(f"paper: GenAI on its own compile defaults, N={n}")
        runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
        figures["genai_defaults"] = {"max_new_tokens": n, **paper_figures(runs, n)}
    return figures


def paper_figures(runs: list[Run], n: int) -> dict:
    lanes = list(dict.fromkeys(r.lane for r in runs))
    spec = stats.lane_runs(runs, "ours speculative")
    ar = stats.lane_runs(runs, "ours autoregressive")
    figures = {
        "lanes": {lane: stats.lane_figures(runs, lane) for lane in lanes},
        "speedup": {},
        "ratios": {},
        "speculative": stats.speculative_figures(spec),
        "genai_acceptance": {},
        "time_shares": {"ours speculative": stats.time_shares(spec), "ours autoregressive": stats.time_shares(ar)},
        "autoregressive_step_s": stats.step_seconds(ar),
        "runs": [r.to_dict() for r in runs],
    }
    for lane in lanes:
        if "speculative" in lane:
            plain = lane.replace("speculative", "autoregressive")
            figures["speedup"][lane] = stats.spread(stats.paired_ratios(runs, plain, lane))
            peer = stats.lane_runs(runs, lane)
            proposed = sum(r.summary.get("proposed", 0) for r in peer)
            if lane.startswith("GenAI") and proposed:
                figures["genai_acceptance"][lane] = sum(r.summary.get("accepted", 0) for r in peer) / proposed
        if lane.startswith("GenAI"):
            ours = "ours speculative" if "speculative" in lane else "ours autoregressive"
            figures["ratios"][f"{ours} / {lane}"] = stats.spread(stats.paired_ratios(runs, ours, lane))
    if n in PAPER:
        paper_ar, paper_spec = PAPER[n]
        figures["paper"] = {"autoregressive_s": paper_ar, "speculative_s": paper_spec, "speedup": paper_ar / paper_spec}
    return figures


def run_transformers(ctx: Context) -> dict:
    """transformers generate() and assisted generation beside ours, same prompts, same K."""
    from specdemo import bench_peers
    from specdemo.disk import size

    missing = [m for m in (ctx.engine.target, ctx.engine.draft) if bench_peers.hf_weights_missing(m.settings.source)]
    if missing:  # say what it costs on disk before writing it
        need = sum(m.describe()["parameters"] * 4 for m in missing)
        ctx.log(f"transformers runs on float32 copies of the weights: about {size(need)} more under "
                f"{sources.specdemo_home() / 'bench' / 'hf'} (python -m specdemo clean --remove bench frees it)")
    target_hf = bench_peers.hf_weights(ctx.settings.target.source, _log_progress(ctx.log, "dequantizing target"))
    draft_hf = bench_peers.hf_weights(ctx.settings.draft.source, _log_progress(ctx.log, "dequantizing draft"))
    if target_hf is None or draft_hf is None:
        return {"skipped": "transformers needs the Hugging Face weights: use preset models or local Hugging Face folders"}
    ctx.log(f"loading transformers models (float32) from {target_hf.parent}")
    pair = bench_peers.TransformersPair(target_hf, draft_hf)
    generation, k, n = ctx.generation, ctx.k, min(ctx.bench.transformers_tokens, ctx.generation.max_new_tokens)
    lanes = [
        our_lane("ours autoregressive", ctx.engine, "autoregressive", generation),
        our_lane("ours speculative", ctx.engine, "speculative", generation),
        peer_lane("transformers autoregressive", pair.generate, eos_ids=ctx.eos_ids),
        peer_lane("transformers assisted", pair.generate, reference="transformers autoregressive", eos_ids=ctx.eos_ids, k=k),
    ]
    instructions, prompts = ctx.code_instructions(ctx.bench.transformers_instructions)
    ctx.log(f"transformers: N={n}, K={k}, {len(instructions)} instructions")
    runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
    return {
        "k": k,
        "max_new_tokens": n,
        "dtype": "float32",
        "lanes": {lane.name: stats.lane_figures(runs, lane.name) for lane in lanes},
        "ratios": {
            "transformers assisted / ours speculative": stats.spread(stats.paired_ratios(runs, "transformers assisted", "ours speculative")),
            "transformers autoregressive / ours autoregressive": stats.spread(
                stats.paired_ratios(runs, "transformers autoregressive", "ours autoregressive")
            ),
        },
        "speedup": {
            "ours": stats.spread(stats.paired_ratios(runs, "ours autoregressive", "ours speculative")),
            "transformers": stats.spread(stats.paired_ratios(runs, "transformers autoregressive", "transformers assisted")),
        },
        "runs": [r.to_dict() for r in runs],
    }


def run_k(ctx: Context) -> dict:
    """Fixed K = 1..8 and adaptive K against one autoregressive reference; GenAI at a few K."""
    generation = ctx.generation
    lanes = [our_lane("autoregressive", ctx.engine, "autoregressive", generation)]
    for k in ctx.bench.k_values:
        lanes.append(our_lane(f"K={k}", ctx.engine, "speculative", ctx.fixed(k)))
    adaptive = replace(ctx.fixed(min(max(generation.k, 1), 8)), adaptive=True, k_min=1, k_max=8)
    lanes.append(our_lane("adaptive K", ctx.engine, "speculative", adaptive))
    lanes.append(our_lane("auto K", ctx.engine, "speculative", replace(generation, k_auto=True, adaptive=False, k_max=8)))
    if ctx.bench.genai_k_values:
        lanes.append(ctx.genai_lane("GenAI autoregressive", "plain"))
        lanes += [ctx.genai_lane(f"GenAI K={k}", "speculative", k=k) for k in ctx.bench.genai_k_values]
    n = min(ctx.bench.sweep_tokens, generation.max_new_tokens)
    instructions, prompts = ctx.code_instructions()
    ctx.log(f"K sweep: N={n}, K in {list(ctx.bench.k_values)}, adaptive and auto")
    runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
    rows = []
    for lane in lanes[1:]:
        if lane.name.startswith("GenAI"):
            continue
        row = {"label": lane.name, **sweep_row(runs, "autoregressive", lane.name)}
        genai = f"GenAI {lane.name}"
        if stats.lane_runs(runs, genai):
            row["genai_speedup"] = stats.spread(stats.paired_ratios(runs, "GenAI autoregressive", genai))
            row["ours_over_genai"] = stats.spread(stats.paired_ratios(runs, lane.name, genai))
        rows.append(row)
    return {"max_new_tokens": n, "rows": rows, "runs": [r.to_dict() for r in runs]}


def sweep_row(runs: list[Run], reference: str, lane: str) -> dict:
    """One sweep configuration: alpha, c, Leviathan's prediction and the measured speedup over `reference`."""
    mine = stats.lane_runs(runs, lane)
    return {
        **stats.speculative_figures(mine),
        "measured_speedup": stats.spread(stats.paired_ratios(runs, reference, lane)),
        "per_token_s": stats.spread([r.per_token_s for r in mine]),
        "reference_per_token_s": stats.spread([r.per_token_s for r in stats.lane_runs(runs, reference)]),
        "same_as_reference": stats.lane_figures(runs, lane)["same_as_reference"],
        "prediction_error": stats.spread(stats.prediction_errors(runs, reference, lane)),
    }


def run_precision(ctx: Context) -> dict:
    """Every draft precision with every target precision; each speedup is over the same target alone."""
    from specdemo.engine import Engine

    models = _models_by_precision(ctx)
    generation = ctx.generation
    lanes, pairs = [], []
    for tp in ctx.bench.target_precisions:
        target = models[("target", tp)]
        ar = f"target {tp} autoregressive"
        lanes.append(our_lane(ar, Engine(target, None), "autoregressive", generation))
        for dp in ctx.bench.draft_precisions:
            name = f"target {tp} + draft {dp}"
            lanes.append(our_lane(name, Engine(target, models[("draft", dp)]), "speculative", generation, reference=ar))
            pairs.append((tp, dp, ar, name))
    n = min(ctx.bench.sweep_tokens, generation.max_new_tokens)
    instructions, prompts = ctx.code_instructions()
    ctx.log(f"precision sweep: N={n}, K={generation.k}, {len(pairs)} pairs")
    runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
    rows = []
    for tp, dp, ar, name in pairs:
        draft = models[("draft", dp)]
        rows.append({"target": tp, "draft": dp, "draft_bytes": draft.describe()["size_on_disk_bytes"], **sweep_row(runs, ar, name)})
    return {"max_new_tokens": n, "k": generation.k, "k_label": ctx.k_label(), "rows": rows, "runs": [r.to_dict() for r in runs]}


def _models_by_precision(ctx: Context) -> dict:
    """("target"|"draft", precision) -> LoadedModel, reusing the engine's own and converting on first use."""
    from specdemo.engine import load_model

    models = {("target", ctx.engine.target.settings.precision): ctx.engine.target, ("draft", ctx.engine.draft.settings.precision): ctx.engine.draft}
    for role, precisions, base in (
        ("target", ctx.bench.target_precisions, ctx.settings.target),
        ("draft", ctx.bench.draft_precisions, ctx.settings.draft),
    ):
        for precision in precisions:
            if (role, precision) not in models:
                ctx.log(f"loading the {role} at {precision} (converted once on first use, ~2 min)")
                models[(role, precision)] = load_model(replace(base, precision=precision), _log_progress(ctx.log, role))
    return models


def run_kv(ctx: Context) -> dict:
    """KV cache precision of both models: time, acceptance and cache bytes."""
    from specdemo.engine import Engine, load_model

    generation = ctx.generation
    lanes, groups = [], []
    for kv in ctx.bench.kv_cache_precisions:
        if kv == ctx.settings.target.kv_cache_precision:
            engine = ctx.engine
        else:
            ctx.log(f"compiling both models with KV cache precision {kv or 'default'}")
            engine = Engine(
                load_model(replace(ctx.settings.target, kv_cache_precision=kv)),
                load_model(replace(ctx.settings.draft, kv_cache_precision=kv)),
            )
        label = engine.target.runtime.kv_cache_precision + ("" if kv else " (default)")
        ar, spec = f"KV {label} autoregressive", f"KV {label} speculative"
        lanes += [our_lane(ar, engine, "autoregressive", generation), our_lane(spec, engine, "speculative", generation, reference=ar)]
        groups.append((label, ar, spec))
    n = min(ctx.bench.sweep_tokens, generation.max_new_tokens)
    instructions, prompts = ctx.code_instructions()
    ctx.log(f"KV cache precision sweep: N={n}, K={generation.k}, {len(groups)} precisions")
    runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
    rows = []
    for label, ar, spec in groups:
        spec_runs = stats.lane_runs(runs, spec)
        kv_bytes = [sum(r.summary["kv_cache_bytes"].values()) for r in spec_runs]
        rows.append(
            {
                "kv_cache_precision": label,
                **sweep_row(runs, ar, spec),
                "autoregressive_step_s": stats.step_seconds(stats.lane_runs(runs, ar)),
                "kv_cache_bytes": stats.spread([float(b) for b in kv_bytes]),
            }
        )
    return {"max_new_tokens": n, "k": generation.k, "k_label": ctx.k_label(), "rows": rows, "runs": [r.to_dict() for r in runs]}


def run_lookup(ctx: Context) -> dict:
    """Prompt lookup vs the draft model on edits that repeat their input; GenAI's prompt lookup beside."""
    generation = ctx.generation
    lookup = replace(ctx.fixed(ctx.k), drafter="prompt-lookup")
    lanes = [
        our_lane("ours autoregressive", ctx.engine, "autoregressive", generation),
        our_lane("ours draft model", ctx.engine, "speculative", ctx.fixed(ctx.k)),
        our_lane("ours prompt lookup", ctx.engine, "speculative", lookup),
        our_lane("ours planner (auto)", ctx.engine, "speculative", replace(generation, k_auto=True, adaptive=False)),
        ctx.genai_lane("GenAI autoregressive", "plain"),
        ctx.genai_lane("GenAI prompt lookup", "lookup"),
    ]
    instructions = EDIT_INSTRUCTIONS[: ctx.bench.lookup_instructions]
    n = min(ctx.bench.sweep_tokens, generation.max_new_tokens)
    ctx.log(f"prompt lookup vs draft model: N={n}, K={ctx.k}, {len(instructions)} edit instructions")
    runs = measure(lanes, instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log)
    rows = []
    for lane in lanes[1:]:
        plain = "GenAI autoregressive" if lane.name.startswith("GenAI") else "ours autoregressive"
        if lane.name == plain:
            continue
        mine = stats.lane_runs(runs, lane.name)
        row = {"label": lane.name, **sweep_row(runs, plain, lane.name)}
        if lane.name.startswith("GenAI"):
            proposed = sum(r.summary.get("proposed", 0) for r in mine)
            row["alpha"] = sum(r.summary.get("accepted", 0) for r in mine) / proposed if proposed else float("nan")
            row["vs_ours_autoregressive"] = stats.spread(stats.paired_ratios(runs, "ours autoregressive", lane.name))
        rows.append(row)
    return {"max_new_tokens": n, "k": ctx.k, "rows": rows, "runs": [r.to_dict() for r in runs]}


def run_vocab(ctx: Context) -> dict:
    """The draft's LM head trimmed to its N most frequent tokens: draft step, α̂ and speedup for each N."""
    from specdemo.engine import Engine, load_model

    generation = replace(ctx.generation, k_auto=True, adaptive=False, k_max=8)
    lanes = [our_lane("autoregressive", ctx.engine, "autoregressive", generation)]
    labels = []
    for n_head in ctx.bench.head_tokens:
        label = f"head {n_head // 1000}k" if n_head else "full head"
        if n_head == ctx.engine.draft.settings.head_tokens:
            engine = ctx.engine
        else:
            draft = load_model(replace(ctx.engine.draft.settings, head_tokens=n_head))
            engine = Engine(ctx.engine.target, draft)
            engine.warm_up(8, log=lambda m: ctx.log(f"  {label}: {m}"))
        labels.append((label, n_head, engine.draft.runtime.head_tokens, engine.costs.d(1) if engine.costs else math.nan))
        lanes.append(our_lane(label, engine, "speculative", generation))
    n = min(ctx.bench.sweep_tokens, generation.max_new_tokens)
    instructions, prompts = ctx.code_instructions()
    ctx.log(f"draft head sweep: N={n}, auto K, heads {[label for label, *_ in labels]}")
    runs = measure(lanes, instructions, prompts, n, ctx.bench, ctx.log)
    rows = [{"label": label, "head_tokens": n_head, "rows_kept": kept, "draft_step_costed_s": step,
             **sweep_row(runs, "autoregressive", label)} for label, n_head, kept, step in labels]
    return {"max_new_tokens": n, "rows": rows, "runs": [r.to_dict() for r in runs]}


def run_memory(ctx: Context) -> dict:
    """Peak RSS of a process that only decodes autoregressively vs one that decodes speculatively."""
    import subprocess

    import specdemo

    n = min(ctx.bench.sweep_tokens, ctx.generation.max_new_tokens)
    figures = {"max_new_tokens": n}
    root = str(Path(specdemo.__file__).resolve().parent.parent)
    for mode in ("autoregressive", "speculative"):
        ctx.log(f"memory: {mode} in a fresh process")
        # A fresh process per mode: RSS never shrinks back, and one process holding both models
        # would charge the draft to autoregressive decoding too.
        request = json.dumps({"settings": asdict(ctx.settings), "mode": mode, "instruction": CODE_INSTRUCTIONS[0], "n": n})
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from specdemo import bench; bench.memory_child(sys.argv[1])", request],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))},
        )
        if child.returncode != 0:
            raise RuntimeError(f"the {mode} memory probe failed:\n{child.stderr[-2000:]}")
        figures[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    return figures


def memory_child(request: str) -> None:
    """The memory probe's process: measure, then print one JSON line on stdout."""
    r = json.loads(request)
    s = r["settings"]
    settings = RunSettings(ModelSettings(**s["target"]), ModelSettings(**s["draft"]), GenerationSettings(**s["generation"]))
    print(json.dumps(measure_memory(settings, r["mode"], r["instruction"], r["n"])))


def measure_memory(settings: RunSettings, mode: str, instruction: str, n: int) -> dict:
    """In this process: load, warm up, generate `n` tokens, sampling RSS every 5 ms throughout (bytes).

    Sampled rather than read from getrusage: on Linux a child inherits its parent's peak RSS.
    """
    import threading

    import psutil

    from specdemo.engine import Engine

    process = psutil.Process()
    peak = {"process": 0, "generating": 0}
    done = threading.Event()

    def sample():
        while not done.wait(0.005):
            rss = process.memory_info().rss
            peak["process"] = max(peak["process"], rss)
            peak["generating"] = max(peak["generating"], rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        engine = Engine.load(settings, with_draft=mode == "speculative")
        generation = replace(settings.generation, max_new_tokens=n)
        drain(getattr(engine, mode)(instruction, replace(generation, max_new_tokens=8)))
        loaded = process.memory_info().rss
        peak["generating"] = loaded
        summary = drain(getattr(engine, mode)(instruction, generation)).summary
    finally:
        done.set()
        sampler.join()
    memory = process.memory_info()
    return {
        "rss_loaded_bytes": loaded,  # after loading and a short warm-up
        "peak_rss_generating_bytes": peak["generating"],
        "peak_rss_process_bytes": peak["process"],  # loading and compiling included
        # RSS counts the memory-mapped IR weights too (file pages the kernel may drop); this does not.
        "private_bytes": memory.rss - memory.shared,
        "kv_cache_bytes": summary.kv_cache_bytes,
        "tokens": summary.tokens,
    }


_RUNNERS = {
    "paper": run_paper,
    "transformers": run_transformers,
    "k": run_k,
    "vocab": run_vocab,
    "precision": run_precision,
    "kv": run_kv,
    "lookup": run_lookup,
    "memory": run_memory,
}


def _log_progress(log, what: str):
    """A sources.Progress that logs each new message once."""
    seen = set()

    def report(fraction: float, message: str) -> None:
        if message not in seen:
            seen.add(message)
            log(f"  {what}: {message}")

    return report


# ---- targets: the goals, judged on this run's figures


def judge_targets(sections: dict) -> list[dict]:
    """Each target: what it asks, what we measured, met or not, and by how much."""
    targets = []
    paper = sections.get("paper", {}).get("by_tokens", {})
    if paper:
        longest = paper[max(paper, key=int)]
        n = max(paper, key=int)
        ratio = longest["ratios"].get("ours speculative / GenAI speculative")
        if ratio:
            targets.append(_target("our speculative / GenAI speculative time", f"N={n}", ratio["median"], TARGET_GENAI_RATIO, "≤"))
        speedup = longest["speedup"]["ours speculative"]["median"]
        targets.append(_target("speculative speedup over autoregressive (code)", f"N={n}", speedup, TARGET_SPEEDUP, "≥"))
        overhead = longest["time_shares"]["ours speculative"]["our Python"]
        targets.append(_target("our loop's share of wall time outside model calls", f"N={n}", overhead, TARGET_OVERHEAD, "≤", "share"))
    k_rows = sections.get("k", {}).get("rows", [])
    if k_rows:
        best = max(k_rows, key=lambda row: row["measured_speedup"]["median"])
        targets.append(
            _target(
                "speculative speedup over autoregressive (code), best K",
                best["label"],
                best["measured_speedup"]["median"],
                TARGET_SPEEDUP,
                "≥",
            )
        )
    auto = next((row for row in k_rows if row["label"] == "auto K"), None)
    if auto:
        targets.append(_target("auto K speedup over autoregressive (code)", "auto K", auto["measured_speedup"]["median"],
                               TARGET_AUTO_SPEEDUP, "≥"))
        error = auto.get("prediction_error")
        if error and error["n"]:
            targets.append(_target("|predicted − measured| / measured, auto K, median", "auto K", abs(error["median"]),
                                   TARGET_PREDICTION_ERROR, "≤", "share"))
    hf = sections.get("transformers", {}).get("ratios", {}).get("transformers assisted / ours speculative")
    if hf and hf["n"]:
        where = f"N={sections['transformers']['max_new_tokens']}"
        targets.append(_target("transformers assisted time / our speculative time", where, hf["median"], TARGET_TRANSFORMERS, "≥"))
    return targets


def _target(name: str, where: str, measured: float, goal: float, sense: str, unit: str = "ratio") -> dict:
    """One judged target; gap is measured / goal - 1 (how far over or under the goal, as a fraction)."""
    met = measured <= goal if sense == "≤" else measured >= goal
    return {"target": name, "where": where, "goal": goal, "sense": sense, "unit": unit, "measured": measured, "met": met, "gap": measured / goal - 1}


# ---- the command


def add_arguments(parser) -> None:
    """The bench command's own flags (model and generation flags come from the CLI)."""
    parser.add_argument("--quick", action="store_true", help="a couple of minutes: default pair only, 2 instructions, short outputs")
    parser.add_argument("--only", default="", help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the instructions after the warm-up")
    parser.add_argument("--out", default="bench-results", help="folder for benchmarks.md, benchmarks.json and the plots")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON on stdout")


def bench_settings(args) -> BenchSettings:
    """BenchSettings from the parsed flags. Raises ValueError with a message for users."""
    preset = QUICK if args.quick else FULL
    asked = {s.strip() for s in args.only.split(",") if s.strip()}
    # In the order of SECTIONS; unknown names go last, for BenchSettings to refuse.
    sections = tuple(s for s in SECTIONS if s in asked) + tuple(sorted(asked - set(SECTIONS)))
    return replace(preset, repeats=args.repeats, sections=sections or preset.sections)


def check_generation(generation: GenerationSettings) -> None:
    """The bench compares greedy outputs token for token with its peers; refuse what would break that."""
    if not generation.greedy:
        raise ValueError("the benchmark measures greedy decoding (its peers are compared token for token); drop --temperature")
    if generation.drafter != "model":
        raise ValueError("the benchmark's speculative lanes use the draft model; prompt lookup has its own section (--only lookup)")


def main(args, settings: RunSettings) -> int:
    from specdemo.engine import Engine

    bench = bench_settings(args)
    check_generation(settings.generation)
    out = Path(args.out)
    started = time.perf_counter()
    stream = sys.stderr if args.json else sys.stdout

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=stream, flush=True)

    results = {
        "command": "python -m specdemo " + " ".join(sys.argv[1:]),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.describe(),
        "bench": asdict(bench),
        "run_settings": asdict(settings),
        "sections": {},
    }
    log(f"load average {results['machine']['load_average']} on {results['machine']['logical_cores']} cores")
    engine = Engine.load(settings)
    # Always measured afresh: the report's cost curve and plan must come from this run's machine state.
    engine.warm_up(max(8, settings.generation.k_max), fresh=True, log=lambda m: log(f"warm-up: {m}"))
    log(f"warm-up {engine.warm_up_s:.1f} s. {engine.costs.sentence()}")
    results["models"] = {"target": engine.target.describe(), "draft": engine.draft.describe()}
    results["costs"] = engine.costs.to_dict()
    results["warm_up_s"] = engine.warm_up_s
    plan = engine.plan(CODE_INSTRUCTIONS[0], settings.generation)
    results["plan"] = asdict(plan)
    log(plan.reason)
    ctx = Context(engine, settings, bench, log)
    for name in bench.sections:
        section_start = time.perf_counter()
        log(f"== {name}")
        results["sections"][name] = _RUNNERS[name](ctx)
        results["sections"][name]["seconds"] = time.perf_counter() - section_start
        results["sections"][name]["load_average_end"] = machine.load_average()
        if not _USES_GENAI & set(bench.sections[bench.sections.index(name) + 1 :]):
            ctx.genai.clear()  # free GenAI's copies of the models once no later section needs them
        gc.collect()
    results["targets"] = judge_targets(results["sections"])
    results["seconds"] = time.perf_counter() - started
    results["load_average_end"] = machine.load_average()
    write(results, out, log)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    return 0


def write(results: dict, out: Path, log) -> None:
    """benchmarks.json, the PNG plots and benchmarks.md (which links the plots) into `out`."""
    from specdemo import bench_plots, bench_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(results, indent=1, default=str))
    plots = bench_plots.draw(results, out)
    (out / "benchmarks.md").write_text(bench_report.render(results, plots))
    log(f"wrote {out / 'benchmarks.md'}, {out / 'benchmarks.json'} and {len(plots)} plots")
