"""Choosing how to speculate on this machine, and saying why: the plan for one run (its drafter and K), priced by
pricing.py, and the sentences a plan and the cost surface say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import strategy
from specdemo.decoding.pricing import Acceptance, best_k, break_even_alpha, confidence_stops, predicted_speedup
from specdemo.settings import KPolicy


def describe_acceptance(acceptance: Acceptance) -> str:
    """"α 0.92" for one rate; "acceptance 0.95 at the first draft … 0.81 at the 6th" for several."""
    rates = acceptance.rates
    if len(set(round(r, 2) for r in rates)) <= 1:
        return f"α = {rates[0]:.2f}"
    return f"acceptance {rates[0]:.2f} at the first draft … {rates[-1]:.2f} at the {_ordinal(len(rates))}"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def surface_sentence(costs: CostModel, k_max: int, run_alpha: float | None = None,
                     run_acceptance: Acceptance | None = None) -> str:
    """"On this machine drafts pay when α is above X; at this run's acceptance the best K is Y." The best K uses the
    run's acceptance by position when given: drafts are accepted in runs, not independently, so a geometric α̂
    undervalues long drafts."""
    thresholds = [a for k in range(1, k_max + 1) if (a := break_even_alpha(costs, k)) is not None]
    if not thresholds:
        return "On this machine no K pays, even if every draft were accepted."
    text = f"On this machine drafts pay when α is above {min(thresholds):.2f} (at the best K for it)"
    if run_alpha:
        acceptance = run_acceptance or Acceptance.geometric(run_alpha)
        k, speedup = best_k(costs, acceptance, k_max)
        where = f"this run's acceptance (α̂ = {run_alpha:.2f}{', by position' if run_acceptance else ''})"
        text += f"; at {where} the best K is {k} ({speedup:.2f}× predicted)" if k else f"; at {where} no K pays"
    return text + "."


# ---- the plan for one run


@dataclass(frozen=True)
class Plan:
    """How the speculative lane will run, and why. It travels beside the lane's result, never inside it:
    its figures are what the planner expected before the run, the summary's what the run measured."""

    drafter: str  # a strategy's name (specdemo/decoding/drafters): "model", "prompt-lookup" or "hybrid"
    k: int  # drafts in the first round; 0 = the target alone (speculation would not pay here)
    acceptance_prior: Acceptance  # the acceptance the plan assumed (what earlier runs on this machine taught)
    planned_speedup: float  # S(K) after the prompt, at that acceptance
    auto: bool  # True: K is re-chosen every round from the run's own evidence
    reason: str  # one sentence for the page and the CLI
    stops: tuple[float, ...] = ()  # the confidence stop the lane drafts with, per draft position (): off; confidence_stops


def fixed_k(policy: KPolicy, plan: Plan | None) -> int:
    """The one K of a lane that keeps K fixed (OpenVINO GenAI's pipeline, the bench's peers) beside ours: ours when
    fixed (adaptive K's first); under auto K the plan's first K, its K = 0 ("the target alone") becoming the policy's
    default K."""
    return (plan.k or policy.k) if policy.is_auto and plan is not None else policy.k


def describe_stops(stops: tuple[float, ...]) -> str:
    """"0.27" for one threshold; "0.27 at the 1st draft … 0.95 at the 11th" for several."""
    if len(set(stops)) <= 1:
        return f"{stops[0]:.2f}" if stops else "off"
    return f"{stops[0]:.2f} after the 1st draft … {stops[-1]:.2f} after the {_ordinal(len(stops))}"


def with_confidence_stop(plan: Plan, costs: CostModel, asked: float | None, k_max: int) -> Plan:
    """`plan` with the confidence stop its lane drafts with: `asked` (the settings' draft_p_min, one threshold at every
    position) when given; else, under auto K with the draft model, this machine's break-even per position
    (confidence_stops); else off."""
    if asked is not None:
        stops = (asked,) if asked else ()
    elif plan.auto and strategy(plan.drafter).needs_model and plan.k:
        stops = confidence_stops(costs, k_max)
    else:
        return plan
    if not stops:
        return plan  # off, as a plan is by default
    why = " (where a further draft costs more than it brings on this machine)." if asked is None else "."
    return replace(plan, stops=stops, reason=plan.reason + " A round's drafting stops once the draft's confidence in its "
                   f"drafts falls below {describe_stops(stops)}{why}")


def make_plan(costs: CostModel, drafter: str, acceptance: Acceptance, k_max: int, auto: bool, k: int) -> Plan:
    """The plan: the best K for this machine at this acceptance when `auto`, else the fixed K with its prediction."""
    said = describe_acceptance(acceptance)
    lookup = strategy(drafter).planning.note
    if not auto:
        speedup = predicted_speedup(costs, acceptance, k, drafter)
        return Plan(drafter, k, acceptance, speedup, False, f"Fixed K = {k}: predicted {speedup:.2f}× at {said}.{lookup}")
    k, speedup = best_k(costs, acceptance, k_max, drafter)
    if k == 0:
        best = max(predicted_speedup(costs, acceptance, j, drafter) for j in range(1, k_max + 1))
        reason = (f"No K pays on this machine (best predicted {best:.2f}× at {said}: scoring "
                  f"2 tokens costs {costs.verify_steps(2):.1f} steps), so the speculative lane runs the target alone.")
    else:
        reason = (f"K = {k} chosen for this machine: predicted {speedup:.2f}× at {said} "
                  f"(scoring {k + 1} tokens costs {costs.verify_steps(k + 1):.1f} steps, a draft step "
                  f"{costs.d(1) / costs.t(1):.2f}).{lookup}")
    return Plan(drafter, k, acceptance, speedup, True, reason)


def quotes_text(instruction: str, min_chars: int = 80) -> bool:
    """Whether an instruction carries text for the answer to copy: a code block or several code-like lines.

    Prompt lookup drafts by copying from the prompt, so it pays where the answer repeats the instruction
    (edit this function, fix this snippet); on a bare question it has nothing to copy.
    """
    if "```" in instruction and len(instruction) >= min_chars:
        return True
    _, gap, pasted = instruction.partition("\n\n")
    if gap and len(pasted) >= 2 * min_chars:  # a passage pasted below the request (notes to summarise, a text to edit)
        return True
    code_lines = [line for line in instruction.splitlines() if re.match(r"\s{2,}\S|\s*(def|class|return|for|if|import)\b", line)]
    return len(code_lines) >= 3 and len(instruction) >= min_chars

