"""Gated rounds on curves we do not have (issue 48, item 3): where no fixed K pays, does a lane that verifies a round
only when the draft is confident enough take part of what the per-round oracle says?

Every lane runs here, greedy, its calls priced on a synthetic compute-bound curve (pricing.priced_round), never timed:
this machine's own curve may be memory-bound, where gating is never planned. The gated lane is planned on that curve
too, at the acceptance the other instructions' answers teach (leave one out: what earlier runs on such a machine would
have taught), and must write the autoregressive text token for token. Beside it, from one teacher-forced draft pass
over the autoregressive answer (results/counterfactual.py): the per-round oracle, the best fixed K and the gated walk.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdemo.bench.report_tables import table
from specdemo.bench.schema import Figures, Sections
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED_STRATEGY
from specdemo.decoding.planner import gated_plan, make_plan, with_confidence_stop
from specdemo.decoding.pricing import Acceptance, gate_threshold, priced_round
from specdemo.learning.profile.acceptance import PRIOR_WEIGHT
from specdemo.results.counterfactual import autoregressive_seconds, draft_pass, mask_counts, walk_fixed, walk_oracle
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy

T1 = 0.1  # seconds of one target step on the synthetic curves (only ratios are reported)


def synthetic_curve(slope: float, draft_steps: float, n_max: int = 13) -> CostModel:
    """t(n) = t(1) (1 + slope (n − 1)); a draft step `draft_steps` target steps. A prefill is compute-bound too, at
    twice the rate of the curve's own slope (a prompt's larger matrices use the cores better than a verify call's),
    the draft's faster by its step's ratio."""
    target = tuple(T1 * (1 + slope * (n - 1)) for n in range(1, n_max + 1))
    prefill_tps = 2 / (T1 * slope)
    return CostModel(target_s=target, target_prefill_tps=prefill_tps, target_rollback_s=0.0,
                     draft_s=(T1 * draft_steps, T1 * draft_steps * 1.05), draft_prefill_tps=prefill_tps / draft_steps,
                     cpu="synthetic")


CURVES = {  # name -> curve: the edge, and the Zen 3 (AVX2 only) it was written on
    "t(5) = 2.4 steps, draft 0.40": synthetic_curve(0.35, 0.40),
    "t(5) = 2.7 steps, draft 0.45 (Zen 3)": synthetic_curve(0.425, 0.45),
}


@dataclass
class Row:
    """One instruction on one curve: each speedup is autoregressive seconds ÷ the lane's, priced on the curve."""

    curve: str
    instruction: str
    tokens: int  # the autoregressive answer's length
    alpha: float  # the prior acceptance of the first draft the plans were made at (leave one out)
    oracle: float  # the per-round oracle (teacher forced)
    best_fixed: float  # the best fixed K (teacher forced), and its K
    best_k: int
    planned: str  # what the planner chose at that prior: "K = 0", "K = 3", "gated K = 2"
    lane: float  # the speculative lane as planned, run here and priced (1.0 at K = 0: the target alone)
    gated: float  # the gated lane (gated_plan), run here and priced; 0.0 where even a perfect gate cannot pay
    gated_walk: float  # the same, walked over the answer (the counterfactual's gated walk at its K)
    drafted: int  # of the gated lane's rounds, those verified as draft rounds …
    turned_back: int  # … and those the gate turned back to plain steps
    stopped: bool  # whether the gated lane stopped gating (GatedK: it cost 2 steps)
    same_text: bool  # the gated lane wrote the autoregressive text, token for token


def leave_one_out(masks: list[list[int]], i: int, k_max: int) -> Acceptance:
    """The acceptance the other answers' match masks teach (the profile's pooling: acceptance.py), for answer i."""
    others = [mask_counts(mask, k_max) for j, mask in enumerate(masks) if j != i] or [([0] * k_max, [0] * k_max)]
    tested, accepted = ([sum(column) for column in zip(*counts)] for counts in zip(*others))  # position by position
    return Acceptance.from_counts(tested, accepted, Acceptance.geometric(MASKED_STRATEGY.planning.default_alpha),
                                  weight=PRIOR_WEIGHT)


def priced_speedup(costs: CostModel, autoregressive, speculative) -> float:
    return sum(priced_round(costs, r) for r in autoregressive.rounds) / sum(priced_round(costs, r) for r in speculative.rounds)


def gating_rows(engine, instructions: list[str], max_new_tokens: int = 200, k_max: int = 8, log=print) -> list[Row]:
    """Every instruction on every curve (CURVES): the autoregressive answer and its draft pass once per instruction,
    then per curve the planned lane and the gated lane, run and priced."""
    generation = GenerationSettings(max_new_tokens=max_new_tokens, k_policy=KPolicy.auto(k_max))
    answers = []
    for instruction in instructions:
        ids = engine.prompt_ids(instruction, generation)
        ar = drain(engine.autoregressive_ids(ids, generation))
        with engine.lock:
            mask, confidence = draft_pass(engine.draft.runtime, ids, ar.ids)
        answers.append((instruction, ids, ar, mask, confidence))
        log(f"gating: {instruction[:50]}: {len(ar.ids)} tokens, {sum(mask) / len(mask):.2f} of them the draft's")
    masks = [a[3] for a in answers]
    rows = []
    for name, costs in CURVES.items():
        for i, (instruction, ids, ar, mask, confidence) in enumerate(answers):
            prior = leave_one_out(masks, i, k_max)
            ar_s = autoregressive_seconds(costs, len(ids), len(ar.ids))
            args = (costs, len(ids), max_new_tokens, ar_s)
            best = max((walk_fixed(mask, k, *args) for k in range(1, k_max + 1)), key=lambda w: w.speedup)
            plan = with_confidence_stop(make_plan(costs, MASKED_STRATEGY, prior, generation.k_policy), None)
            lane = priced_speedup(costs, ar, drain(engine.speculative_ids(ids, generation, plan))) if plan.k else 1.0
            gated = gated_plan(costs, MASKED_STRATEGY, prior, generation.k_policy)
            planned = f"{'gated ' if plan.gate else ''}K = {plan.k}"
            row = Row(name, instruction, len(ar.ids), prior.rate(1), walk_oracle(mask, k_max, *args).speedup,
                      best.speedup, best.k, planned, lane, 0.0, 0.0, 0, 0, False, True)
            if gated is not None:
                gated = with_confidence_stop(gated, None)
                run = drain(engine.speculative_ids(ids, generation, gated))
                walk = walk_fixed(mask, gated.k, *args, confidence, gated.stops, gate_threshold(costs))
                row.gated, row.gated_walk = priced_speedup(costs, ar, run), walk.speedup
                row.drafted, row.turned_back = run.summary.rounds, run.summary.gated
                row.stopped, row.same_text = run.rounds[-1].k == 0, run.ids == ar.ids
            rows.append(row)
            log(f"gating: {name}: {instruction[:40]}: oracle {row.oracle:.2f}×, best fixed {row.best_fixed:.2f}×, "
                f"planned {row.planned} {row.lane:.2f}×, gated {row.gated:.2f}×")
    return rows


@dataclass(frozen=True)
class Gating(Figures):
    max_new_tokens: int
    curves: dict[str, dict]  # CURVES, each CostModel.to_dict()
    rows: list[Row]


def run_gating(ctx) -> Gating:
    """The bench section (opt-in: --only gating): the code instructions at the sweeps' N."""
    rows = gating_rows(ctx.engine, ctx.code_instructions(), ctx.sweep_tokens, log=ctx.log)
    return Gating(ctx.sweep_tokens, {name: c.to_dict() for name, c in CURVES.items()}, rows)


def gating_section(sections: Sections, plots: dict, runs=()) -> str:
    """One line per instruction and curve."""
    if not (gating := sections.gating):
        return ""
    rows = [[r.curve, r.instruction[:48], str(r.tokens), f"{r.alpha:.2f}", f"{r.oracle:.2f}×",
             f"{r.best_fixed:.2f}× (K = {r.best_k})", r.planned, f"{r.lane:.2f}×",
             *([f"{r.gated:.2f}×{' (stopped)' if r.stopped else ''}", f"{r.gated_walk:.2f}×",
                f"{r.drafted} of {r.drafted + r.turned_back}"] if r.gated else ["–"] * 3),
             "yes" if r.same_text else "NO"] for r in gating.rows]
    return ("### Gated rounds on compute-bound curves\n\nN = " + str(gating.max_new_tokens) + ". Each lane's calls "
            "priced on a synthetic curve (not timed): speedup = autoregressive seconds ÷ the lane's. Oracle and best "
            "fixed K: teacher forced on the autoregressive answer. Planned: the planner at the acceptance the other "
            "answers teach. Gated: the gated lane, run (a round's first draft verified only when the draft's "
            "confidence clears the curve's break-even; it stops gating once that has cost 2 target steps).\n\n"
            + table(["curve", "instruction", "tokens", "prior α", "oracle", "best fixed K", "planned", "lane", "gated",
                     "gated (walk)", "gated: drafted of rounds", "same text"], rows) + "\n")
