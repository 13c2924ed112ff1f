"""Cells and tables of the benchmark report, and the report's later sections: the sweeps, prompt lookup,
memory, the time breakdown and the method. Cells read "median (min–max)": seconds for whole runs,
milliseconds per new token for cross-lane comparisons, "×" for speedups and time ratios."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from specdemo.bench import stats
from specdemo.bench.schema import OURS_AR, OURS_SPEC, Results, Sections
from specdemo.bench.stats import COMPONENTS, Spread, SweepRow
from specdemo.bench.table import Run, measured
from specdemo.learning.disk import size
from specdemo.learning.draft_choice import DraftOption, from_dict
from specdemo.learning.profile.choices import Setting
from specdemo.learning.race import VERIFY_SIZES
from specdemo.learning.tune import Trial
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.figures import figure


def seconds(spread: Spread, digits: int = 2) -> str:
    """A spread of seconds: '4.21 s (4.05–4.60)'; one value: '4.21 s'."""
    return cell(spread, digits, " s")


def ms(spread: Spread, digits: int = 1) -> str:
    """A spread of seconds shown in milliseconds: '42.1 ms (40.3–45.0)'."""
    return cell(spread.scaled(1000), digits, " ms")


def times(spread: Spread, digits: int = 2) -> str:
    """A spread of ratios: '1.82× (1.70–1.95)'."""
    return cell(spread, digits, "×")


def cell(spread: Spread, digits: int, unit: str) -> str:
    if not spread.n:
        return "–"
    median = f"{spread.median:.{digits}f}{unit}"
    if spread.n == 1 or spread.min == spread.max:
        return median
    return f"{median} ({spread.min:.{digits}f}–{spread.max:.{digits}f})"


def percent(fraction: float, digits: int = 1) -> str:
    return "–" if fraction is None or math.isnan(fraction) else f"{fraction * 100:.{digits}f} %"


def number(value: float | None, spec: str, unit: str = "") -> str:
    """`value` formatted by `spec`, or "–" where it was not measured (null in benchmarks.json, NaN in memory)."""
    return "–" if value is None or math.isnan(value) else f"{value:{spec}}{unit}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def k_text(section) -> str:
    """How a section's lanes chose K (its k_label), else "K = n" (its k)."""
    return section.k_label or f"K = {section.k}"


def ms_value(seconds: float) -> str:
    return "–" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def image(plots: dict, name: str, alt: str) -> str:
    """A markdown image of plot `name`, if it was drawn."""
    return f"\n\n![{alt}]({plots[name]})" if name in plots else ""


# ---- the sweeps (section 3), prompt lookup (4), memory (5), the time breakdown (6), the method


def _sweep_rows(rows: list[SweepRow], first: list[list[str]]) -> list[list[str]]:
    """Each row's `first` cells, then its figures under _SWEEP_HEADER."""
    return [[*cells, figure("alpha_hat").format(None if math.isnan(r.alpha_hat) or not r.mean_k else r.alpha_hat),
             figure("draft_cost").format(r.draft_cost or None), figure("mean_k").format(r.mean_k or None),
             figure("leviathan_speedup").format(r.leviathan_speedup if r.draft_cost else None),
             times(r.predicted_speedup) if r.predicted_speedup.n else "–", times(r.measured_speedup),
             _error(r.prediction_error), ms(r.per_token_s), r.same_as_reference] for cells, r in zip(first, rows)]


_SWEEP_HEADER = [*(figure(key).label for key in ("alpha_hat", "draft_cost", "mean_k", "leviathan_speedup",
                                                  "predicted_speedup", "measured_speedup")),
                 "prediction error", "per token", "same tokens as AR"]


def _error(spread: Spread) -> str:
    if not spread.n:
        return "–"
    return f"{spread.median:+.0%} ({spread.min:+.0%} to {spread.max:+.0%})"


@dataclass(frozen=True)
class Tuned:
    """The tune the run's models were loaded under, read back from Profile.tune_record() as benchmarks.json keeps it."""

    file: str  # the tune file's name
    trials: list[Trial]  # the last tune's, every model's candidates
    planned_at: str  # when the draft plan was made, ISO ("–" where it does not say)
    options: list[tuple[DraftOption, float]]  # the draft plan's candidates, each with its acceptance (nan: unmeasured)


def tuned(record: dict) -> Tuned:
    """The one reader of a tune record's keys."""
    trials = [Trial(t["role"], Setting(**t["setting"]), *(measured(t.get(key)) for key in _TRIAL_FIGURES),
                    faithful=bool(t.get("faithful")), chosen=bool(t.get("chosen"))) for t in record["trials"]]
    plan = record.get("draft_plan") or {}
    options = [(from_dict(o), measured(o.get("acceptance"))) for o in plan.get("options") or []]
    return Tuned(record["file"], trials, str(plan.get("planned_at", "–")), options)


_TRIAL_FIGURES = ("seconds", "relative", "agreement", "parting_rate")  # Trial's, in its order


def tune_section(record: dict | None) -> str:
    """The compile settings and the draft this run's models were loaded under, as `python -m specdemo tune` chose them:
    every trial of the tune (settings × times) and the draft plan."""
    if not record:
        return ("## Tuned for this machine\n\nNot tuned: every model ran on the default compile settings "
                "(`python -m specdemo tune` chooses them by measurement).") if record is not None else ""
    tune = tuned(record)
    rows = [[t.role, t.setting.describe(), percent(t.agreement), ms_value(t.seconds) if t.faithful else "–",
             number(t.relative, ".2f", "×") if t.faithful else "–", number(t.parting_rate, ".1f"),
             "chosen" if t.chosen else ("" if t.faithful else "not faithful")] for t in tune.trials]
    text = ("## Tuned for this machine\n\n"
            f"Every lane of this run (ours and GenAI's) was compiled with the settings `python -m specdemo tune` chose on "
            f"this machine (tune file `{tune.file}`). Each candidate: the share of the reference's (f32, no dynamic "
            f"quantization) decided greedy choices it keeps, its time as the loop calls (target: a single step plus "
            f"{' and '.join(map(str, VERIFY_SIZES))}-token verify calls; draft: a draft step inside a round) in the race it last ran in, and against the "
            "defaults, chained through the races; for a target that must keep the lanes identical, how often its verify "
            "calls choose another greedy token than its single steps (per 1,000 positions of built-in code and prose "
            "answers; none may part more often than the defaults beyond the counting noise of theirs: one standard deviation "
            "of their count, at least one parting).\n\n"
            + table(["model", "setting", "greedy kept", "time", "vs default", "parting /1k", ""], rows))
    if tune.options:
        options = [[o.describe(), f"{o.rows:,}", ms_value(o.step_s), percent(acceptance), str(o.k),
                    number(o.predicted_speedup, ".2f", "×"), _plan_note(o)] for o, acceptance in tune.options]
        text += ("\n\n**The draft plan** (planned " + tune.planned_at.replace("T", " ")
                 + "): each candidate draft's step in a round, its acceptance on the built-in answers and the planner's "
                 "predicted speedup at its best K on this machine; the chosen one runs where the draft is left to the "
                 "plan.\n\n"
                 + table(["draft", "head rows", "step", "accepted", "best K", "predicted", ""], options))
    return text


def _plan_note(option: DraftOption) -> str:
    """The draft plan table's last cell: chosen, or not measured (it could not change the plan here)."""
    if option.measured:
        return "chosen" if option.chosen else ""
    return ("chosen, " if option.chosen else "") + f"not measured: at best {number(option.best_case, '.2f', '×')}"


def k_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    if not (k := sections.k):
        return ""
    rows, at = stats.sweep_rows(runs, "k", "specdemo"), stats.section(runs, "k")
    cells = _sweep_rows(rows, [[r.lane.label] for r in rows])
    for row, r in zip(cells, rows):
        genai = stats.same_k(at.runs, r.lane)
        row += [times(stats.speedup(at.runs, genai)), times(stats.spread(stats.paired_ratios(at.runs, r.lane, genai)), 3)
                ] if genai else ["–", "–"]
    text = (
        f"## 3. Sweeps\n\n### Draft length K\n\nN = {k.max_new_tokens}, the default pair. α̂ = accepted / (accepted + "
        "rounds that ended in a rejection), over all rounds; c = a draft step in single target steps; Leviathan = "
        "(1 − α^(K+1)) / ((1 − α)(cK + 1)) with the measured α̂ and c, which prices a verify call at one step; predicted "
        "(this machine) = the planner's prediction from the measured cost curve, α̂, mean K, N and the prompt; measured = "
        "AR time / speculative time per instruction; prediction error = (predicted − measured) / measured. Auto K: the "
        "planner picks each round's K.\n\n"
        + table(["K", *_SWEEP_HEADER, "GenAI speedup", "ours / GenAI time"], cells)
    )
    return text + _counterfactual_table(rows, k.facts()) + image(plots, "k", "Measured and predicted speedup against K")


def _counterfactual_table(rows: list[SweepRow], said: dict[str, stats.Counterfactual]) -> str:
    """Measured, predicted and counterfactual speedup per fixed K, and auto K against the best fixed K; `said`: what
    the counterfactual said of each lane (stats.counterfactual_figures), by its label."""
    fixed = [(r, said[r.lane.label]) for r in rows
             if r.lane.k_policy == "fixed" and said[r.lane.label].counterfactual_speedup.n]
    if not fixed:
        return ""
    cells = [[r.lane.label, times(r.measured_speedup), times(r.predicted_speedup) if r.predicted_speedup.n else "–",
              _error(r.prediction_error), times(c.counterfactual_speedup), _error(c.counterfactual_error),
              f"±{c.counterfactual_calls_off}", str(c.answers_differ)] for r, c in fixed]
    text = (
        "\n\n#### What each K would have given\n\nAfter every instruction, one teacher-forced draft pass over the "
        "autoregressive lane's greedy answer gives, at every position, whether the draft's greedy token equals the answer's; "
        "a round starting there with K drafts accepts exactly the run of matches, capped at K. Walking the answer round by "
        "round with this machine's cost model (as corrected by the section's runs) gives each fixed K's speedup on that very "
        "answer (the counterfactual), the best fixed K and the best K for every round (the oracle). Greedy decoding only. "
        "Where the auto-K lane wrote the same answer, its own drafting (one token per call, as the loop drafts) replaces "
        "the pass's guesses at the positions it drafted. Error = (counterfactual − measured) / measured; calls: the "
        "largest gap between the target calls the counterfactual said and the run made, over the answers the fixed-K "
        "lane wrote the same as the autoregressive one; other answers: how many it wrote differently (batched verify "
        "calls can order a near-tie otherwise than single steps), where the walk over the autoregressive answer does "
        "not apply.\n\n"
        + table(["K", "measured", "predicted (this machine)", "its error", "counterfactual", "its error", "target calls",
                 "other answers"], cells)
    )
    for r in rows:
        c = said[r.lane.label]
        if r.lane.k_policy in ("auto", "adaptive") and c.oracle_speedup.n:
            ks = ", ".join(str(k) for k in c.best_fixed_k)
            over = (f"; measured against the measured lane at that K: {times(c.over_best_fixed)}"
                    if c.over_best_fixed.n else "")
            text += (f"\n\n**{r.lane.label}**: measured {times(r.measured_speedup)}. On the same answers the counterfactual's "
                     f"best fixed K was {ks} ({times(c.best_fixed_counterfactual)} predicted){over}; the oracle, the best K "
                     f"for every round, {times(c.oracle_speedup)}.")
    return text


def precision_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    if not (precision := sections.precision):
        return ""
    rows, pairs = stats.sweep_rows(runs, "precision"), precision.facts()
    cells = _sweep_rows(rows, [[pair.target, pair.draft, size(pair.draft_bytes), ms(r.reference_per_token_s)]
                               for r in rows for pair in [pairs[r.lane.label]]])
    text = (
        f"### Weight precision\n\nN = {precision.max_new_tokens}, {k_text(precision)}. Each speedup is over the same "
        "target decoding alone (AR per token shown); \"same tokens\" compares with that target's own AR output.\n\n"
        + table(["target", "draft", "draft size", "AR per token", *_SWEEP_HEADER], cells)
    )
    return text + image(plots, "precision", "Measured and predicted speedup by weight precision")


def kv_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    if not (kv := sections.kv):
        return ""
    rows, at, precisions = stats.sweep_rows(runs, "kv"), stats.section(runs, "kv"), kv.facts()
    # KV bytes: both models' caches at the end of a speculative run, the median run's
    first = [[precisions[r.lane.label].kv_cache_precision, ms_value(kv_step_s(at.runs, r.lane)),
              size(statistics.median(sum(run.summary.kv_cache_bytes.values()) for run in stats.lane_runs(at.runs, r.lane)))]
             for r in rows]
    return (
        f"### KV cache precision\n\nBoth models' KV cache in the given element type (OpenVINO `KV_CACHE_PRECISION`), "
        f"N = {kv.max_new_tokens}, {k_text(kv)}; KV bytes are both caches at the end of a speculative run.\n\n"
        + table(["KV cache", "AR step", "KV bytes", *_SWEEP_HEADER], _sweep_rows(rows, first))
    )


def kv_step_s(runs: list[Run], lane) -> float:
    """The autoregressive step of speculative `lane`'s baseline (the same KV cache precision), in seconds."""
    return stats.step_seconds(stats.lane_runs(runs, lane.baseline))


def lookup_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    if not (lookup := sections.lookup):
        return ""
    rows = stats.sweep_rows(runs, "lookup")
    cells = _sweep_rows(rows, [[r.lane.label] for r in rows])
    for row, r in zip(cells, rows):
        row.append(times(over_ours(runs, r)))
    return (
        "## 4. Prompt lookup vs draft model\n\nEdits whose answer repeats the code in the prompt (add type hints, rename "
        f"a parameter, add docstrings), N = {lookup.max_new_tokens}, K = {lookup.k}. Speedups are over the same "
        "framework's autoregressive lane; the last column is over ours. Prompt lookup has no draft model, so c is ~0.\n\n"
        + table(["drafter", *_SWEEP_HEADER, "speedup over ours AR"], cells)
    )


def over_ours(runs: list[Run], row: SweepRow) -> Spread:
    """A lookup row's speedup over our autoregressive lane (ours: its own speedup; a peer's: over ours, not its own)."""
    if row.lane.framework == "specdemo":
        return row.measured_speedup
    at = stats.section(runs, "lookup")
    return stats.spread(stats.paired_ratios(at.runs, at.lane(OURS_AR), row.lane))


def vocab_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    if not (vocab := sections.vocab):
        return ""
    rows, heads = stats.sweep_rows(runs, "vocab"), vocab.facts()
    first = [[r.lane.label, f"{heads[r.lane.label].rows_kept:,}", ms_value(heads[r.lane.label].draft_step_costed_s)]
             for r in rows]
    return (
        f"### A cheaper draft: its LM head trimmed to the most frequent tokens\n\nN = {vocab.max_new_tokens}, auto K. "
        "The head keeps the N most frequent tokens of Python's standard library and the examples, plus every special "
        "and single-byte token; the target still checks every token, so greedy output is unchanged.\n\n"
        + table(["draft head", "rows kept", "draft step (warm-up)", *_SWEEP_HEADER], _sweep_rows(rows, first))
    )


def memory_section(sections: Sections, plots: dict, runs=()) -> str:
    if not (memory := sections.memory):
        return ""
    rows = [[mode, *map(size, (m.rss_loaded_bytes, m.peak_rss_generating_bytes, m.peak_rss_process_bytes,
                               m.peak_anon_process_bytes, m.private_bytes)),
             ", ".join(f"{model} {size(b)}" for model, b in m.kv_cache_bytes.items())]
            for mode, m in ((AUTOREGRESSIVE, memory.autoregressive), (SPECULATIVE, memory.speculative))]
    return (
        f"## 5. Memory\n\nEach mode in a fresh process (the autoregressive one loads no draft), {memory.max_new_tokens} "
        "new tokens. Peak while generating is sampled every 5 ms; the process peak includes loading and compiling. "
        "RSS includes the memory-mapped IR weight files; \"anonymous\" (RssAnon, what the memory bound counts) and "
        "\"private\" (RSS minus file-backed pages, at the end) do not.\n\n"
        + table(["mode", "RSS after load", "peak RSS generating", "peak RSS of process", "peak anonymous of process",
                 "private", "KV cache at end"], rows)
    )


def breakdown_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """§6: where the time of the paper section's longest runs goes."""
    if not (paper := sections.paper) or not (at := stats.section(runs, "paper")):
        return ""
    shares = paper.time_shares
    rows = [[name, percent(shares[SPECULATIVE][name]), percent(shares[AUTOREGRESSIVE][name])] for name in COMPONENTS]
    spec = stats.speculative_figures(stats.lane_runs(at.runs, at.lane(OURS_SPEC)))
    step_s = stats.step_seconds(stats.lane_runs(at.runs, at.lane(OURS_AR)))
    return (
        f"## 6. Where the time goes\n\nShares of wall time summed over the N = {at.n} runs of section 1. \"our Python\" is "
        "everything outside model calls and cache rollbacks: the loop, acceptance, copying logits out of the plugin, "
        f"incremental detokenizing. Verify call {ms(spec.verify_call_s)}, draft step {ms(spec.draft_step_s)}, "
        f"autoregressive step {step_s * 1000:.1f} ms; mean acceptance length (tokens per verify call) "
        f"{spec.mean_acceptance_length.median:.2f}; accepted drafts per round (0..K): {spec.accepted_histogram}.\n\n"
        + table(["component", SPECULATIVE, AUTOREGRESSIVE], rows)
        + image(plots, "breakdown", "Shares of wall time")
    )


def method_section(results: Results) -> str:
    b = results.bench
    return (
        "## Method\n\n"
        f"* Instructions: the first {b.instructions} code instructions of `specdemo/bench/settings.py` (transformers: the "
        f"first {b.transformers_instructions}; prompt lookup: {b.lookup_instructions} edit instructions), "
        f"{b.repeats} pass(es), greedy decoding, our chat template applied once and the same token ids given to every lane.\n"
        f"* Warm-up: every lane generates {b.warmup_tokens} tokens before anything is timed.\n"
        "* Interleaving: for each instruction all lanes of a section run back to back, so the shared machine's load "
        "affects them alike; ratios are computed per instruction, then summarised as median (min–max).\n"
        "* Times are wall-clock seconds of the whole generate call, prompt ids in hand to the last token, split at the first "
        "token into prefill and decoding (tokens after the first ÷ their seconds); speedups over a lane's own autoregressive "
        "lane divide wall time per token, ratios across frameworks decode rates.\n"
        "* α̂, c and the time breakdown come from the loops' per-round records (`specdemo/decoding/events.py`), derived by `specdemo/results/metrics.py`."
    )
