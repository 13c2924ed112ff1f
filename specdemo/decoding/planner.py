"""Choosing how to speculate on this machine, and saying why: the plan for one run (its drafter, its first K and the
rule that picks each round's K, from the settings' K policy), priced by pricing.py, and the sentences a plan and the
cost surface say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import Strategy, when_quoting
from specdemo.decoding.k_rules import LOSS_LIMIT, AutoK, FixedK, GatedK, GrowShrinkK, KRule
from specdemo.decoding.pricing import (MIN_GAIN, Acceptance, best_k, break_even_alpha, confidence_stops, gate_threshold,
                                       gated_speedup, predicted_speedup)
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

# Re-scoring probes (Plan.rescore). A run whose plan found no fixed K that pays drafts nothing (gated, only the rounds
# its gate lets through: maybe none), so it observes single steps only and can never correct a curve measured too steep
# (costs.fold corrects only the calls runs make). Where no run has paid for the verify call of the K nearest to paying
# since the measurement (CostModel.observed), the run's first PROBE_ROUNDS rounds are plain steps each paid as one
# instead: the target's cache rolled back and the last tokens fed again with the new one. Each still gives the target's
# own next token; the run observes what a round's verify costs, and the fold corrects the curve by it (sizes it did not
# call by the same factor; where it still says no K pays and another size is then nearest to paying, a later run probes
# that one, if no run has paid for it either). Their price is bounded: probes longer than 2 tokens only while they cost
# at most PROBE_STEPS target steps beyond plain steps on the curve as measured. 2 tokens always: on every CPU class seen
# a 2-token call costs at most ~1.45 steps (Zen 3), so two probes cost under one step (a 128-token answer: < 1 %) even
# where a curve measured too steep says more, and the steeper it says, the more a wrong one hides.
PROBE_ROUNDS = 2
PROBE_STEPS = 1.5


@dataclass(frozen=True)
class Plan:
    """How the speculative lane will run, and why: made once (make_plan, or unpriced) from the settings' K policy, the
    strategy and this machine's costs, then asked by everyone after: the loop for the rule that picks each round's K
    (rule), OpenVINO GenAI's lane for its one K (first_k), the page for how K was chosen (describe), the run's record
    for what was planned (to_dict). It travels beside the lane's result, never inside it: its figures are what the
    planner expected before the run, the summary's what the run measured."""

    policy: KPolicy  # the settings' K policy it carries out: fixed, adaptive or auto, with its bounds
    drafter: Strategy  # the strategy the lane drafts with (under auto K, maybe not the one the settings name)
    k: int  # drafts in the first round; 0 = the target alone (speculation would not pay here)
    costs: CostModel | None = None  # this machine's call costs it was priced by; None: unpriced (no warm-up yet)
    acceptance_prior: Acceptance | None = None  # what it assumed (what earlier runs here taught); None: unpriced
    planned_speedup: float = 0.0  # S(K) after the prompt, at that acceptance
    reason: str = ""  # one sentence for the page and the CLI
    stops: tuple[float, ...] = ()  # the confidence stop the lane drafts with, per draft position (): off; confidence_stops
    # Gated rounds (gated_plan): a round whose first draft's confidence is below this is a plain target step
    # (pricing.gate_threshold); 0: off, every round of K > 0 is verified
    gate: float = 0.0
    # Why it rests on costs that may not be this host's (CostModel.busy: measured while the host was busy, until runs
    # correct them); "" when they are
    provisional: str = ""
    # Tokens each of the run's first PROBE_ROUNDS rounds feeds as a plain step (re-scoring probes, rescore_tokens); 0: none
    rescore: int = 0

    @property
    def priced(self) -> bool:
        return self.costs is not None

    def rule(self) -> KRule:
        """A new K rule for one run of the lane (a rule keeps what it saw of its run): under auto K, the best K at the
        running acceptance (AutoK); else the policy's own rule (rule_of)."""
        if self.gate and self.priced:
            return GatedK(self.costs, self.k)
        if self.policy.is_auto and self.priced:
            return AutoK(self.costs, self.acceptance_prior, self.drafter, self.k, self.policy.k_max)
        return rule_of(self.policy)

    @property
    def first_k(self) -> int:
        """The one K of a lane that keeps K fixed beside ours (OpenVINO GenAI's pipeline, the bench's peers): ours when
        fixed (adaptive K's first); under auto K this plan's first K, its K = 0 ("the target alone") becoming the
        policy's default K."""
        return (self.k or self.policy.k) if self.policy.is_auto else self.policy.k

    def describe(self, mean_k: float, drafted: int = 0, gated: int = 0) -> str:
        """How the lane chose K, with the run's mean K where it varied: "K = 4", "K adaptive (mean 3.2)", "K chosen by
        the planner (mean 5.1)"; with gated rounds, what the gate did of the run's `drafted` rounds and the `gated`
        ones it turned back: "K chosen by the planner (mean 1.6); gated: 40 of 52 rounds drafted"."""
        if self.gate:
            return f"K chosen by the planner (mean {mean_k:.1f}); {gating_sentence(drafted, gated)}"
        if self.policy.is_auto:
            return f"K chosen by the planner (mean {mean_k:.1f})"
        return f"K adaptive (mean {mean_k:.1f})" if self.policy.is_adaptive else f"K = {self.policy.k}"

    def to_dict(self) -> dict:
        """The plan as a run's record keeps it (runfile.py's "plan"): the strategy by name, the policy as "auto"."""
        prior = {"rates": self.acceptance_prior.rates} if self.acceptance_prior is not None else None
        return {"drafter": self.drafter.name, "k": self.k, "acceptance_prior": prior,
                "planned_speedup": self.planned_speedup, "auto": self.policy.is_auto, "reason": self.reason,
                "stops": self.stops, "gate": self.gate, "provisional": self.provisional,
                "rescore": self.rescore}


def rule_of(policy: KPolicy) -> KRule:
    """The rule a K policy runs by where no plan prices it: grow/shrink from adaptive K's first, else the policy's K
    every round (auto K's default, with no costs to plan by)."""
    return GrowShrinkK(policy.k, policy.k_min, policy.k_max) if policy.is_adaptive else FixedK(policy.k)


def needs_costs(policy: KPolicy) -> bool:
    """Whether a plan under `policy` chooses K by this machine's costs (auto K), so that a lane waits for warm-up."""
    return policy.is_auto


def calls_needed(policy: KPolicy) -> int:
    """The largest verify call (tokens) a plan under `policy` may price: what warm-up must have measured first."""
    return policy.k_max + 1


def describe_stops(stops: tuple[float, ...]) -> str:
    """"0.27" for one threshold; "0.27 at the 1st draft … 0.95 at the 11th" for several."""
    if len(set(stops)) <= 1:
        return f"{stops[0]:.2f}" if stops else "off"
    return f"{stops[0]:.2f} after the 1st draft … {stops[-1]:.2f} after the {_ordinal(len(stops))}"


def with_confidence_stop(plan: Plan, asked: float | None) -> Plan:
    """`plan` with the confidence stop its lane drafts with: `asked` (the settings' draft_p_min, one threshold at every
    position) when given; else, under auto K with the draft model, this machine's break-even per position
    (confidence_stops); else off."""
    if asked is not None:
        stops = (asked,) if asked else ()
    elif plan.policy.is_auto and plan.drafter.needs_model and plan.k and plan.priced:
        stops = confidence_stops(plan.costs, plan.policy.k_max)
    else:
        return plan
    if not stops:
        return plan  # off, as a plan is by default
    why = " (where a further draft costs more than it brings on this machine)." if asked is None else "."
    return replace(plan, stops=stops, reason=plan.reason + " A round's drafting stops once the draft's confidence in its "
                   f"drafts falls below {describe_stops(stops)}{why}")


def drafter_for(asked: Strategy, policy: KPolicy, instruction: str) -> Strategy:
    """The strategy a lane drafts with: the one asked for, except under auto K where the instruction quotes text for
    the answer to copy and the asked one hands over (Planning.when_quoting: the draft model to the hybrid)."""
    instead = when_quoting(asked)
    return instead if instead is not None and policy.is_auto and quotes_text(instruction) else asked


def unpriced(policy: KPolicy, drafter: Strategy) -> Plan:
    """The plan where there are no costs to plan by (no warm-up yet): the policy's K with the strategy asked for."""
    return Plan(policy, drafter, policy.k)


def make_plan(costs: CostModel, drafter: Strategy, acceptance: Acceptance, policy: KPolicy) -> Plan:
    """The plan: under auto K the best K for this machine at this acceptance, else the policy's K with its
    prediction; provisional, and saying so, where the costs were measured on a busy host and runs have not corrected
    them yet."""
    plan = _priced_plan(costs, drafter, acceptance, policy)
    if not costs.busy:
        return plan
    return replace(plan, provisional=costs.busy, reason=f"{plan.reason} Provisional: this machine's call costs were "
                   f"{costs.busy}; the runs that follow correct them, and the plan with them.")


def plan_change(before: Plan | None, after: Plan) -> str:
    """One line where `after` plans another K than `before`, the plan last made for the same drafter and K policy, as
    runs corrected the costs and the acceptance in between, saying what moved: "The plan changed after 3 runs: K 2 → 0
    (costs: t(1) 51.0 → 36.8 ms)."; "" otherwise."""
    if before is None or not (before.priced and after.priced) or before.k == after.k \
            or (before.drafter, before.policy) != (after.drafter, after.policy):
        return ""
    runs, why = after.costs.runs, []
    if after.costs.last_change and after.costs.runs != before.costs.runs:
        why.append(f"costs: {after.costs.last_change}")
    said = [describe_acceptance(plan.acceptance_prior) for plan in (before, after)]
    if said[0] != said[1]:
        why.append(f"{said[0]} → {said[1]}")
    what = f" ({'; '.join(why)})" if why else ""
    return f"The plan changed after {runs} run{'s' if runs != 1 else ''}: K {before.k} → {after.k}{what}."


def _priced_plan(costs: CostModel, drafter: Strategy, acceptance: Acceptance, policy: KPolicy) -> Plan:
    """make_plan's plan, as the costs price it."""
    said = describe_acceptance(acceptance)
    lookup = drafter.planning.note
    if not policy.is_auto:
        k = policy.k
        speedup = predicted_speedup(costs, acceptance, k, drafter)
        reason = f"Fixed K = {k}: predicted {speedup:.2f}× at {said}.{lookup}"
        return Plan(policy, drafter, k, costs, acceptance, speedup, reason)
    k_max = policy.k_max
    k, speedup = best_k(costs, acceptance, k_max, drafter)
    if k == 0:
        best, nearest = max((predicted_speedup(costs, acceptance, j, drafter), j) for j in range(1, k_max + 1))
        why = (f"No K pays on this machine (best predicted {best:.2f}× at {said}: scoring "
               f"2 tokens costs {costs.verify_steps(2):.1f} steps)")
        rescore = rescore_tokens(costs, nearest)
        gated = gated_plan(costs, drafter, acceptance, policy) if drafter.counterfactual.taught_by_mask else None
        if gated is not None:
            return replace(gated, reason=f"{why}; {gated.reason}{probe_sentence(costs, rescore)}", rescore=rescore)
        reason = f"{why}, so the speculative lane runs the target alone.{probe_sentence(costs, rescore)}"
        return Plan(policy, drafter, 0, costs, acceptance, speedup, reason, rescore=rescore)
    else:
        reason = (f"K = {k} chosen for this machine: predicted {speedup:.2f}× at {said} "
                  f"(scoring {k + 1} tokens costs {costs.verify_steps(k + 1):.1f} steps, a draft step "
                  f"{costs.d(1) / costs.t(1):.2f}).{lookup}")
    return Plan(policy, drafter, k, costs, acceptance, speedup, reason)


def rescore_tokens(costs: CostModel, nearest: int) -> int:
    """The tokens each re-scoring probe of a plan at K = 0 feeds: the verify call of the K that comes nearest to paying
    (`nearest`, the best predicted of the Ks that do not pay), shortened until PROBE_ROUNDS of them cost at most
    PROBE_STEPS target steps beyond plain steps, 2 at least; 0 (no probes) where a run has paid for a call of that size
    since the measurement."""
    n = next((n for n in range(nearest + 1, 2, -1) if PROBE_ROUNDS * (costs.verify_steps(n) - 1) <= PROBE_STEPS), 2)
    return 0 if costs.observed(n) else n


def probe_sentence(costs: CostModel, rescore: int) -> str:
    """What a plan's re-scoring probes do and cost, for people ("" without them)."""
    if not rescore:
        return ""
    extra = PROBE_ROUNDS * (costs.verify_steps(rescore) - 1)
    again = "the last token" if rescore == 2 else f"the last {rescore - 1} tokens"
    return (f" No run has paid for a K = {rescore - 1} round's verify since this machine's costs were measured, so "
            f"{PROBE_ROUNDS} of its steps score {rescore} tokens each ({again} again with the new one; at most "
            f"{extra:.1f} target steps more, priced on that curve), to check the curve that says no K pays.")


def sharp_gate(acceptance: Acceptance, k_max: int) -> tuple[float, Acceptance]:
    """What gated rounds can give at best at this acceptance, what a gated plan is chosen by (GatedK then stops them
    in a run where they lose): a gate that lets through exactly the rounds whose first draft will be accepted, a(1) of
    them, whose later drafts are accepted at a(2), a(3), …: (share of rounds let through, their acceptance)."""
    return acceptance.rate(1), Acceptance((1.0,) + tuple(acceptance.rate(i) for i in range(2, k_max + 1)))


def gated_plan(costs: CostModel, drafter: Strategy, acceptance: Acceptance, policy: KPolicy) -> Plan | None:
    """Gated rounds where no fixed K pays (make_plan's K = 0 under auto K, with the draft model): the K at which they
    can pay at best on this machine (sharp_gate, pricing.gated_speedup) with this machine's gate
    (pricing.gate_threshold); None where even that does not beat the target by MIN_GAIN, or no gate exists. Where a
    fixed K pays the gate stays off: it is priced and measured only where nothing else pays (on a memory-bound curve
    it would be ~0.02 and turn almost nothing back)."""
    gate = gate_threshold(costs)
    if not gate:
        return None
    passing, passed = sharp_gate(acceptance, policy.k_max)
    speedup, k = max((gated_speedup(costs, passing, passed, j), j) for j in range(1, policy.k_max + 1))
    if speedup < MIN_GAIN:
        return None
    reason = (f"gated rounds can pay at best {speedup:.2f}×: each round's first draft is verified only when the draft's "
              f"confidence in it is at least {gate:.2f} (this machine's break-even for one draft, the draft step "
              f"already paid), else the target takes a plain step; up to K = {k}, and back to the target alone for "
              f"the rest of the run once gating has cost it {LOSS_LIMIT:.0f} target steps.")
    return Plan(policy, drafter, k, costs, acceptance, speedup, reason, gate=gate)


def gating_sentence(drafted: int, gated: int) -> str:
    """"gated: 40 of 52 rounds drafted": of the rounds that asked for drafts, those the gate let through."""
    return f"gated: {drafted} of {drafted + gated} rounds drafted"


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

