"""Every figure a run shows, described once: its label, unit and format, and (for the glossary) its formula and what
other tools call it. The page, the CLI, `show` and the bench say and format a figure only through its description
here, so a label cannot drift between them; specdemo/results/metrics.py derives the values.

    figure("alpha_hat").label                 # "α̂ (acceptance)"
    figure("verify_call_s").format(0.0612)    # "61 ms"
    figure("measured_speedup").format(1.9)    # "1.90×"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from specdemo.names import AUTOREGRESSIVE, SPECULATIVE

BOTH = "both"  # each lane has its own, shown side by side
PAIR = "pair"  # one figure of the two lanes together


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
    lane: str = SPECULATIVE  # whose summary holds it: a lane's name, BOTH or PAIR
    places: tuple[str, ...] = ()  # where it appears (TABLE, SPECULATION, RESULTS, SHOW below)
    drafted_only: bool = False  # means nothing when the lane drafted nothing: written "–" then
    unknown_at_zero: bool = False  # 0 means "not known" (a prediction without this machine's costs): written "–"

    def format(self, value, unit: bool = True) -> str:
        """`value` as every renderer writes it ("–" for none); `unit` False leaves the unit to a column's header."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, (list, tuple)):  # by position: 0 where nothing was drafted there (metrics), so not shown
            return " ".join(self.format(v, unit=False) for v in value if v) or "–"
        if self.unit == "%":
            return f"{value:.{self.digits}%}"
        number = f"{value * 1000 if self.unit == 'ms' else value:,.{self.digits}f}"
        if not unit or not self.unit:
            return number
        return f"{number}×" if self.unit == "×" else f"{number} {self.unit}"

    def heading(self) -> str:
        """The label with its unit, for a column whose cells leave it out ("verify call (ms)")."""
        return f"{self.label} ({self.unit})" if self.unit not in ("", "%", self.label) else self.label


# Where a figure appears: each renderer shows the figures placed there, in this order, so adding a figure to the page,
# the CLI and `show` is adding its description here.
TABLE = "table"  # the CLI's summary table, both lanes side by side
SPECULATION = "speculation"  # the CLI's line of the speculative lane's own figures
RESULTS = "results"  # the page's headline tiles when a run is done
SHOW = "show"  # `show`'s table of saved runs
EVERYWHERE = (RESULTS, SPECULATION, SHOW)

FIGURES = (
    Figure("tokens", "tokens", digits=0, lane=BOTH, places=(TABLE, SHOW)),
    Figure("wall_s", "wall time", "s", lane=BOTH, places=(TABLE,)),
    Figure("ttft_s", "time to first token", "s", lane=BOTH, places=(TABLE,),
           formula="seconds from the prompt in hand to the first token",
           genai="get_ttft()", vllm="time_to_first_token", llamacpp="prompt_ms (prefill only)"),
    Figure("tpot_s", "time per output token", "ms", 1, lane=BOTH, formula="(wall time − TTFT) ÷ (tokens − 1)",
           genai="get_tpot()", vllm="time_per_output_token", llamacpp="predicted_per_token_ms"),
    Figure("tokens_per_s", "tokens/s", "tokens/s", 1, lane=BOTH, places=(TABLE, SHOW)),
    Figure("target_calls", "target calls", digits=0, lane=BOTH, places=(TABLE,)),
    Figure("measured_speedup", "measured speedup", "×", lane=PAIR, places=(RESULTS, SHOW),
           formula="speculative tokens/s ÷ autoregressive tokens/s, each lane from prompt to last token",
           papers="speedup (Spec-Bench: walltime ratio)"),
    Figure("predicted_speedup", "predicted speedup", "×", places=(RESULTS, SHOW), unknown_at_zero=True,
           formula="this machine's measured call costs at the run's acceptance by position, mean K, N and prompt "
                   "(planner.py)"),
    Figure("mean_acceptance_length", "mean acceptance length", places=EVERYWHERE,
           formula="tokens ÷ target calls, after the prefill (the target's own token included; a round at K = 0 "
                   "counts as 1)",
           vllm="1 + num_accepted_tokens ÷ num_drafts (rounds that drafted only)", sglang="spec_accept_length",
           papers="τ (EAGLE), mean accepted tokens (Spec-Bench)"),
    Figure("alpha_hat", "α̂ (acceptance)", places=EVERYWHERE, drafted_only=True,
           formula="accepted ÷ (accepted + rounds that ended in a rejection)",
           papers="α, Leviathan et al. (its maximum-likelihood estimate)"),
    Figure("draft_acceptance_rate", "draft acceptance rate", "%", 0, places=(SPECULATION,), drafted_only=True,
           formula="accepted ÷ proposed",
           genai="get_num_accepted_tokens() ÷ get_num_draft_tokens()", vllm="num_accepted_tokens ÷ num_draft_tokens",
           llamacpp="draft_n_accepted ÷ draft_n", sglang="spec_accept_rate"),
    Figure("mean_k", "mean K", digits=1, places=(SPECULATION, SHOW)),
    Figure("acceptance_by_position", "acceptance by position", places=(SPECULATION,), drafted_only=True,
           formula="for i = 1 … K: rounds that kept their i-th draft ÷ rounds that drafted one",
           vllm="num_accepted_tokens_per_pos ÷ num_drafts", llamacpp="#acc rate/pos"),
    Figure("draft_cost", "draft cost c", digits=3, drafted_only=True,
           formula="a draft step ÷ a single target step", papers="c, Leviathan et al."),
    Figure("target_step_s", "autoregressive step", "ms", 0, lane=AUTOREGRESSIVE, places=(SPECULATION, SHOW)),
    Figure("verify_call_s", "verify call", "ms", 0, places=(SPECULATION, SHOW), drafted_only=True),
    Figure("draft_step_s", "draft step", "ms", 1, places=(SPECULATION, SHOW), drafted_only=True),
    Figure("leviathan_speedup", "Leviathan's speedup", "×", drafted_only=True,
           formula="(1 − α̂^(K+1)) ÷ ((1 − α̂)(c·K + 1)), K = mean K",
           papers="eq. 1, Leviathan et al. (a verify call priced at one step)"),
)
_BY_KEY = {f.key: f for f in FIGURES}
GLOSSARY = tuple(f for f in FIGURES if f.formula)


def figure(key: str) -> Figure:
    return _BY_KEY[key]


def placed(place: str) -> list[Figure]:
    """The figures a renderer shows at `place`, in order."""
    return [f for f in FIGURES if place in f.places]


def value(f: Figure, summaries: dict):
    """The value of `f` in a run, from its lanes' summaries ({lane: metrics.Summary, or its dict from a run file});
    None where it means nothing (a drafting figure of a lane that drafted nothing). A BOTH figure: the speculative
    lane's (ask per lane for the other)."""
    from specdemo.results.metrics import measured_speedup

    lanes = {lane: SimpleNamespace(**s) if isinstance(s, dict) else s for lane, s in summaries.items()}
    if f.lane == PAIR:
        return measured_speedup(lanes[AUTOREGRESSIVE], lanes[SPECULATIVE])
    if f.drafted_only and not lanes[SPECULATIVE].rounds:
        return None
    found = getattr(lanes[SPECULATIVE if f.lane == BOTH else f.lane], f.key, None)
    return None if f.unknown_at_zero and not found else found


def glossary_markdown() -> str:
    """The glossary as a markdown table (docs/figures.md carries it; the page shows it behind an info control)."""
    rows = ["| figure | formula | OpenVINO GenAI | vLLM | llama.cpp | SGLang | papers |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in GLOSSARY:
        rows.append(f"| {f.label} (`{f.key}`) | {f.formula} | {f.genai} | {f.vllm} | {f.llamacpp} | {f.sglang} | "
                    f"{f.papers} |")
    return "\n".join(rows)
