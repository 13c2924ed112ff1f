"""The benchmark's markdown report, rendered from the results dict that bench.py also writes as JSON.

Pure formatting: no measuring, no models. Cells read "median (min–max)": seconds for whole runs,
milliseconds per new token for cross-lane comparisons, "×" for speedups and time ratios.
"""

from __future__ import annotations

import math

from specdemo.bench_stats import COMPONENTS, call_speedup
from specdemo.disk import size



# ---- cells


def seconds(spread: dict, digits: int = 2) -> str:
    """A spread of seconds: '4.21 s (4.05–4.60)'; one value: '4.21 s'."""
    return _cell(spread, digits, " s")


def ms(spread: dict, digits: int = 1) -> str:
    """A spread of seconds shown in milliseconds: '42.1 ms (40.3–45.0)'."""
    scaled = {key: spread[key] * 1000 for key in ("median", "min", "max")} | {"n": spread["n"]}
    return _cell(scaled, digits, " ms")


def times(spread: dict, digits: int = 2) -> str:
    """A spread of ratios: '1.82× (1.70–1.95)'."""
    return _cell(spread, digits, "×")


def _cell(spread: dict, digits: int, unit: str) -> str:
    if not spread.get("n"):
        return "–"
    median = f"{spread['median']:.{digits}f}{unit}"
    if spread["n"] == 1 or spread["min"] == spread["max"]:
        return median
    return f"{median} ({spread['min']:.{digits}f}–{spread['max']:.{digits}f})"


def percent(fraction: float, digits: int = 1) -> str:
    return "–" if fraction is None or math.isnan(fraction) else f"{fraction * 100:.{digits}f} %"




def table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- the document


def render(results: dict, plots: dict[str, str]) -> str:
    """The whole report. `plots` maps a plot's name to its file name, relative to the report."""
    sections = results["sections"]
    parts = [
        _header(results),
        _machine(results),
        _costs(results, plots),
        _headlines(sections),
        _targets(results),
        _paper(sections.get("paper"), plots),
        _peers(sections.get("paper"), sections.get("transformers"), plots),
        _k(sections.get("k"), plots),
        _vocab(sections.get("vocab")),
        _precision(sections.get("precision"), plots),
        _kv(sections.get("kv")),
        _lookup(sections.get("lookup")),
        _memory(sections.get("memory")),
        _breakdown(sections.get("paper"), plots),
        _method(results),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def _header(results: dict) -> str:
    bench = results["bench"]
    minutes = results["seconds"] / 60
    return (
        "# Benchmarks\n\n"
        "Autoregressive vs speculative decoding on OpenVINO, measured by `python -m specdemo bench` beside "
        "the paper's figures, OpenVINO GenAI's own pipelines and transformers, in one run on one machine. "
        "Every figure below comes from that run; ratios were measured back to back on the same instructions.\n\n"
        f"* command: `{results['command']}` ({bench['mode']} mode, {minutes:.1f} min, started {results['started']})\n"
        f"* load average (1, 5, 15 min) at start {results['machine']['load_average']}, at end {results.get('load_average_end')}; "
        "1-minute load after each section: "
        + ", ".join(f"{name} {s['load_average_end'][0]}" for name, s in results["sections"].items() if "load_average_end" in s)
        + "\n"
        "* reproduce: `python -m specdemo bench --out docs` (full, ~45 min on 2 cores, first run longer) or `python -m specdemo bench --quick` "
        "(~3 min); the raw runs are in `benchmarks.json`"
    )


def _machine(results: dict) -> str:
    m = results["machine"]
    packages = m["packages"]
    rows = [
        ["CPU", f"{m['cpu']} ({', '.join(m['cpu_features']) or 'no AVX-512'})"],
        ["cores", f"{m['physical_cores']} physical, {m['logical_cores']} logical"],
        ["RAM", size(m["ram_bytes"])],
        ["OS / Python", f"{m['os']} / {m['python']}"],
        ["OpenVINO", packages["openvino"]],
        ["OpenVINO GenAI", packages["openvino-genai"]],
        ["transformers / torch", f"{packages['transformers']} / {packages['torch']}"],
    ]
    models = results.get("models", {})
    for role in ("target", "draft"):
        if role in models:
            d = models[role]
            rows.append([role, f"{d['name']}, {d['precision']} weights ({size(d['size_on_disk_bytes'])}), KV cache {d['kv_cache_precision']}, {d['device']}"])
    return "## Machine and models\n\n" + table(["", ""], rows)


def _costs(results: dict, plots: dict) -> str:
    """This machine's cost curve and the plan the planner made from it."""
    c = results.get("costs")
    if not c:
        return ""
    t1 = c["target_s"][0]
    rows = [[str(n), f"{s * 1e3:.1f} ms", f"{s / t1:.2f}"] for n, s in enumerate(c["target_s"], start=1)]
    draft = ", ".join(f"{s * 1e3:.1f} ms" for s in c.get("draft_s", []))
    plan = results.get("plan", {})
    text = (
        "## This machine's cost curve and the plan\n\n"
        f"Measured at warm-up ({results.get('warm_up_s', 0):.1f} s, not part of any lane's time) on {c['cpu']}: one target "
        "call scoring n tokens after a 64-token prompt (fastest of 7), in milliseconds and in single steps. A draft step "
        f"(1 and 2 tokens): {draft or '–'}; prefill {c['target_prefill_tps']:.0f} tokens/s (target), "
        f"{c.get('draft_prefill_tps', 0):.0f} tokens/s (draft); a KV-cache rollback {c['target_rollback_s'] * 1e3:.1f} ms "
        f"(target), {c.get('draft_rollback_s', 0) * 1e3:.1f} ms (draft).\n\n"
        + table(["n", "t(n)", "t(n) / t(1)"], rows)
    )
    if plan:
        text += f"\n\n**The plan** for the first code instruction (α prior {plan['alpha']:.2f}): {plan['reason']}"
    return text + _image(plots, "costs", "Cost of scoring n tokens in one target call, in single steps")


def _vocab(vocab: dict | None) -> str:
    if not vocab:
        return ""
    rows = _sweep_rows(vocab["rows"], [[r["label"], f"{r['rows_kept']:,}", ms_value(r["draft_step_costed_s"])] for r in vocab["rows"]])
    return (
        f"### A cheaper draft: its LM head trimmed to the most frequent tokens\n\nN = {vocab['max_new_tokens']}, auto K. "
        "The head keeps the N most frequent tokens of Python's standard library and the examples, plus every special "
        "and single-byte token; the target still checks every token, so greedy output is unchanged.\n\n"
        + table(["draft head", "rows kept", "draft step (warm-up)", *_SWEEP_HEADER], rows)
    )


def k_text(section: dict) -> str:
    """How a section's lanes chose K: its label when the run let the planner choose, else "K = n"."""
    return section.get("k_label") or f"K = {section['k']}"


def ms_value(seconds: float) -> str:
    return "–" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def _headlines(sections: dict) -> str:
    """The few figures a reader came for, each pointing at the section that has the detail."""
    lines = []
    paper = sections.get("paper")
    if paper:
        n = max(paper["by_tokens"], key=int)
        f = paper["by_tokens"][n]
        speedup = f["speedup"]
        text = f"Speculative decoding ({k_text(paper)}, N = {n}) is **{speedup['ours speculative']['median']:.2f}×** faster than autoregressive"
        text += f" (GenAI's C++ pipeline: {speedup['GenAI speculative']['median']:.2f}×"
        text += f"; the paper: {f['paper']['speedup']:.2f}×)" if "paper" in f else ")"
        lines.append(text + " (§1).")
        ratios = f["ratios"]
        lines.append(
            f"Our speculative loop takes **{ratios['ours speculative / GenAI speculative']['median']:.2f}×** the time of GenAI's "
            f"speculative pipeline; our autoregressive loop {ratios['ours autoregressive / GenAI autoregressive']['median']:.2f}× "
            "that of GenAI's plain pipeline (§2)."
        )
        lines.append(f"Outside model calls our loop spends {percent(f['time_shares']['ours speculative']['our Python'])} of wall time (§6).")
    hf = sections.get("transformers")
    if hf and "ratios" in hf:
        ratio = hf["ratios"]["transformers assisted / ours speculative"]
        lines.append(f"transformers assisted generation (float32 PyTorch) takes **{ratio['median']:.1f}×** our time per token (§2).")
    k = sections.get("k")
    if k:
        fixed = [r for r in k["rows"] if r["label"].startswith("K=")]
        best = max(fixed, key=lambda r: r["measured_speedup"]["median"])
        adaptive = [r for r in k["rows"] if r["label"] == "adaptive K"]
        text = f"Best fixed K: {best['label'][2:]} at {best['measured_speedup']['median']:.2f}× (Leviathan: {best['leviathan_speedup']:.2f}×)"
        text += f"; adaptive K: {adaptive[0]['measured_speedup']['median']:.2f}×" if adaptive else ""
        lines.append(text + " (§3).")
    precision = sections.get("precision")
    if precision:
        best = max(precision["rows"], key=lambda r: r["measured_speedup"]["median"])
        lines.append(
            f"Best weight precisions: target {best['target']} + draft {best['draft']} at {best['measured_speedup']['median']:.2f}× over that target alone (§3)."
        )
    lookup = sections.get("lookup")
    if lookup:
        cells = [f"{r['label']} {r.get('vs_ours_autoregressive', r['measured_speedup'])['median']:.2f}×" for r in lookup["rows"]]
        lines.append("On edits that repeat their input, speedup over our autoregressive loop: " + ", ".join(cells) + " (§4).")
    memory = sections.get("memory")
    if memory:
        extra = memory["speculative"]["peak_rss_generating_bytes"] - memory["autoregressive"]["peak_rss_generating_bytes"]
        lines.append(f"Speculative decoding needs {size(extra)} more peak RSS than autoregressive: the draft's weights and KV cache (§5).")
    return "## Headlines\n\n" + "\n".join(f"* {line}" for line in lines) if lines else ""


def _targets(results: dict) -> str:
    targets = results.get("targets", [])
    if not targets:
        return ""
    rows = []
    for t in targets:
        verdict = "met" if t["met"] else f"**missed** by {abs(t['gap']) * 100:.0f} %"
        if t["unit"] == "share":
            goal, measured = f"{t['sense']} {percent(t['goal'], 0)}", percent(t["measured"])
        else:
            goal, measured = f"{t['sense']} {t['goal']:g}", f"{t['measured']:.2f}"
        rows.append([t["target"], t["where"], goal, measured, verdict])
    notes = [diagnose(t, results["sections"]) for t in targets if not t["met"]]
    text = "## Targets\n\n" + table(["target", "where", "goal", "measured (median)", "verdict"], rows)
    if notes:
        text += "\n\n" + "\n\n".join(note for note in notes if note)
    return text


def diagnose(target: dict, sections: dict) -> str:
    """For a missed target: what the time breakdown, the round costs and the sweeps point to."""
    paper = sections.get("paper", {}).get("by_tokens", {})
    if not paper:
        return ""
    longest = paper[max(paper, key=int)]
    shares = longest["time_shares"]["ours speculative"]
    where = ", ".join(f"{name} {percent(shares[name], 0)}" for name in COMPONENTS)
    name = target["target"]
    if name.startswith("speculative speedup"):
        spec = longest["speculative"]
        k_rows = sections.get("k", {}).get("rows", [])
        if name.endswith("best K") and k_rows:
            spec = next(r for r in k_rows if r["label"] == target["where"])
        return f"*Speedup ({target['where']}):* " + _round_costs(spec, longest["autoregressive_step_s"], target) + f" Wall time: {where}."
    if name.startswith("our speculative / GenAI"):
        ar_ratio = longest["ratios"].get("ours autoregressive / GenAI autoregressive", {}).get("median", math.nan)
        text = (
            f"*Against GenAI ({target['where']}):* our speculative loop takes {target['measured']:.2f}× GenAI's time, and our "
            f"autoregressive loop {ar_ratio:.2f}× GenAI's plain pipeline, with {percent(shares['our Python'])} of our time in "
            f"Python: the gap is in the model calls, the same IR run through our stateful model vs GenAI's paged-attention one."
        )
        kv = sections.get("kv", {}).get("rows", [])
        if kv:
            steps = ", ".join(f"{r['kv_cache_precision']} {r['autoregressive_step_s'] * 1000:.1f} ms" for r in kv)
            text += f" The KV cache sweep (§3) points at one cause: our autoregressive step with each KV cache precision is {steps}."
        return text
    if name.startswith("our loop"):
        return f"*Overhead ({target['where']}):* {where}."
    return ""


def _round_costs(spec: dict, step_s: float, target: dict) -> str:
    """One speculative round's model calls against autoregressive steps, and what the goal needs."""
    k, tokens = spec["mean_k"], spec["tokens_per_call"]["median"]
    draft_s, verify_s = spec["draft_step_s"]["median"], spec["target_step_s"]["median"]
    round_s = k * draft_s + verify_s
    budget_s = tokens * step_s / target["goal"]
    return (
        f"a round drafts {k:.1f} tokens ({k:.1f} × {draft_s * 1000:.1f} ms) and verifies them in one call "
        f"({verify_s * 1000:.1f} ms), emitting {tokens:.2f} tokens: {round_s / tokens * 1000:.1f} ms per token against "
        f"{step_s * 1000:.1f} ms per autoregressive step, {call_speedup(tokens, k, draft_s, verify_s, step_s):.2f}× from "
        f"model calls alone (measured {target['measured']:.2f}× with prefills and Python). {target['goal']:g}× needs a round "
        f"of ≤ {budget_s * 1000:.1f} ms, {(round_s - budget_s) * 1000:.1f} ms less. Leviathan's formula predicts "
        f"{spec['leviathan_speedup']:.2f}× from α = {spec['alpha']:.2f} and c = {spec['c']:.3f} because it prices a verify "
        f"call at one autoregressive step; here it costs {verify_s / step_s:.2f}×; at 1× the calls would give "
        f"{call_speedup(tokens, k, draft_s, step_s, step_s):.2f}×."
    )


def _paper(paper: dict | None, plots: dict) -> str:
    if not paper:
        return ""
    rows = []
    for n, f in paper["by_tokens"].items():
        lanes = f["lanes"]
        row = [
            n,
            seconds(lanes["ours autoregressive"]["wall_s"]),
            seconds(lanes["ours speculative"]["wall_s"]),
            times(f["speedup"]["ours speculative"]),
            seconds(lanes["GenAI autoregressive"]["wall_s"]),
            seconds(lanes["GenAI speculative"]["wall_s"]),
            times(f["speedup"]["GenAI speculative"]),
        ]
        p = f.get("paper")
        row += [f"{p['autoregressive_s']:.2f} s", f"{p['speculative_s']:.2f} s", f"{p['speedup']:.2f}×"] if p else ["–"] * 3
        rows.append(row)
    header = ["N", "ours AR", "ours spec", "ours speedup", "GenAI AR", "GenAI spec", "GenAI speedup", "paper AR", "paper spec", "paper speedup"]
    text = (
        f"## 1. The paper's experiment\n\nDecode time for N new tokens, autoregressive (AR) vs speculative (spec, "
        f"{k_text(paper)}{', adaptive' if paper['adaptive'] else ''}), median (min–max) over the code instructions. The paper "
        "ran Dolly v2 12B with a 3B draft on other hardware: compare speedups, not seconds.\n\n" + table(header, rows)
    )
    return text + _image(plots, "paper", "Speedup over autoregressive: ours, GenAI, the paper")


def _peers(paper: dict | None, hf: dict | None, plots: dict) -> str:
    if not paper and not hf:
        return ""
    text = "## 2. Peers in the same run\n\n"
    if paper:
        n = max(paper["by_tokens"], key=int)
        f = paper["by_tokens"][n]
        rows = []
        for lane, figures in f["lanes"].items():
            acceptance = f["speculative"]["alpha"] if lane == "ours speculative" else f["genai_acceptance"].get(lane)
            rows.append(
                [
                    lane,
                    seconds(figures["wall_s"]),
                    ms(figures["per_token_s"]),
                    f"{figures['tokens']['median']:.0f}",
                    percent(acceptance, 0) if acceptance is not None else "–",
                    figures["same_as_reference"],
                ]
            )
        text += (
            f"OpenVINO GenAI `LLMPipeline` on our converted IR folders, fed the same prompt token ids "
            f"(chat template applied once, by us), greedy, N = {n}, {k_text(paper)}, its default continuous-batching "
            "backend with prefix caching off (it would skip the prefill of a prompt seen before), and our compile "
            "properties (f32 inference precision, our KV cache precision).\n\n"
            + table(["lane", "wall time", "per token", "tokens", "acceptance", "same tokens as ours AR"], rows)
        )
        ratio_rows = [[name, times(spread, 3)] for name, spread in f["ratios"].items()]
        defaults = paper.get("genai_defaults")
        if defaults:
            where = f"N = {defaults['max_new_tokens']}, {defaults['lanes']['ours speculative']['wall_s']['n']} instructions"
            ratio_rows += [[f"{name} ({where})", times(spread, 3)] for name, spread in defaults["ratios"].items()]
        text += (
            "\n\nTime ratios, per instruction then median (below 1 means ours is faster). \"its defaults\" is GenAI with no "
            "compile properties of ours (on this CPU that means bf16 inference), in a separate shorter pass:\n\n"
            + table(["ratio", "median (min–max)"], ratio_rows)
        )
    if hf:
        text += "\n\n" + _transformers(hf)
    return text + _image(plots, "peers", "Milliseconds per new token, by lane")


def _transformers(hf: dict) -> str:
    if "skipped" in hf:
        return f"transformers: skipped ({hf['skipped']})."
    rows = [[lane, seconds(f["wall_s"]), ms(f["per_token_s"]), f"{f['tokens']['median']:.0f}", f["same_as_reference"]] for lane, f in hf["lanes"].items()]
    ratio_rows = [[name, times(spread)] for name, spread in hf["ratios"].items()]
    ratio_rows += [[f"{who} speedup (AR / speculative)", times(spread)] for who, spread in hf["speedup"].items()]
    return (
        f"transformers {hf['dtype']} on PyTorch CPU, the weights our IRs were converted from (GGUF dequantized, before "
        f"NNCF compression), `generate()` and `assistant_model=` with exactly K = {hf['k']} assistant tokens per round, "
        f"N = {hf['max_new_tokens']}. Its tokens can differ from ours where int8 rounding flips a near-tie, so ratios use "
        "time per token. \"same tokens\" compares transformers assisted with transformers AR, the others with ours AR.\n\n"
        + table(["lane", "wall time", "per token", "tokens", "same tokens as reference"], rows)
        + "\n\n"
        + table(["ratio (per token)", "median (min–max)"], ratio_rows)
    )


def _sweep_rows(rows: list[dict], first: list[str]) -> list[list[str]]:
    return [
        [
            *first_cells,
            "–" if math.isnan(r["alpha"]) else f"{r['alpha']:.2f}",
            f"{r['c']:.3f}" if r["c"] else "–",
            f"{r['mean_k']:.1f}" if r["mean_k"] else "–",
            f"{r['leviathan_speedup']:.2f}×" if r["c"] else "–",
            times(r["predicted_speedup"]) if r.get("predicted_speedup", {}).get("n") else "–",
            times(r["measured_speedup"]),
            _error(r.get("prediction_error")),
            ms(r["per_token_s"]),
            r["same_as_reference"],
        ]
        for first_cells, r in zip(first, rows)
    ]


_SWEEP_HEADER = ["α̂", "c", "mean K", "Leviathan", "predicted (this machine)", "measured speedup", "prediction error",
                 "per token", "same tokens as AR"]


def _error(spread: dict | None) -> str:
    if not spread or not spread.get("n"):
        return "–"
    return f"{spread['median']:+.0%} ({spread['min']:+.0%} to {spread['max']:+.0%})"


def _k(k: dict | None, plots: dict) -> str:
    if not k:
        return ""
    rows = _sweep_rows(k["rows"], [[r["label"]] for r in k["rows"]])
    for row, r in zip(rows, k["rows"]):
        row += [times(r["genai_speedup"]) if "genai_speedup" in r else "–", times(r["ours_over_genai"], 3) if "ours_over_genai" in r else "–"]
    text = (
        f"## 3. Sweeps\n\n### Draft length K\n\nN = {k['max_new_tokens']}, the default pair. α̂ = accepted / (accepted + "
        "rounds that ended in a rejection), over all rounds; c = draft step / target verify call; Leviathan = "
        "(1 − α^(K+1)) / ((1 − α)(cK + 1)) with the measured α̂ and c, which prices a verify call at one step; predicted "
        "(this machine) = the planner's prediction from the measured cost curve, α̂, mean K, N and the prompt; measured = "
        "AR time / speculative time per instruction; prediction error = (predicted − measured) / measured. Auto K: the "
        "planner picks each round's K.\n\n"
        + table(["K", *_SWEEP_HEADER, "GenAI speedup", "ours / GenAI time"], rows)
    )
    return text + _image(plots, "k", "Measured and predicted speedup against K")


def _precision(precision: dict | None, plots: dict) -> str:
    if not precision:
        return ""
    rows = _sweep_rows(precision["rows"], [[r["target"], r["draft"], size(r["draft_bytes"])] for r in precision["rows"]])
    for row, r in zip(rows, precision["rows"]):
        row.insert(3, ms(r["reference_per_token_s"]))
    text = (
        f"### Weight precision\n\nN = {precision['max_new_tokens']}, {k_text(precision)}. Each speedup is over the same "
        "target decoding alone (AR per token shown); \"same tokens\" compares with that target's own AR output.\n\n"
        + table(["target", "draft", "draft size", "AR per token", *_SWEEP_HEADER], rows)
    )
    return text + _image(plots, "precision", "Measured and predicted speedup by weight precision")


def _kv(kv: dict | None) -> str:
    if not kv:
        return ""
    rows = _sweep_rows(kv["rows"], [[r["kv_cache_precision"]] for r in kv["rows"]])
    for row, r in zip(rows, kv["rows"]):
        row.insert(1, f"{r['autoregressive_step_s'] * 1000:.1f} ms")
        row.insert(2, size(r["kv_cache_bytes"]["median"]))
    return (
        f"### KV cache precision\n\nBoth models' KV cache in the given element type (OpenVINO `KV_CACHE_PRECISION`), "
        f"N = {kv['max_new_tokens']}, {k_text(kv)}; KV bytes are both caches at the end of a speculative run.\n\n"
        + table(["KV cache", "AR step", "KV bytes", *_SWEEP_HEADER], rows)
    )


def _lookup(lookup: dict | None) -> str:
    if not lookup:
        return ""
    rows = _sweep_rows(lookup["rows"], [[r["label"]] for r in lookup["rows"]])
    for row, r in zip(rows, lookup["rows"]):
        row.append(times(r["vs_ours_autoregressive"]) if "vs_ours_autoregressive" in r else times(r["measured_speedup"]))
    return (
        "## 4. Prompt lookup vs draft model\n\nEdits whose answer repeats the code in the prompt (add type hints, rename "
        f"a parameter, add docstrings), N = {lookup['max_new_tokens']}, K = {lookup['k']}. Speedups are over the same "
        "framework's autoregressive lane; the last column is over ours. Prompt lookup has no draft model, so c is ~0.\n\n"
        + table(["drafter", *_SWEEP_HEADER, "speedup over ours AR"], rows)
    )


def _memory(memory: dict | None) -> str:
    if not memory:
        return ""
    rows = []
    for mode in ("autoregressive", "speculative"):
        m = memory[mode]
        kv = ", ".join(f"{model} {size(b)}" for model, b in m["kv_cache_bytes"].items())
        rows.append(
            [mode, size(m["rss_loaded_bytes"]), size(m["peak_rss_generating_bytes"]), size(m["peak_rss_process_bytes"]), size(m["private_bytes"]), kv]
        )
    return (
        f"## 5. Memory\n\nEach mode in a fresh process (the autoregressive one loads no draft), {memory['max_new_tokens']} "
        "new tokens. Peak while generating is sampled every 5 ms; the process peak includes loading and compiling. "
        "RSS includes the memory-mapped IR weight files; \"private\" (RSS minus file-backed pages, at the end) does not.\n\n"
        + table(["mode", "RSS after load", "peak RSS generating", "peak RSS of process", "private", "KV cache at end"], rows)
    )


def _breakdown(paper: dict | None, plots: dict) -> str:
    if not paper:
        return ""
    n = max(paper["by_tokens"], key=int)
    f = paper["by_tokens"][n]
    shares = f["time_shares"]
    rows = [[name, percent(shares["ours speculative"][name]), percent(shares["ours autoregressive"][name])] for name in COMPONENTS]
    spec = f["speculative"]
    return (
        f"## 6. Where the time goes\n\nShares of wall time summed over the N = {n} runs of section 1. \"our Python\" is "
        "everything outside model calls and cache rollbacks: the loop, acceptance, copying logits out of the plugin, "
        f"incremental detokenizing. Verify call {ms(spec['target_step_s'])}, draft step {ms(spec['draft_step_s'])}, "
        f"autoregressive step {f['autoregressive_step_s'] * 1000:.1f} ms; tokens per verify call "
        f"{spec['tokens_per_call']['median']:.2f}; accepted drafts per round (0..K): {spec['accepted_histogram']}.\n\n"
        + table(["component", "speculative", "autoregressive"], rows)
        + _image(plots, "breakdown", "Shares of wall time")
    )


def _method(results: dict) -> str:
    b = results["bench"]
    return (
        "## Method\n\n"
        f"* Instructions: the first {b['instructions']} code instructions of `specdemo/bench.py` (transformers: the "
        f"first {b['transformers_instructions']}; prompt lookup: {b['lookup_instructions']} edit instructions), "
        f"{b['repeats']} pass(es), greedy decoding, our chat template applied once and the same token ids given to every lane.\n"
        f"* Warm-up: every lane generates {b['warmup_tokens']} tokens before anything is timed.\n"
        "* Interleaving: for each instruction all lanes of a section run back to back, so the shared machine's load "
        "affects them alike; ratios are computed per instruction, then summarised as median (min–max).\n"
        "* Times are wall-clock seconds of the whole generate call, prompt ids in hand to the last token (prefill included).\n"
        "* α, c and the time breakdown come from our own per-call timers (`Summary` in `specdemo/events.py`)."
    )


def _image(plots: dict, name: str, alt: str) -> str:
    return f"\n\n![{alt}]({plots[name]})" if name in plots else ""
