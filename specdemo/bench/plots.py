"""PNG plots of the benchmark results (schema.Results; matplotlib, no display needed), lanes found by their fields.
A section that did not run draws nothing (its painter returns None); error bars span min to max over the instructions,
around the median. The sections' painters are named by settings.REGISTRY; draw() draws them all.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from specdemo.bench import found, humaneval, stats
from specdemo.bench.humaneval import HumanEval
from specdemo.bench.report_tables import k_text
from specdemo.bench.schema import GENAI_SPEC, OURS_AR, OURS_SPEC, Results
from specdemo.bench.settings import PAPER, REGISTRY, paper_speedup
from specdemo.bench.stats import COMPONENTS
from specdemo.bench.table import GENAI_DEFAULTS, Run
from specdemo.decoding import pricing
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE

_OURS, _GENAI, _PAPER, _HF = "#1f77b4", "#ff7f0e", "#7f7f7f", "#2ca02c"


def draw(results: Results, out: Path) -> dict[str, str]:
    """Write every plot the results allow into `out`: this machine's cost curve and surface, then every registered
    section's (settings.REGISTRY), each given the results and the table's runs (read once); return {name: file name}."""
    matplotlib.use("Agg")
    painters = [draw_costs, draw_surface] + [found(painter) for section in REGISTRY for painter in section.plots]
    drawn, runs = {}, results.runs
    for painter in painters:
        figure = painter(results, runs)
        if figure is not None:
            name = painter.__name__.removeprefix("draw_")
            figure.savefig(out / f"benchmarks-{name}.png", dpi=110, bbox_inches="tight")
            plt.close(figure)
            drawn[name] = f"benchmarks-{name}.png"
    return drawn


def draw_surface(results: Results, runs: list[Run]):
    """This machine's predicted speedup over K × α (its cost model as the run left it), the break-even line, and auto
    K's point (pooled α̂, mean K) when the K section ran."""
    if not (costs := results.costs_end or results.costs):  # CostModel
        return None
    ks, alphas = list(range(1, costs.n_max)), [0.5 + 0.0125 * i for i in range(41)]
    grid = np.array(pricing.cost_surface(costs, ks, alphas))
    figure, ax = plt.subplots(figsize=(6, 3.8))
    image = ax.imshow(np.log2(grid), origin="lower", aspect="auto", cmap="PuOr", vmin=-1, vmax=1,
                      extent=(ks[0] - 0.5, ks[-1] + 0.5, alphas[0] - 0.00625, alphas[-1] + 0.00625))
    if line := [(k, a) for k in ks if (a := pricing.break_even_alpha(costs, k)) is not None]:
        ax.plot(*zip(*line), color="black", linewidth=1.5, label="break-even (1×)")
    if auto := stats.with_k_policy(stats.sweep_rows(runs, "k", "specdemo"), "auto"):
        ax.plot(auto[0].mean_k, auto[0].alpha_hat, "o", color="#CC79A7", markeredgecolor="white", markersize=9,
                label="auto K (α̂, mean K)")
    ax.set_ylim(alphas[0] - 0.00625, alphas[-1] + 0.00625)  # the break-even line below α = 0.5 is off the map
    colorbar = figure.colorbar(image, ax=ax, ticks=[-1, 0, 1])
    colorbar.ax.set_yticklabels(["½×", "1×", "2×"])
    ax.set(xlabel="K, drafts per round", ylabel="acceptance α",
           title="Where speculation pays on this machine (predicted speedup)")
    ax.legend(loc="lower right", fontsize=8)
    return figure


def _errors(spreads: list[dict]) -> list[list[float]]:
    """matplotlib's yerr/xerr: distances from the median down to min and up to max."""
    return [[s.median - s.min for s in spreads], [s.max - s.median for s in spreads]]


def draw_costs(results: Results, runs=()):
    if not (c := results.costs):  # CostModel
        return None
    ns = list(range(1, len(c.target_s) + 1))
    figure, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(ns, [s / c.target_s[0] for s in c.target_s], marker="o", color=_OURS, label="this machine")
    ax.plot(ns, ns, "--", color=_GENAI, label="n steps (no gain from batching)")
    ax.plot(ns, [1] * len(ns), ":", color=_HF, label="1 step (free verification)")
    ax.set(xlabel="tokens scored in one target call", ylabel="cost in single steps")
    ax.set_title(f"Cost of scoring n tokens ({c.cpu})", fontsize=9)
    ax.legend(fontsize=8)
    return figure


def draw_paper(results: Results, runs: list[Run]):
    if not (paper := results.sections.paper) or not (ns := stats.tokens(runs, "paper")):
        return None
    passes = [stats.section(runs, "paper", n=n) for n in ns]
    groups = [("ours", OURS_SPEC, _OURS), ("OpenVINO GenAI", GENAI_SPEC, _GENAI)]
    width = 0.8 / (len(groups) + 1)
    figure, ax = plt.subplots(figsize=(7, 4))
    for i, (label, which, colour) in enumerate(groups):
        spreads = [at.speedup(which) for at in passes]
        xs = [j + i * width for j in range(len(ns))]
        ax.bar(xs, [s.median for s in spreads], width, yerr=_errors(spreads), capsize=3, label=label, color=colour)
    papers = [paper_speedup(n) if n in PAPER else 0 for n in ns]
    ax.bar([j + len(groups) * width for j in range(len(ns))], papers, width, label="paper (Dolly v2 12B / 3B)", color=_PAPER)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * len(groups) / 2 for j in range(len(ns))], [f"N = {n}" for n in ns])
    ax.set(ylabel="speedup over autoregressive (×)",
           ylim=(0, 1.3 * max([at.speedup(OURS_SPEC).max for at in passes] + papers)))
    ax.set_title(f"Speculative vs autoregressive, {k_text(paper)}", fontsize=9)
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    return figure


def draw_peers(results: Results, runs: list[Run]):
    """Milliseconds per token of every lane of the paper section and of the transformers section, whichever ran."""
    every = {"specdemo": _OURS, "genai": _GENAI, "transformers": _HF}
    bars = []  # (label, spread of seconds per token, colour)
    # of GenAI's defaults pass, GenAI's lanes only: ours ran in the paper's own pass too
    for at, colours in ((stats.section(runs, "paper"), every), (stats.section(runs, "paper", GENAI_DEFAULTS),
                        {"genai": "#ffbb78"}), (stats.section(runs, "transformers"), every)):
        for lane in at.lanes if at else []:
            if lane.framework in colours:
                bars.append((f"{lane.label} (N={at.n})", stats.lane_figures(at.runs, lane).per_token_s,
                             colours[lane.framework]))
    if not bars:
        return None
    scaled = [s.scaled(1000) for _, s, _ in bars]
    figure, ax = plt.subplots(figsize=(7, 0.4 * len(bars) + 1.2))
    ys = range(len(bars))
    ax.barh(ys, [s.median for s in scaled], xerr=_errors(scaled), capsize=3, color=[c for _, _, c in bars])
    ax.set_yticks(ys, [label for label, _, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="milliseconds per new token (lower is faster)",
           title="Ours, OpenVINO GenAI and transformers on the same prompts")
    return figure


def draw_k(results: Results, runs: list[Run]):
    if not (k := results.sections.k):
        return None
    rows, at = stats.sweep_rows(runs, "k", "specdemo"), stats.section(runs, "k")
    fixed = stats.with_k_policy(rows, "fixed")
    ks = [r.lane.k for r in fixed]
    figure, ax = plt.subplots(figsize=(7, 4))
    measured = [r.measured_speedup for r in fixed]
    ax.errorbar(ks, [s.median for s in measured], yerr=_errors(measured), marker="o", capsize=3, color=_OURS, label="ours, measured")
    ax.plot(ks, [r.leviathan_speedup for r in fixed], "--", marker="x", color=_OURS, alpha=0.6, label="ours, Leviathan's prediction")
    if genai := [(r.lane.k, stats.speedup(at.runs, g)) for r in fixed if (g := stats.same_k(at.runs, r.lane))]:
        spreads = [s for _, s in genai]
        ax.errorbar([k for k, _ in genai], [s.median for s in spreads], yerr=_errors(spreads), marker="s", capsize=3, color=_GENAI, label="GenAI, measured")
    if adaptive := stats.with_k_policy(rows, "adaptive"):
        ax.axhline(adaptive[0].measured_speedup.median, color=_OURS, linestyle=":", label=f"ours, adaptive K (mean {adaptive[0].mean_k:.1f})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="draft tokens per round K", ylabel="speedup over autoregressive (×)")
    twin = ax.twinx()
    twin.plot(ks, [r.alpha_hat for r in fixed], color=_PAPER, marker=".", linewidth=0.8, label="acceptance α")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("acceptance rate α", color=_PAPER)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=8, loc="lower right")
    ax.set_title(f"Draft length K, N = {k.max_new_tokens}")
    return figure


def draw_precision(results: Results, runs: list[Run]):
    if not (precision := results.sections.precision):
        return None
    rows, pairs = stats.sweep_rows(runs, "precision"), precision.facts()
    labels = [f"{pairs[r.lane.label].target} / {pairs[r.lane.label].draft}" for r in rows]
    measured = [r.measured_speedup for r in rows]
    figure, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [s.median for s in measured], 0.4, yerr=_errors(measured), capsize=3, color=_OURS, label="measured")
    ax.bar([x + 0.2 for x in xs], [r.leviathan_speedup for r in rows], 0.4, color=_OURS, alpha=0.4, label="Leviathan's prediction")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set(xlabel="target / draft weight precision", ylabel="speedup over the same target alone (×)")
    ax.legend(fontsize=8)
    return figure


def draw_breakdown(results: Results, runs=()):
    if not (paper := results.sections.paper):
        return None
    shares = paper.time_shares
    lanes = [SPECULATIVE, AUTOREGRESSIVE]
    colours = ["#aec7e8", "#1f77b4", "#ffbb78", "#ff7f0e", "#9467bd", "#d62728"]
    figure, ax = plt.subplots(figsize=(7, 2.2))
    for lane_index, lane in enumerate(lanes):
        left = 0.0
        for component, colour in zip(COMPONENTS, colours):
            width = shares[lane][component] * 100
            ax.barh(lane_index, width, left=left, color=colour, label=component if lane_index == 0 else None)
            if width >= 4:
                ax.text(left + width / 2, lane_index, f"{width:.0f}%", ha="center", va="center", fontsize=7)
            left += width
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set(xlim=(0, 100), xlabel="share of wall time (%)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return figure


def draw_humaneval(results: Results, runs: list[Run]):
    """Per HumanEval problem: our speculative speedup against the mean acceptance length; failed answers hollow."""
    if not isinstance(section := results.sections.humaneval, HumanEval) or not section.rows:
        return None
    problems = list(zip(section.rows, humaneval.first_pass(runs, OURS_AR), humaneval.first_pass(runs, OURS_SPEC)))
    figure, axis = plt.subplots(figsize=(6, 4))
    for passed, style in ((True, {"color": _OURS}), (False, {"facecolors": "none", "edgecolors": _OURS})):
        mine = [(ar, spec) for row, ar, spec in problems if row.passed[SPECULATIVE] == passed]
        axis.scatter([spec.summary.mean_acceptance_length for _, spec in mine],
                     [humaneval.problem_speedup(ar, spec) for ar, spec in mine], s=22,
                     label="speculative answer passes" if passed else "fails its tests", **style)
    axis.axhline(1.0, color=_PAPER, linewidth=0.8)
    axis.set(xlabel="mean acceptance length (tokens per target call)", ylabel="speedup over autoregressive",
             title="HumanEval: speedup per problem")
    axis.legend(fontsize=8)
    return figure
