"""`python -m specdemo bench`: one run that measures speedup over autoregressive decoding beside its peers.

Its sections, in the order they run, are settings.REGISTRY (BenchSettings.sections picks some); what each measures
is its runner's docstring (for users: docs/benchmarks-guide.md). The method is the report's last section
(report_tables.method_section); the modules are in docs/modules.md. A new section is one module (its runner, its report
part, any plot), one line in settings.REGISTRY and its field in schema.Sections.

May import: the page (specdemo.ui: the watching section measures it) and what serves it (specdemo.serve), the run and
everything below it; never the command line.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import fields, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from specdemo import strict_json
from specdemo.bench.settings import BY_NAME, BenchSettings, CODE_INSTRUCTIONS, FULL, QUICK, SECTIONS, check_generation
from specdemo.host import machine
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.lane import drain
from specdemo.settings import RunSettings

# The measuring modules are imported in run(), not here, so `import specdemo.bench` stays light (the
# CLI's argument parsing needs only the settings).

__all__ = ["FULL", "QUICK", "SECTIONS", "BenchSettings", "check_generation", "found", "plain", "run", "write"]


def found(ref: str) -> Callable:
    """The function a REGISTRY entry names as "module:function", its module imported now (".x" is specdemo.bench.x)."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module, __name__), function)


def run(settings: RunSettings, bench: BenchSettings, out: Path | None, log: Callable[[str], None], command: str = "") -> dict:
    """The whole benchmark: load and warm up the pair in `settings`, run `bench.sections`,
    judge the targets, and write the report, JSON and plots into `out` (None: write nothing).
    `command` is recorded for the report's "reproduce" line. Returns the results as JSON holds them, with the sample
    run (schema.Results). Raises ValueError for settings the benchmark cannot measure."""
    from specdemo.bench.harness import Context
    from specdemo.bench.memory import room_for, section_need
    from specdemo.bench.schema import Results, Sections
    from specdemo.bench.targets import judge_targets
    from specdemo.run.engine import Engine

    check_generation(settings.generation)
    # A faithful target is measured at the layout this machine runs (the sections compare it with other precisions).
    settings = replace(settings, target=machine_profile().resolve_precision(settings.target))
    started, host, sections, skipped = time.perf_counter(), machine.describe(), {}, []
    begun = datetime.now(timezone.utc).isoformat(timespec="seconds")
    log(f"load average {host.load_average} on {host.logical_cores} cores")
    engine = Engine.load(settings)
    # Always measured afresh: the report's cost curve and plan must come from this run's machine state.
    engine.warm_up(settings.generation.k_max, fresh=True, log=lambda m: log(f"warm-up: {m}"))
    log(f"warm-up {engine.warm_up_s:.1f} s. {engine.costs.sentence()}")
    models = {"target": engine.target.describe(), "draft": engine.draft.describe()}
    tune = machine_profile().tune_record(settings.draft)  # the compile settings and draft they were loaded under
    costs = engine.costs  # CostModel: frozen, so the run's corrections leave it as measured
    plan = engine.plan(CODE_INSTRUCTIONS[0], settings.generation)
    log(plan.reason)
    ctx = Context(engine, settings, bench, log, plan.first_k, machine=machine.cpu_name())
    sample = sample_run(engine, settings, CODE_INSTRUCTIONS[0])
    log("a sample side-by-side run of the first code instruction, as `generate --json` writes it: run.json")
    weights = [sources.weights_bytes(model.settings) for model in (engine.target, engine.draft)]
    for name in bench.sections:
        section_start, ctx.section = time.perf_counter(), name
        log(f"== {name}")
        if not room_for(section_need(name, *weights, bench.genai_k_values), f"the {name} section", log):
            skipped.append(name)  # the report leaves it out, as if not asked
            continue
        figures = found(BY_NAME[name].run)(ctx)  # schema.Figures
        sections[name] = replace(figures, seconds=time.perf_counter() - section_start,
                                 load_average_end=machine.load_average())
        # GenAI's copies of the models go with their section: the next section's memory need counts only its own.
        ctx.drop_genai()
    ran = Sections(**sections)
    results = Results(command, begun, host, bench, settings, ran, models=models, tune=tune, costs=costs,
                      warm_up_s=engine.warm_up_s, plan=plan, sample_run=sample, skipped_for_memory=skipped,
                      costs_end=engine.costs, runs=ctx.runs, targets=judge_targets(ran, ctx.runs),
                      seconds=time.perf_counter() - started, load_average_end=machine.load_average())
    if out is not None:
        write(results, out, log)
    return {**plain(results), "sample_run": sample}


def sample_run(engine, settings: RunSettings, instruction: str) -> dict | None:
    """Both our lanes on one instruction through the run's one owner (specdemo/run/sidebyside.py), its record as
    `generate --json` writes it (None if a lane did not finish): what `show` renders beside the tables."""
    from specdemo.run.sidebyside import SideBySide

    side = SideBySide({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, instruction, settings)
    side.prepare()
    record = side.finish({mode: drain(side.lane(mode)) for mode in side.engines})
    return record.to_json() if record.finished else None


def plain(value):
    """`value` with each dataclass in it (stats.Spread) as its dict of fields, or its to_json's where it has one, at any
    depth: the results as JSON holds them."""
    if hasattr(value, "to_json"):
        return plain(value.to_json())
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if isinstance(value, (list, tuple)) else value


def write(results, out: Path, log: Callable[[str], None]) -> None:
    """benchmarks.json, the sample run's run.json (`show` renders it), the PNG plots and benchmarks.md (which links
    the plots) into `out` (results: schema.Results)."""
    from specdemo.bench import plots, report

    out.mkdir(parents=True, exist_ok=True)
    if results.sample_run is not None:
        (out / "run.json").write_text(strict_json.dumps(results.sample_run, ensure_ascii=False))
    (out / "benchmarks.json").write_text(strict_json.dumps(plain(results), indent=1, default=str))
    drawn = plots.draw(results, out)
    (out / "benchmarks.md").write_text(report.render(results, drawn))
    log(f"wrote {out / 'benchmarks.md'}, {out / 'benchmarks.json'} and {len(drawn)} plots")
