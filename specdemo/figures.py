"""Every figure a run shows, described once: its label, unit and format, and (for the glossary) its formula and what
other tools call it. The page, the CLI, `show` and the bench say and format a figure only through its description
here, so a label cannot drift between them; specdemo/metrics.py derives the values.

    figure("alpha_hat").label                 # "α̂ (acceptance)"
    figure("verify_call_s").format(0.0612)    # "61 ms"
    figure("measured_speedup").format(1.9)    # "1.90×"
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One figure: how every renderer names and writes it."""

    key: str  # the metrics.Summary field that holds it (or, for two lanes' ratio, the metrics function)
    label: str  # as the page, the CLI, `show` and the bench say it
    unit: str = ""  # "×", "%", "s", "ms", "tokens/s" or "" (a count or a plain ratio)
    digits: int = 2  # decimals shown (of the scaled value for "ms": seconds × 1000)
    formula: str = ""  # for the glossary: how metrics.py derives it ("" : not in the glossary)
    genai: str = "–"  # what OpenVINO GenAI calls it (extended_perf_metrics / perf_metrics); "–": it reports none
    vllm: str = "–"  # vLLM's spec-decode metrics
    llamacpp: str = "–"  # llama.cpp (server timings, speculative examples)
    sglang: str = "–"
    papers: str = "–"  # Spec-Bench, EAGLE, Leviathan et al.

    def format(self, value, unit: bool = True) -> str:
        """`value` as every renderer writes it ("–" for none); `unit` False leaves the unit to a column's header."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, (list, tuple)):
            return " ".join(self.format(v, unit=False) for v in value) or "–"
        if self.unit == "%":
            return f"{value:.{self.digits}%}"
        number = f"{value * 1000 if self.unit == 'ms' else value:,.{self.digits}f}"
        if not unit or not self.unit:
            return number
        return f"{number}×" if self.unit == "×" else f"{number} {self.unit}"

    def heading(self) -> str:
        """The label with its unit, for a column whose cells leave it out ("verify call (ms)")."""
        return f"{self.label} ({self.unit})" if self.unit not in ("", "%", self.label) else self.label


FIGURES = (
    Figure("tokens", "tokens", digits=0),
    Figure("wall_s", "wall time", "s"),
    Figure("ttft_s", "time to first token", "s", formula="seconds from the prompt in hand to the first token",
           genai="get_ttft()", vllm="time_to_first_token", llamacpp="prompt_ms (prefill only)"),
    Figure("tpot_s", "time per output token", "ms", 1, formula="(wall time − TTFT) ÷ (tokens − 1)", genai="get_tpot()",
           vllm="time_per_output_token", llamacpp="predicted_per_token_ms"),
    Figure("tokens_per_s", "tokens/s", "tokens/s", 1),
    Figure("target_calls", "target calls", digits=0),
    Figure("alpha_hat", "α̂ (acceptance)", formula="accepted ÷ (accepted + rounds that ended in a rejection)",
           papers="α, Leviathan et al. (its maximum-likelihood estimate)"),
    Figure("draft_acceptance_rate", "draft acceptance rate", "%", 0, formula="accepted ÷ proposed",
           genai="get_num_accepted_tokens() ÷ get_num_draft_tokens()", vllm="num_accepted_tokens ÷ num_draft_tokens",
           llamacpp="draft_n_accepted ÷ draft_n", sglang="spec_accept_rate"),
    Figure("mean_acceptance_length", "mean acceptance length",
           formula="tokens ÷ target calls, after the prefill (the target's own token included; a round at K = 0 "
                   "counts as 1)",
           vllm="1 + num_accepted_tokens ÷ num_drafts (rounds that drafted only)", sglang="spec_accept_length",
           papers="τ (EAGLE), mean accepted tokens (Spec-Bench)"),
    Figure("acceptance_by_position", "acceptance by position",
           formula="for i = 1 … K: rounds that kept their i-th draft ÷ rounds that drafted one",
           vllm="num_accepted_tokens_per_pos ÷ num_drafts", llamacpp="#acc rate/pos"),
    Figure("mean_k", "mean K", digits=1),
    Figure("draft_cost", "draft cost c", digits=3, formula="a draft step ÷ a single target step", papers="c, Leviathan et al."),
    Figure("target_step_s", "autoregressive step", "ms", 0),
    Figure("verify_call_s", "verify call", "ms", 0),
    Figure("draft_step_s", "draft step", "ms", 1),
    Figure("leviathan_speedup", "Leviathan's speedup", "×",
           formula="(1 − α̂^(K+1)) ÷ ((1 − α̂)(c·K + 1)), K = mean K",
           papers="eq. 1, Leviathan et al. (a verify call priced at one step)"),
    Figure("predicted_speedup", "predicted speedup", "×",
           formula="this machine's measured call costs at the run's acceptance by position, mean K, N and prompt "
                   "(planner.py)"),
    Figure("measured_speedup", "measured speedup", "×",
           formula="speculative tokens/s ÷ autoregressive tokens/s, each lane from prompt to last token",
           papers="speedup (Spec-Bench: walltime ratio)"),
)
_BY_KEY = {f.key: f for f in FIGURES}
GLOSSARY = tuple(f for f in FIGURES if f.formula)


def figure(key: str) -> Figure:
    return _BY_KEY[key]


def glossary_markdown() -> str:
    """The glossary as a markdown table (the README carries it; the page shows it behind an info control)."""
    rows = ["| figure | formula | OpenVINO GenAI | vLLM | llama.cpp | SGLang | papers |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in GLOSSARY:
        rows.append(f"| {f.label} (`{f.key}`) | {f.formula} | {f.genai} | {f.vllm} | {f.llamacpp} | {f.sglang} | "
                    f"{f.papers} |")
    return "\n".join(rows)
