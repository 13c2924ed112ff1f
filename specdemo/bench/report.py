"""The benchmark's markdown report from the results the run writes as JSON (schema.Results), pure formatting: the
opening (machine, cost curve, headlines and targets, which read several sections), each section's parts where
settings.REGISTRY places them, the method. §1 and §2 are here; the cells, tables and later sections in report_tables.py,
the GGUF files' (llama.cpp, fidelity, nodes) in report_gguf.py. Lanes are found by their fields, never their labels.
"""

from __future__ import annotations

from specdemo.bench import found, report_tables as tables, stats
from specdemo.bench.report_tables import image, k_text, ms, percent, seconds, table, times
from specdemo.bench.schema import (GENAI_AR, GENAI_SPEC, HF_SPEC, OURS_AR, OURS_SPEC, Figures, GenAICompile, Results,
                                   Sections, Skipped)
from specdemo.bench.settings import PAPER, REGISTRY, paper_speedup
from specdemo.bench.stats import COMPONENTS, PYTHON
from specdemo.bench.table import GENAI_DEFAULTS, Run
from specdemo.bench.targets import Target, fastest
from specdemo.decoding.planner import surface_sentence
from specdemo.learning.disk import size
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.metrics import speedup_from_calls


def render(results: Results, plots: dict[str, str]) -> str:
    """The whole report: its opening, every registered section's parts by their § (settings.REGISTRY), the method.
    `plots` maps a plot's name to its file name, relative to the report; the parts read the table's runs (table.py)."""
    sections, runs = results.sections, results.runs
    opening = [_header(results), _machine(results), tables.tune_section(results.tune), _costs(results, plots),
               _headlines(sections, runs), _targets(results)]
    placed = sorted((part for section in REGISTRY for part in section.report), key=lambda part: part[0])  # stable: run order
    parts = [found(part)(sections, plots, runs) for _, part in placed]
    return "\n\n".join(part for part in [*opening, *parts, tables.method_section(results)] if part) + "\n"


def _header(results: Results) -> str:
    bench, minutes = results.bench, results.seconds / 60
    return (
        "# Benchmarks\n\n"
        "Autoregressive vs speculative decoding on OpenVINO, measured by `python -m specdemo bench` beside "
        "the paper's figures, OpenVINO GenAI's own pipelines and transformers, in one run on one machine. "
        "Every figure below comes from that run; ratios were measured back to back on the same instructions.\n\n"
        f"* command: `{results.command}` ({bench.mode} mode, {minutes:.1f} min, started {results.started})\n"
        f"* load average (1, 5, 15 min) at start {results.machine.load_average}, at end {results.load_average_end}; "
        "1-minute load after each section: "
        + ", ".join(f"{name} {s.load_average_end[0]}" for name, s in results.sections.ran().items() if s.load_average_end)
        + "\n"
        "* reproduce: `python -m specdemo bench --out docs` (full, ~45 min on 2 cores, first run longer) or `python -m specdemo bench --quick` "
        "(~3 min); the raw runs are in `benchmarks.json`"
    )


def _machine(results: Results) -> str:
    m, packages = results.machine, results.machine.packages
    rows = [
        ["CPU", f"{m.cpu} ({', '.join(m.cpu_features) or 'no AVX-512'})"],
        ["cores", f"{m.physical_cores} physical, {m.logical_cores} logical"],
        ["RAM", size(m.ram_bytes)],
        ["OS / Python", f"{m.os} / {m.python}"],
        ["OpenVINO", packages.openvino],
        ["OpenVINO GenAI", packages.openvino_genai],
        ["transformers / torch", f"{packages.transformers} / {packages.torch}"],
    ]
    for role, d in results.models.items():  # target, then draft
        compiled = f", compiled: {d.compile_settings}" if d.compile_settings else ""
        rows.append([role, f"{d.name}, {d.precision} weights ({size(d.size_on_disk_bytes)}), KV cache "
                           f"{d.kv_cache_precision}, {d.device}{compiled}"])
    return "## Machine and models\n\n" + table(["", ""], rows)


def _costs(results: Results, plots: dict) -> str:
    """This machine's cost curve and the plan the planner made from it."""
    if not (c := results.costs):
        return ""
    rows = [[str(n), f"{s * 1e3:.1f} ms", f"{s / c.target_s[0]:.2f}"] for n, s in enumerate(c.target_s, start=1)]
    draft = ", ".join(f"{s * 1e3:.1f} ms" for s in c.draft_s)
    text = (
        "## This machine's cost curve and the plan\n\n"
        f"Measured at warm-up ({results.warm_up_s:.1f} s, not part of any lane's time) on {c.cpu}, the way "
        "the loop calls: single steps one after another, and rounds of draft steps then one target call scoring n tokens "
        "(n rows of logits), after a 160-token context, median of 5; in milliseconds and in single steps. Every lane's "
        "records then correct it (`costs.fold`); at the end of the run it stood: "
        f"{end.standing() if (end := results.costs_end) else 'not corrected'}. A draft step "
        f"(1 and 2 tokens): {draft or '–'}; prefill {c.target_prefill_tps:.0f} tokens/s (target), "
        f"{c.draft_prefill_tps:.0f} tokens/s (draft); a KV-cache rollback {c.target_rollback_s * 1e3:.1f} ms "
        f"(target), {c.draft_rollback_s * 1e3:.1f} ms (draft).\n\n"
        + table(["n", "t(n)", "t(n) / t(1)"], rows)
    )
    if results.plan:
        text += f"\n\n**The plan** for the first code instruction: {results.plan.reason}"
    final = end or c
    text += f"\n\n**Where speculation pays here**, from the cost model as the run left it: {surface_sentence(final, final.n_max - 1)}"
    return (text + image(plots, "costs", "Cost of scoring n tokens in one target call, in single steps")
            + image(plots, "surface", "Predicted speedup over K and acceptance, with the break-even line"))


def _headlines(sections: Sections, runs: list[Run]) -> str:
    """The few figures a reader came for, each pointing at the section that has the detail."""
    lines = []
    paper, at = sections.paper, stats.section(runs, "paper")
    if paper and at:
        text = (f"Speculative decoding ({k_text(paper)}, N = {at.n}) is **{at.speedup(OURS_SPEC).median:.2f}×** faster "
                f"than autoregressive (GenAI's C++ pipeline: {at.speedup(GENAI_SPEC).median:.2f}×")
        text += f"; the paper: {paper_speedup(at.n):.2f}×)" if at.n in PAPER else ")"
        lines.append(text + " (§1).")
        lines.append(f"Our speculative loop takes **{at.ratio(OURS_SPEC, GENAI_SPEC).median:.2f}×** the decoding time "
                     "of GenAI's speculative pipeline; our autoregressive loop "
                     f"{at.ratio(OURS_AR, GENAI_AR).median:.2f}× that of GenAI's plain pipeline (§2).")
        lines.append(f"Outside model calls our loop spends {percent(paper.time_shares[SPECULATIVE][PYTHON])} of "
                     "wall time (§6).")
    if hf := stats.section(runs, "transformers"):
        lines.append(f"transformers assisted generation (float32 PyTorch) takes **{hf.ratio(HF_SPEC, OURS_SPEC).median:.1f}×** "
                     "our decoding time per token (§2).")
    k_rows = stats.sweep_rows(runs, "k", "specdemo")
    if fixed := stats.with_k_policy(k_rows, "fixed"):
        best, adaptive = fastest(fixed), stats.with_k_policy(k_rows, "adaptive")
        text = f"Best fixed K: {best.lane.k} at {best.measured_speedup.median:.2f}× (Leviathan: {best.leviathan_speedup:.2f}×)"
        text += f"; adaptive K: {adaptive[0].measured_speedup.median:.2f}×" if adaptive else ""
        lines.append(text + " (§3).")
    if precision := stats.sweep_rows(runs, "precision"):
        best = fastest(precision)
        pair = sections.precision.facts()[best.lane.label]
        lines.append(f"Best weight precisions: target {pair.target} + draft {pair.draft} at "
                     f"{best.measured_speedup.median:.2f}× over that target alone (§3).")
    if lookup := stats.sweep_rows(runs, "lookup"):
        cells = [f"{r.lane.label} {tables.over_ours(runs, r).median:.2f}×" for r in lookup]
        lines.append("On edits that repeat their input, speedup over our autoregressive loop: " + ", ".join(cells) + " (§4).")
    if memory := sections.memory:
        extra = memory.speculative.peak_rss_generating_bytes - memory.autoregressive.peak_rss_generating_bytes
        lines.append(f"Speculative decoding needs {size(extra)} more peak RSS than autoregressive: the draft's weights and KV cache (§5).")
    return "## Headlines\n\n" + "\n".join(f"* {line}" for line in lines) if lines else ""


def _targets(results: Results) -> str:
    if not (targets := results.targets):
        return ""
    rows = []
    for t in targets:
        verdict = "met" if t.met else f"**missed** by {abs(t.gap) * 100:.0f} %"
        if t.unit == "share":
            goal, measured = f"{t.sense} {percent(t.goal, 0)}", percent(t.measured)
        else:
            goal, measured = f"{t.sense} {t.goal:g}", f"{t.measured:.2f}"
        rows.append([t.target, t.where, goal, measured, verdict])
    notes = [diagnose(t, results.sections, results.runs) for t in targets if not t.met]
    text = "## Targets\n\n" + table(["target", "where", "goal", "measured (median)", "verdict"], rows)
    if notes:
        text += "\n\n" + "\n\n".join(note for note in notes if note)
    return text


def diagnose(target: Target, sections: Sections, runs: list[Run]) -> str:
    """For a missed target: what the time breakdown, the round costs and the sweeps point to."""
    if not (at := stats.section(runs, "paper")):
        return ""
    shares = sections.paper.time_shares[SPECULATIVE]
    where = ", ".join(f"{name} {percent(shares[name], 0)}" for name in COMPONENTS)
    if target.id in ("speedup", "speedup_best_k"):
        spec = stats.speculative_figures(stats.lane_runs(at.runs, at.lane(OURS_SPEC)))
        if target.id == "speedup_best_k" and (k_rows := stats.sweep_rows(runs, "k", "specdemo")):
            spec = fastest(k_rows)
        step_s = stats.step_seconds(stats.lane_runs(at.runs, at.lane(OURS_AR)))
        return f"*Speedup ({target.where}):* " + _round_costs(spec, step_s, target) + f" Wall time: {where}."
    if target.id == "genai_ratio":
        ar_ratio = at.ratio(OURS_AR, GENAI_AR).median
        text = (
            f"*Against GenAI ({target.where}):* our speculative loop takes {target.measured:.2f}× GenAI's time, and our "
            f"autoregressive loop {ar_ratio:.2f}× GenAI's plain pipeline, with {percent(shares[PYTHON])} of our time in "
            f"Python: the gap is in the model calls, the same IR run through our stateful model vs GenAI's paged-attention one."
        )
        if kv := stats.sweep_rows(runs, "kv"):
            kv_at, precisions = stats.section(runs, "kv"), sections.kv.facts()
            steps = ", ".join(f"{precisions[r.lane.label].kv_cache_precision} "
                              f"{tables.kv_step_s(kv_at.runs, r.lane) * 1000:.1f} ms" for r in kv)
            text += f" The KV cache sweep (§3) points at one cause: our autoregressive step with each KV cache precision is {steps}."
        return text
    if target.id == "overhead":
        return f"*Overhead ({target.where}):* {where}."
    return ""


def _round_costs(spec: stats.Drafting, step_s: float, target: Target) -> str:
    """One speculative round's model calls against autoregressive steps, and what the goal needs."""
    k, tokens = spec.mean_k, spec.mean_acceptance_length.median
    if not k:  # no round drafted: the planner priced every K above a plain step (a loaded host), and nothing to split
        return "our speculative lane drafted no round: the planner found no K that pays on this run's costs."
    draft_s, verify_s = spec.draft_step_s.median, spec.verify_call_s.median
    round_s = k * draft_s + verify_s
    budget_s = tokens * step_s / target.goal
    return (
        f"a round drafts {k:.1f} tokens ({k:.1f} × {draft_s * 1000:.1f} ms) and verifies them in one call "
        f"({verify_s * 1000:.1f} ms), emitting {tokens:.2f} tokens: {round_s / tokens * 1000:.1f} ms per token against "
        f"{step_s * 1000:.1f} ms per autoregressive step, {speedup_from_calls(tokens, k, draft_s, verify_s, step_s):.2f}× from "
        f"model calls alone (measured {target.measured:.2f}× with prefills and Python). {target.goal:g}× needs a round "
        f"of ≤ {budget_s * 1000:.1f} ms, {(round_s - budget_s) * 1000:.1f} ms less. Leviathan's formula predicts "
        f"{spec.leviathan_speedup:.2f}× from α̂ = {spec.alpha_hat:.2f} and c = {spec.draft_cost:.3f} because it prices a verify "
        f"call at one autoregressive step; here it costs {verify_s / step_s:.2f}×; at 1× the calls would give "
        f"{speedup_from_calls(tokens, k, draft_s, step_s, step_s):.2f}×."
    )


def paper_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """§1: autoregressive vs speculative at the paper's N, ours and GenAI's, beside the paper's figures."""
    if not (paper := sections.paper):
        return ""
    rows = []
    for n in stats.tokens(runs, "paper"):
        at = stats.section(runs, "paper", n=n)
        row = [str(n)]
        for ar, spec in ((OURS_AR, OURS_SPEC), (GENAI_AR, GENAI_SPEC)):
            row += [seconds(stats.lane_figures(at.runs, at.lane(which)).wall_s) for which in (ar, spec)]
            row.append(times(at.speedup(spec)))
        row += [f"{PAPER[n][0]:.2f} s", f"{PAPER[n][1]:.2f} s", f"{paper_speedup(n):.2f}×"] if n in PAPER else ["–"] * 3
        rows.append(row)
    header = ["N", "ours AR", "ours spec", "ours speedup", "GenAI AR", "GenAI spec", "GenAI speedup", "paper AR", "paper spec", "paper speedup"]
    text = (
        f"## 1. The paper's experiment\n\nDecode time for N new tokens, autoregressive (AR) vs speculative (spec, "
        f"{k_text(paper)}{', adaptive' if paper.k_policy == 'adaptive' else ''}), median (min–max) over the code instructions. The paper "
        "ran Dolly v2 12B with a 3B draft on other hardware: compare speedups, not seconds.\n\n" + table(header, rows)
    )
    return text + image(plots, "paper", "Speedup over autoregressive: ours, GenAI, the paper")


def peers_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """§2: GenAI's pipelines from the paper section and transformers from its own, beside our lanes."""
    paper, hf = sections.paper, sections.transformers
    if not paper and not hf:
        return ""
    text = "## 2. Peers in the same run\n\n"
    if paper and (at := stats.section(runs, "paper")):
        rows = [[lane.label, seconds(t.wall_s), ms(t.per_token_s), seconds(t.prefill_s), f"{t.tokens.median:.0f}",
                 percent(stats.acceptance(stats.lane_runs(at.runs, lane)), 0), t.same_as_reference]
                for lane in at.lanes for t in [stats.lane_figures(at.runs, lane)]]
        text += (
            f"OpenVINO GenAI `LLMPipeline` on our converted IR folders, fed the same prompt token ids "
            f"(chat template applied once, by us), greedy, N = {at.n}, {k_text(paper)}, its default continuous-batching "
            "backend with prefix caching off (it would skip the prefill of a prompt seen before), and our compile "
            f"properties{_genai_compile(paper.genai_compile)}."
            + "".join(f" GenAI's {role} ran at {theirs}: its pipelines cannot load specdemo's kernels, which ours ran."
                      for role, theirs in (("target", paper.genai_target), ("draft", paper.genai_draft)) if theirs) + "\n\n"
            + table(["lane", "wall time", "per token", "prefill", "tokens", "draft acceptance rate", "same tokens as ours AR"],
                    rows)
        )
        ratio_rows = [_ratio_row(at, *pair) for pair in ((OURS_AR, GENAI_AR), (OURS_SPEC, GENAI_SPEC))]
        if defaults := stats.section(runs, "paper", GENAI_DEFAULTS):
            where = f" (N = {defaults.n}, {len({r.instruction for r in defaults.runs})} instructions)"
            ratio_rows += [_ratio_row(defaults, *pair, where) for pair in ((OURS_AR, GENAI_AR), (OURS_SPEC, GENAI_SPEC))]
        text += (
            "\n\nDecoding time ratios (tokens after the first, each lane's prefill apart), "
            "per instruction then median (below 1 means ours is faster). \"its defaults\" is GenAI with no "
            "compile properties of ours (on this CPU that means bf16 inference), in a separate shorter pass:\n\n"
            + table(["ratio", "median (min–max)"], ratio_rows)
        )
    if hf:
        text += "\n\n" + _transformers(hf, stats.section(runs, "transformers"))
    return text + image(plots, "peers", "Milliseconds per new token, by lane")


def _ratio_row(at: stats.Pass, numerator: tuple[str, str], denominator: tuple[str, str], where: str = "",
               digits: int = 3) -> list[str]:
    """A row of a table of decoding time ratios: "A / B", the Spread of A's over B's (stats.Pass.ratio)."""
    return [f"{at.lane(numerator).label} / {at.lane(denominator).label}{where}",
            times(at.ratio(numerator, denominator), digits)]


def _genai_compile(compile: GenAICompile | None) -> str:
    """The properties GenAI's peers ran with, in words: ": target …; draft … (where they differ from ours)"."""
    if not compile:
        return ""
    described = "; ".join(f"{role} {', '.join(f'{k.lower()} {v}' for k, v in props.items())}"
                          for role, props in (("target", compile.target), ("draft", compile.draft)) if props)
    return f" ({described}){', except ' + compile.differs if compile.differs else ''}"


def _transformers(hf: Figures | Skipped, at: stats.Pass) -> str:
    """transformers' lanes beside ours from the section's runs: times, decode ratios and each framework's speedup."""
    if isinstance(hf, Skipped):
        return f"transformers: skipped ({hf.skipped})."
    rows = [[lane.label, seconds(t.wall_s), ms(t.per_token_s), f"{t.tokens.median:.0f}", t.same_as_reference]
            for lane in at.lanes for t in [stats.lane_figures(at.runs, lane)]]
    ratio_rows = [_ratio_row(at, ("transformers", kind), ("specdemo", kind), digits=2) for kind in (SPECULATIVE, AUTOREGRESSIVE)]
    ratio_rows += [[f"{'ours' if lane.framework == 'specdemo' else lane.framework} speedup (AR / speculative)",
                    times(stats.speedup(at.runs, lane))] for lane in at.lanes if lane.kind == SPECULATIVE]
    return (
        "transformers float32 on PyTorch CPU, the weights our IRs were converted from (GGUF dequantized, before "
        f"NNCF compression), `generate()` and `assistant_model=` with exactly K = {at.lane(HF_SPEC).k} assistant "
        f"tokens per round, N = {at.n}. Its tokens can differ from ours where int8 rounding flips a near-tie, so "
        "ratios divide decoding time per token (its prefill apart); speedups, wall time per token. \"same tokens\" "
        "compares transformers assisted with transformers AR, the others with ours AR.\n\n"
        + table(["lane", "wall time", "per token", "tokens", "same tokens as reference"], rows)
        + "\n\n"
        + table(["ratio (per token)", "median (min–max)"], ratio_rows)
    )


