"""How a running speculative lane picks each round's K: the rules a plan runs by (planner.Plan.rule chooses one from
the settings' K policy), each an object the loop asks before every round, showing it the run's rounds so far
(events.Round). Auto K re-plans from this machine's costs and the run's own evidence, position by position
(specdemo/decoding/pricing.py prices it).
"""

from __future__ import annotations

from typing import Protocol

from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import Strategy
from specdemo.decoding.pricing import Acceptance, best_k, predicted_speedup, priced_round, round_cost

HOLD = 0.02  # auto K changes K only for a predicted gain of more than this: a new verify size makes its first calls slow
# Plain steps auto K takes at K = 0, mid-run, between two probe rounds of one draft: without them no evidence could
# arrive and a run that fell to K = 0 would never draft again. A probe costs about a draft step and a 2-token call
# (~0.4-0.6 of a step), so one every 8 steps costs a run that stays at K = 0 some 5-8 %.
PROBE_EVERY = 8


class KRule(Protocol):
    def next_k(self, rounds: list) -> int: ...


class FixedK:
    """The same K every round."""

    def __init__(self, k: int):
        self.k = k

    def next_k(self, rounds: list) -> int:
        return self.k


class GrowShrinkK:
    """The simple adaptive rule: one more draft after a fully accepted round, one fewer after a rejection."""

    def __init__(self, k: int, k_min: int, k_max: int):
        self.k, self.k_min, self.k_max = k, k_min, k_max
        self.seen = 0  # rounds already looked at

    def next_k(self, rounds: list) -> int:
        for r in rounds[self.seen:]:
            if r.drafted:
                self.k = max(self.k - 1, self.k_min) if r.rejected else min(self.k + 1, self.k_max)
        self.seen = len(rounds)
        return self.k


class AutoK:
    """The best K at the running acceptance: the plan's prior, corrected by the run's own rounds, position by position.

    When the plan found no K that pays (`k` 0), every round is a plain target step: the lane runs at the target's own
    speed, and the run teaches the planner through its match mask afterwards (greedy decoding).
    """

    def __init__(self, costs: CostModel, prior: Acceptance, drafter: Strategy, k: int, k_max: int):
        self.costs, self.prior, self.drafter, self.k_max = costs, prior, drafter, k_max
        self.planned = k  # the plan's first K
        self.tested = [0] * k_max
        self.accepted = [0] * k_max
        self.seen = 0
        self.k = k

    def next_k(self, rounds: list) -> int:
        if self.planned == 0:
            return 0
        for r in rounds[self.seen:]:
            if r.drafter and r.drafter != self.drafter.planning.prior:
                continue  # a hybrid's K is the draft model's: its lookup rounds say nothing of the model's acceptance
            n_tested, n_accepted = r.tested()  # positions 1 .. accepted, and the rejected one
            for i in range(min(n_tested, self.k_max)):
                self.tested[i] += 1
                self.accepted[i] += i < n_accepted
        self.seen = len(rounds)
        acceptance = Acceptance.from_counts(self.tested, self.accepted, self.prior)
        k, speedup = best_k(self.costs, acceptance, self.k_max, self.drafter)
        if k and self.k and speedup <= (1 + HOLD) * predicted_speedup(self.costs, acceptance, self.k, self.drafter):
            return self.k  # not worth a new verify size
        self.k = k
        if k == 0 and _plain_steps_since_drafting(rounds) >= PROBE_EVERY:
            return 1  # a probe: its outcome is the evidence that can bring K back
        return k


# Gated rounds stop once they have cost the run this many plain target steps more than the target alone would have
# taken, priced on the plan's curve: the lane then ends within this, one round and the draft's prefill of the target
# alone (2 steps are 1.6 % of a 128-token answer; a round lost on a compute-bound curve costs at most ~1.5 steps more).
LOSS_LIMIT = 2.0


class GatedK:
    """Gated rounds (planner.gated_plan): every round asks for the plan's K, and the drafter's gate turns back those
    whose first draft is not confident enough (a plain target step after that draft step). The rule keeps asking while
    gating has not put the run more than LOSS_LIMIT plain steps behind the target alone: each round since the prefill
    priced on the plan's curve as it ran (pricing.priced_round) against the plain steps its tokens would have taken.
    Once behind by more, every round is a plain step to the end of the run, without probes (a probe's draft step is
    the very cost that lost). What gating gained earlier counts: a run ahead may spend its gain before it stops. The
    draft's prefill of the prompt is not held against gating: it is the price of speculating at all, which the plan
    took (a 40-token prompt is ~3 target steps on a compute-bound curve: counted here, it would end gating before its
    first round)."""

    def __init__(self, costs: CostModel, k: int):
        self.costs, self.k = costs, k
        self.ahead = 0.0  # seconds gating has saved the run so far against plain steps (< 0: lost)
        self.seen = 0

    def next_k(self, rounds: list) -> int:
        if self.k == 0:
            return 0
        step = round_cost(self.costs, 0)
        for r in rounds[max(self.seen, 1):]:  # the prefill is the target's in both lanes
            if r.rescored:
                continue  # a re-scoring probe is the plan's price for checking its curve, not gating's
            self.ahead += r.emitted * step - priced_round(self.costs, r, draft_prefill=False)
        self.seen = len(rounds)
        if self.ahead < -LOSS_LIMIT * step:
            self.k = 0
        return self.k


def _plain_steps_since_drafting(rounds: list) -> int:
    """Rounds at the end of `rounds` that drafted nothing (the prefill's step included)."""
    count = 0
    for r in reversed(rounds):
        if r.drafted:
            break
        count += 1
    return count
