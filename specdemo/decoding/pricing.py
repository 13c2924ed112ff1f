"""What speculating costs on this machine, in numbers: the acceptance model, a round's seconds and the predicted speedup.

A round drafts K tokens and scores them in one target call. The i-th draft is accepted with probability
a(i) given that drafts 1 .. i-1 were (a(i) = α for every i is the geometric model of Leviathan et al.):

    tokens per round      E(K) = 1 + Σ_{i=1..K} a(1)·…·a(i)            (the target's own token, plus accepted drafts)
    seconds per round     R(K) = K·d(1) + t(K+1) + rollbacks            (measured costs, specdemo/decoding/costs.py)
    predicted speedup     S(K) = E(K) · t(1) / R(K)                      (the autoregressive lane pays t(1) a token)

Leviathan's eq. 1 is the special case a(i) = α, t(K+1) = t(1) and d(1) = c·t(1). K = 0 means "no
drafting": the speculative lane then runs at the target's own speed, S = 1.

The acceptance model is learnt per drafter and decoding mode (specdemo/learning/profile/acceptance.py): from the
teacher-forced match masks of greedy runs (every position of an answer is evidence, even when the run
drafted nothing; specdemo/results/counterfactual.py) and from the rounds of sampled runs. Positions with little
evidence lean on the pooled rate, so the model is geometric unless the data say otherwise.

Numbers only: what a plan says of them in words is the planner's (planner.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED_STRATEGY, Strategy

MIN_GAIN = 1.03  # speculate only where the prediction beats the target alone by this much (noise margin)
PRIOR_WEIGHT = 20.0  # the prior counts as this many tested drafts at each position against the run's own evidence
POOL_WEIGHT = 10.0  # a position's own evidence against the pooled rate of all positions, in tested drafts


@dataclass(frozen=True)
class Acceptance:
    """The chance that draft i of a round is accepted, given that drafts 1 .. i-1 were: rates[i - 1].
    Positions past the last rate take the last rate."""

    rates: tuple[float, ...]

    @classmethod
    def geometric(cls, alpha: float) -> "Acceptance":
        return cls((alpha,))

    @classmethod
    def from_counts(cls, tested: Sequence[float], accepted: Sequence[float], prior: "Acceptance",
                    weight: float = PRIOR_WEIGHT) -> "Acceptance":
        """Rates from drafts tested and accepted at each position (1, 2, …). Each position is pulled towards the
        pooled rate of all positions, so a position with few trials follows the others (geometric unless the data
        say otherwise); the pooled rate is pulled towards `prior`, which counts as `weight` tested drafts."""
        total_tested, total_accepted = sum(tested), sum(accepted)
        rates = []
        for i, (n, a) in enumerate(zip(tested, accepted), start=1):
            pooled = (total_accepted + weight * prior.rate(i)) / (total_tested + weight)
            rates.append((a + POOL_WEIGHT * pooled) / (n + POOL_WEIGHT))
        return cls(tuple(rates)) if rates else prior

    def rate(self, i: int) -> float:
        return self.rates[min(i, len(self.rates)) - 1]

    def all_accepted(self, k: int) -> float:
        """The chance that every one of K drafts is accepted."""
        chance = 1.0
        for i in range(1, k + 1):
            chance *= self.rate(i)
        return chance

    def expected_tokens(self, k: int) -> float:
        """Tokens one round of K drafts emits on average: the accepted drafts plus the target's own token."""
        tokens, chance = 1.0, 1.0
        for i in range(1, k + 1):
            chance *= self.rate(i)
            tokens += chance
        return tokens


def round_seconds(costs: CostModel, acceptance: Acceptance, k: int, drafter: Strategy = MASKED_STRATEGY) -> float:
    """Expected seconds of one round with K drafts at this acceptance (round_cost, the previous round having kept every
    draft with this acceptance's chance)."""
    return round_cost(costs, k, drafter, acceptance.all_accepted(k) if k else 0.0)


def round_cost(costs: CostModel, k: int, drafter: Strategy = MASKED_STRATEGY, full: float = 0.0) -> float:
    """Seconds of one round with K drafts (K = 0: one plain target step): the verify call, the trims, the loop's own
    time and the drafting as the strategy prices it (Strategy.draft_seconds; `full`, the chance or 0/1 that the round
    before kept every draft, makes a draft model's first step feed two tokens). The one price of a round: the planner
    takes its expectation, the counterfactual walks it round by round."""
    if k == 0:
        return costs.t(1) + costs.step_overhead_s
    seconds = costs.t(k + 1) + costs.target_rollback_s + costs.round_overhead_s
    return seconds + drafter.draft_seconds(costs, k, full)


def gated_out_cost(costs: CostModel, full: float = 0.0) -> float:
    """Seconds of a round the gate turned back (gate_threshold): the first draft step, paid before the gate could look
    (one token fed, two after a round that kept every draft: `full` as in round_cost), then a plain target step. On a
    compute-bound curve (a draft step 0.45 of a target step) such a round costs 1.45 steps for its one token: the
    gate's own price, which only the rounds it lets through can repay."""
    return costs.d(1) + full * (costs.d(2) - costs.d(1)) + round_cost(costs, 0)


def priced_round(costs: CostModel, r, draft_prefill: bool = True) -> float:
    """Seconds one of a run's rounds (events.Round) costs on this curve, its calls as it made them: each draft call
    d(n) by the tokens it fed (a first call feeding the prompt at the draft's prefill rate; without `draft_prefill`,
    as the one draft step it also is), then the target's call, a plain step's t(1) where nothing was verified (a plain
    step or a round the gate turned back), t(n) and one trim for a re-scoring probe, or t(K + 1) with both trims. What a
    run would have taken on another machine's curve (the bench prices lanes so), or on its own plan's (GatedK's running
    account)."""
    def call(n: int) -> float:
        if n <= 2 or not costs.draft_prefill_tps:
            return costs.d(n)
        return n / costs.draft_prefill_tps if draft_prefill else costs.d(1)

    drafting = sum(call(n) for n, _ in r.draft_calls)
    if r.index == 0:
        return drafting + r.verify_tokens / costs.target_prefill_tps
    if r.rescored:
        return costs.t(r.verify_tokens) + costs.target_rollback_s + costs.step_overhead_s
    if not r.drafted:
        return drafting + round_cost(costs, 0)
    trims = costs.target_rollback_s + costs.round_overhead_s + (costs.draft_rollback_s if r.draft_calls else 0.0)
    return drafting + costs.t(r.verify_tokens) + trims


def predicted_speedup(costs: CostModel, acceptance: Acceptance, k: int, drafter: Strategy = MASKED_STRATEGY) -> float:
    """Tokens per second of speculation with K drafts over the target alone, after the prompt."""
    return acceptance.expected_tokens(k) * round_seconds(costs, acceptance, 0) / round_seconds(costs, acceptance, k, drafter)


def predicted_lane_speedup(costs: CostModel, acceptance: Acceptance, k: float, tokens: int, prompt_tokens: int,
                           drafter: Strategy = MASKED_STRATEGY) -> float:
    """Whole-lane wall-time ratio for `tokens` new tokens after a `prompt_tokens` prompt.

    Both lanes prefill the target; the speculative lane also prefills the draft (when it drafts at all)
    and then runs rounds; the autoregressive lane runs single steps. A fractional k (the mean of an
    adaptive or automatic run) is interpolated between its neighbours.
    """
    if tokens <= 1 or k <= 0:
        return 1.0
    low = int(k)
    if low != k:
        w = k - low
        return (1 - w) * predicted_lane_speedup(costs, acceptance, low, tokens, prompt_tokens, drafter) + w * \
            predicted_lane_speedup(costs, acceptance, low + 1, tokens, prompt_tokens, drafter)
    k = int(k)
    prefill = prompt_tokens / costs.target_prefill_tps
    autoregressive = prefill + (tokens - 1) * round_seconds(costs, acceptance, 0)
    draft_prefill = drafter.prefill_seconds(costs, prompt_tokens)
    rounds = (tokens - 1) / acceptance.expected_tokens(k)
    speculative = prefill + draft_prefill + rounds * round_seconds(costs, acceptance, k, drafter)
    return autoregressive / speculative


def best_k(costs: CostModel, acceptance: Acceptance, k_max: int,
           drafter: Strategy = MASKED_STRATEGY) -> tuple[int, float]:
    """(K, predicted speedup) maximising tokens per second; (0, 1.0) when no K beats the target by MIN_GAIN."""
    best, best_speedup = 0, 1.0
    for k in range(1, k_max + 1):
        speedup = predicted_speedup(costs, acceptance, k, drafter)
        if speedup > best_speedup:
            best, best_speedup = k, speedup
    if best_speedup < MIN_GAIN:
        return 0, 1.0
    return best, best_speedup


def break_even_alpha(costs: CostModel, k: int, drafter: Strategy = MASKED_STRATEGY) -> float | None:
    """The α at which K drafts a round exactly pay for themselves on this machine (S(K) = 1, geometric acceptance);
    None when even α = 1 does not pay."""
    if predicted_speedup(costs, Acceptance.geometric(1.0), k, drafter) < 1.0:
        return None
    low, high = 0.0, 1.0  # S grows with α, so bisect
    for _ in range(40):
        middle = (low + high) / 2
        if predicted_speedup(costs, Acceptance.geometric(middle), k, drafter) < 1.0:
            low = middle
        else:
            high = middle
    return high


def cost_surface(costs: CostModel, ks: Sequence[int], alphas: Sequence[float],
                 drafter: Strategy = MASKED_STRATEGY) -> list[list[float]]:
    """This machine's predicted speedup S(K) for every α (rows) and K (columns): where speculation pays, and how much."""
    return [[predicted_speedup(costs, Acceptance.geometric(a), k, drafter) for k in ks] for a in alphas]


STOP_CAP = 0.95  # a threshold above this would stop nearly every round: the draft is then simply not drafted


def confidence_stops(costs: CostModel, k_max: int) -> tuple[float, ...]:
    """The confidence stop this machine pays for, per draft position: stops[j - 1] is the draft's running confidence
    (the product of its top probabilities for drafts 1 … j) below which draft j + 1 does not pay. That draft costs a
    draft step and one more row in the verify call, d(1) + t(j + 2) − t(j + 1), and brings a token worth at most a
    target step t(1) with at most that probability. Priced position by position, not at the round's K: on a curve
    with a cliff right after the planned verify size, the draft past K is dear (up to 0.95) but the drafts before it
    are not, so a confident round still drafts its K. About 0.25 where a draft step is a quarter of a target step and
    verifying is nearly free (AVX-512, AMX), about 0.7 on an AVX2-only CPU; () (off) without a draft model's costs.
    Positions past k_max - 1 take the last value (the drafters' convention, as Acceptance.rates)."""
    if k_max <= 1 or not costs.draft_s:
        return ()
    return tuple(round(min((costs.d(1) + max(costs.t(j + 2) - costs.t(j + 1), 0.0)) / costs.t(1), STOP_CAP), 3)
                 for j in range(1, k_max))


def gate_threshold(costs: CostModel) -> float:
    """The draft's confidence in a round's first draft below which the round is not verified as a draft round
    (gated rounds): the target takes a plain step instead. At the gate the first draft step is already paid, and paid
    whichever way it decides, so it does not enter the decision (gated_out_cost charges it to the plan). What remains:
    verifying the draft, one more row in the call and a round's trims and bookkeeping beyond a plain step's,
    t(2) − t(1) + rollback + round overhead − step overhead, against one more token, worth a plain step
    t(1) + step overhead, with the chance the draft is accepted, which for a calibrated draft is its confidence. So
    about t(2) / t(1) − 1: 0.35–0.43 on an AVX2-only CPU (t(5) = 2.4–2.7 steps), ~0.02 where verifying is nearly free
    (AMX). It ignores what an accepted first draft opens (the drafts after it), so it errs towards plain steps.
    0 (off) without a draft model's costs."""
    if not costs.draft_s:
        return 0.0
    step = costs.t(1) + costs.step_overhead_s
    extra = costs.t(2) + costs.target_rollback_s + costs.round_overhead_s - step
    return round(min(max(extra, 0.0) / step, STOP_CAP), 3)


def gated_speedup(costs: CostModel, passing: float, passed: Acceptance, k: int) -> float:
    """Tokens per second of gated rounds with K drafts over the target alone, after the prompt. Every round starts
    with a draft step; a share `passing` of them clears the gate and runs as a round of K drafts accepted at `passed`
    (the acceptance of rounds that cleared it), the rest are a plain step after that draft step (gated_out_cost):

        tokens per round    π · E_passed(K) + (1 − π)
        seconds per round   π · R(K) + (1 − π) · (d(1) + t(1))

    On a compute-bound curve (t(2) = 1.35 steps, a draft step 0.45) a turned-back round costs 1.45 steps for one
    token, so the rounds let through must bring that back: at π = 0.7 and every passed first draft accepted (K = 1:
    2 tokens for 1.8 steps), 1.7 tokens for 1.70 steps, 1.00×; gated rounds pay where the draft is confident and right
    in long runs, which the drafts after the first carry (R(K) with the confidence stop drafts fewer: this errs low)."""
    full = passed.all_accepted(k) * passing
    inside = round_cost(costs, k, MASKED_STRATEGY, full)
    tokens = passing * passed.expected_tokens(k) + (1 - passing)
    seconds = passing * inside + (1 - passing) * gated_out_cost(costs, full)
    return tokens * round_cost(costs, 0) / seconds
