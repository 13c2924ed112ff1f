"""The report's sections on the GGUF files the default pair ships as: llama.cpp running them as they are beside our
lanes, and each target precision's fidelity to them (specdemo/results/fidelity.py)."""

from __future__ import annotations

import math

from specdemo.bench import stats
from specdemo.bench.report_tables import cell, k_text, ms_value, number, percent, seconds, table, times
from specdemo.bench.schema import OURS_AR, OURS_SPEC, Sections, Skipped
from specdemo.bench.table import Lane, Run
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE


def llamacpp_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """llama.cpp on the same GGUF files, from the section's rows of the table: each lane's prefill and decode rate, our
    decode rate over each llama.cpp mode's, and whether llama.cpp's bindings decode as fast as its own llama-bench."""
    if not (cpp := sections.llamacpp):
        return ""
    title = "## 7. llama.cpp on the same GGUF files\n\n"
    if isinstance(cpp, Skipped):
        return title + cpp.skipped
    at = stats.section(runs, "llamacpp")
    mine, lanes = at.runs, at.lanes
    ours_ar, ours_spec, cpp_ar = (at.lane(which) for which in (OURS_AR, OURS_SPEC, ("llamacpp", AUTOREGRESSIVE)))
    bench = next((lane for lane in lanes if lane.framework == "llamacpp" and lane.kind == AUTOREGRESSIVE and lane != cpp_ar),
                 None)  # llama-bench's row
    # A time ratio per token of llama.cpp over ours is our tokens/s over llama.cpp's.
    pairs = [(lane, ours_spec) for lane in lanes if (lane.framework, lane.kind) == ("llamacpp", SPECULATIVE)]
    ratio_rows = [[f"{ours.label} ÷ {theirs.label}", times(stats.spread(stats.decode_ratios(mine, theirs, ours)))]
                  for theirs, ours in [*pairs, (cpp_ar, ours_ar)]]
    # the bindings' decode rate, and ours, over llama-bench's tg: llama.cpp in its bindings as fast as in its own tool?
    rate = lambda lane: stats.lane_figures(mine, lane).decode_tokens_per_s.median  # noqa: E731
    over_bench = [rate(lane) / rate(bench) if bench else None for lane in (cpp_ar, ours_ar)]
    beside = bench is not None and stats.lane_runs(mine, bench)[0].instruction >= 0  # files before: once, after all
    return (
        title
        + f"llama-cpp-python {cpp.version} (`llama_cpp.Llama`) on the GGUF files our IRs are converted from (Q4_K_M, "
        f"run as they are; ours run them in OpenVINO as {_weights(cpp.weights)}), fed the same prompt token ids, "
        f"greedy, {cpp.threads} threads, N = {cpp.max_new_tokens}; ours {k_text(cpp)}, llama.cpp K = {cpp.k}: prompt "
        "lookup is the bindings' `LlamaPromptLookupDecoding`, the draft model the 0.5B GGUF behind the bindings' "
        "`draft_model` interface (`specdemo/bench/llamacpp.py`), in a process of its own, warmed up. Each lane is timed as "
        "llama.cpp times itself: the prefill (prompt to first token) apart from the decoding (tokens after the first per "
        "second), and the ratios divide decode rates; \"same tokens\" compares llama.cpp's speculative lanes with its "
        "autoregressive one, the others with ours AR (llama.cpp's tools print text: not compared). llama.cpp's CPU "
        f"features: `{cpp.system_info}`."
        + (f" Our kernels ran their {cpp.kernels_isa} path." if cpp.kernels_isa else "") + "\n\n"
        + table(["lane", "decode", "prefill", "tokens/s with prefill", "wall time", "tokens", "draft acceptance rate",
                 "speedup over own AR", "same tokens as reference"], [_lane_row(mine, lane) for lane in lanes])
        + _against_llama_bench(*over_bench, beside)
        + "\n\nOur decode rate over llama.cpp's, per instruction then median (above 1 means ours decodes faster):\n\n"
        + table(["ratio", "median (min–max)"], ratio_rows)
        + (f"\n\nOur autoregressive greedy text against llama.cpp's, per instruction: the tokens both wrote before "
           f"they part: {', '.join(f'{r.same_tokens} of {r.of}' for r in cpp.text_agreement)}."
           if cpp.text_agreement else "")
    )


def _lane_row(runs: list[Run], lane: Lane) -> list[str]:
    """A lane's row: decode rate, prefill, tokens/s with prefill, wall time, tokens, llama.cpp's draft acceptance, the
    speedup over its own autoregressive lane, same tokens."""
    times_of, mine = stats.lane_figures(runs, lane), stats.lane_runs(runs, lane)
    acceptance = stats.acceptance(mine) if lane.framework == "llamacpp" else None
    speedup = times(stats.speedup(runs, lane)) if lane.kind == SPECULATIVE else "–"
    return [lane.label, cell(times_of.decode_tokens_per_s, 1, " tokens/s"), seconds(times_of.prefill_s),
            cell(stats.spread([r.tokens / r.wall_s for r in mine if r.wall_s]), 1, " tokens/s"), seconds(times_of.wall_s),
            f"{times_of.tokens.median:.0f}", percent(acceptance, 0), speedup, times_of.same_as_reference]


def _against_llama_bench(ratio: float | None, ours: float | None, each: bool) -> str:
    """Whether the bindings' decode rate is within 10 % of llama-bench's tg (the same library, its own timing), in bold
    where it is not (then the bindings' lanes under- or over-state llama.cpp), and ours over llama-bench's tg; `each`:
    llama-bench ran beside the lanes on each instruction (else once, after them)."""
    if ratio is None or math.isnan(ratio):
        return ""
    beside = f" Our autoregressive lane decodes at {ours:.2f}× llama-bench's tg." + (
        " (llama-bench ran back to back with the lanes on each instruction: pp at its prompt's length, then tg N.)"
        if each else "")
    if abs(ratio - 1) <= 0.10:
        return (f"\n\nThe bindings decode at {ratio:.2f}× llama-bench's tg rate: within 10 %, so they stand for llama.cpp."
                + beside)
    return (f"\n\n**The bindings decode at {ratio:.2f}× llama-bench's tg rate**, more than 10 % off: the llama.cpp lanes "
            "here do not stand for llama.cpp as its own tool measures it; compare ours with llama-bench's row too." + beside)


def _weights(weights: dict[str, str]) -> str:
    """"gguf target / int4 draft": which weights our lanes ran (gguf: the GGUF's own blocks)."""
    return " / ".join(f"{'its own blocks' if p == 'gguf' else p.upper()} {role}" for role, p in weights.items())


def fidelity_section(sections: Sections, plots: dict, runs=()) -> str:
    """Each target precision against the GGUF it came from (specdemo/results/fidelity.py)."""
    if not (section := sections.fidelity):
        return ""
    title = "## Fidelity to the GGUF\n\n"
    if isinstance(section, Skipped):
        return title + section.skipped
    candidates = section.candidates
    rows = [[c.precision, c.compile_settings, percent(c.top1_agreement, 1), f"{c.mean_abs_logit_error:.3f}"]
            for c in candidates]
    return (title + "Each target precision, under the compile settings it runs with on this machine, teacher forced "
            f"over the {section.examples} built-in answers beside the GGUF itself (its own blocks, f32 arithmetic, no "
            f"dynamic quantization), at {candidates[0].positions} positions:\n\n"
            + table(["weights", "compile settings", "top-1 agreement", "mean |logit error|"], rows))


def nodes_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """Where a target call's time goes (specdemo/bench/nodes.py), per target precision, beside the GGUF's own bytes
    (and llama.cpp's rate reading them, when the llamacpp section ran)."""
    if not (section := sections.nodes) or not section.targets:
        return ""
    calls = section.tokens_per_call
    parts = ["## Where a target call's time goes\n\nOpenVINO's per-node counters (PERF_COUNT) over windows of 8 calls of "
             f"{' and '.join(map(str, calls))} tokens (a decode step and a verify call), three windows of each size in "
             "turns, each node's median kept; each target precision compiled as it runs here, summed by group, beside the "
             "bytes of the weights each group reads per call and the rate that gives. A group far below the others' rate "
             "is a slow kernel; a step whose groups all stream near the machine's rate gets faster only by reading fewer "
             "bytes."]
    for target in section.targets:  # nodes.TargetNodes
        rows = []
        for i, group in enumerate(target.by_tokens[calls[0]]):
            row = [group.name, f"{group.weight_bytes / 1e6:.0f} MB" if group.weight_bytes else "–"]
            for tokens in calls:
                g = target.by_tokens[tokens][i]
                row += [f"{g.ms_per_call:.1f} ms", number(g.gb_per_s, ".1f", " GB/s")]
            rows.append(row)
        totals = [sum(g.ms_per_call for g in target.by_tokens[t]) for t in calls]
        rows.append(["**all nodes**", f"{target.weight_bytes / 1e6:.0f} MB"]
                    + [cell for t in totals for cell in (f"**{t:.1f} ms**", number(target.weight_bytes / (t * 1e6), ".1f", " GB/s"))])
        rows.append(["the call, wall time", ""] + [cell for t in calls for cell in (ms_value(target.wall_s[t]), "")])
        header = ["group", "weights read"] + [c for t in calls for c in (f"{t} token{'s' if t > 1 else ''}: time", "rate")]
        parts.append(f"**{_weights({'target': target.precision})}** ({target.compile_settings}):\n\n" + table(header, rows))
    if gguf := section.gguf_read_bytes:
        line = f"The GGUF file's matmuls read {gguf / 1e9:.2f} GB of weights per token"
        cpp = stats.section(runs, "llamacpp")  # llama.cpp's median time per token, plain decoding, where it ran
        if cpp and (plain := stats.lane_figures(cpp.runs, cpp.lane(("llamacpp", AUTOREGRESSIVE))).per_token_s.median):
            line += f"; at llama.cpp's {plain * 1e3:.1f} ms per token in this run that is {gguf / plain / 1e9:.1f} GB/s"
        parts.append(line + ".")
    return "\n\n".join(parts)
