"""Choosing how to speculate on this machine: the prediction, the α estimate and the K policies.

A round drafts K tokens and scores them in one target call. With per-token acceptance α (the
drafts are accepted independently, each with probability α, until the first rejection):

    tokens per round      E(K) = (1 - α^(K+1)) / (1 - α)            (Leviathan et al. 2023, eq. 1's numerator)
    seconds per round     R(K) = K·d(1) + t(K+1) + rollbacks       (measured costs, specdemo/costs.py)
    predicted speedup     S(K) = E(K) · t(1) / R(K)                 (the autoregressive lane pays t(1) a token)

Leviathan's eq. 1 is the special case t(K+1) = t(1) and d(1) = c·t(1). K = 0 means "no drafting":
the speculative lane then runs at the target's own speed, S = 1.

α is estimated the standard way, from rounds: every accepted draft is a success and every round that
ended in a rejection one failure, so α̂ = accepted / (accepted + rejections). (Accepted / proposed
also counts the drafts after a rejection, which were never tested, as failures; it is reported
separately as the draft acceptance rate.)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from specdemo.costs import CostModel

MIN_GAIN = 1.03  # speculate only where the prediction beats the target alone by this much (noise margin)
PRIOR_WEIGHT = 20.0  # the prior α counts as this many tested drafts against the run's own evidence
DEFAULT_ALPHA = {"model": 0.8, "prompt-lookup": 0.5}  # before any run on this machine


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits on average: accepted drafts plus the target's own token."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_seconds(costs: CostModel, alpha: float, k: int, drafter: str = "model") -> float:
    """Expected seconds of one round with K drafts (K = 0: one plain target step)."""
    if k == 0:
        return costs.t(1)
    seconds = costs.t(k + 1) + costs.target_rollback_s
    if drafter == "model":
        # K draft calls; after a fully accepted round the first one feeds two tokens.
        seconds += (k - 1) * costs.d(1) + alpha**k * costs.d(2) + (1 - alpha**k) * costs.d(1) + costs.draft_rollback_s
    return seconds


def predicted_speedup(costs: CostModel, alpha: float, k: int, drafter: str = "model") -> float:
    """Tokens per second of speculation with K drafts over the target alone, after the prompt."""
    return expected_tokens(alpha, k) * costs.t(1) / round_seconds(costs, alpha, k, drafter)


def predicted_lane_speedup(costs: CostModel, alpha: float, k: float, tokens: int, prompt_tokens: int,
                           drafter: str = "model") -> float:
    """Whole-lane wall-time ratio for `tokens` new tokens after a `prompt_tokens` prompt.

    Both lanes prefill the target; the speculative lane also prefills the draft (when it drafts at
    all) and then runs rounds; the autoregressive lane runs single steps. A fractional k (the mean of
    an adaptive run) is interpolated between its neighbours.
    """
    if tokens <= 1 or k <= 0:
        return 1.0
    low, high = math.floor(k), math.ceil(k)
    if low != high:
        w = k - low
        return (1 - w) * predicted_lane_speedup(costs, alpha, low, tokens, prompt_tokens, drafter) + w * \
            predicted_lane_speedup(costs, alpha, high, tokens, prompt_tokens, drafter)
    k = int(k)
    prefill = prompt_tokens / costs.target_prefill_tps
    autoregressive = prefill + (tokens - 1) * costs.t(1)
    draft_prefill = prompt_tokens / costs.draft_prefill_tps if drafter == "model" and k else 0.0
    rounds = (tokens - 1) / expected_tokens(alpha, k)
    speculative = prefill + draft_prefill + rounds * round_seconds(costs, alpha, k, drafter)
    return autoregressive / speculative


def best_k(costs: CostModel, alpha: float, k_max: int, drafter: str = "model") -> tuple[int, float]:
    """(K, predicted speedup) maximising tokens per second; (0, 1.0) when no K beats the target by MIN_GAIN."""
    best, best_speedup = 0, 1.0
    for k in range(1, k_max + 1):
        speedup = predicted_speedup(costs, alpha, k, drafter)
        if speedup > best_speedup:
            best, best_speedup = k, speedup
    if best_speedup < MIN_GAIN:
        return 0, 1.0
    return best, best_speedup


def estimate_alpha(accepted: int, rejections: int, prior: float, weight: float = PRIOR_WEIGHT) -> float:
    """α̂ from a run's rounds, pulled towards `prior` while the run has little evidence of its own.

    accepted: draft tokens accepted; rejections: rounds that ended in a rejection. With weight 0 this is
    the maximum-likelihood estimate accepted / (accepted + rejections).
    """
    total = accepted + rejections + weight
    if total <= 0:
        return prior
    return (accepted + weight * prior) / total


# ---- the plan for one run


@dataclass(frozen=True)
class Plan:
    """How the speculative lane will run, and why."""

    drafter: str  # "model" or "prompt-lookup"
    k: int  # drafts in the first round; 0 = the target alone (speculation would not pay here)
    alpha: float  # the α the plan assumed (the prior for this machine and drafter)
    predicted_speedup: float  # S(K) after the prompt, at that α
    auto: bool  # True: K is re-chosen every round from the running α̂
    reason: str  # one sentence for the page and the CLI


def make_plan(costs: CostModel, drafter: str, alpha: float, k_max: int, auto: bool, k: int) -> Plan:
    """The plan: the best K for this machine at this α when `auto`, else the fixed K with its prediction."""
    if not auto:
        speedup = predicted_speedup(costs, alpha, k, drafter)
        return Plan(drafter, k, alpha, speedup, False, f"Fixed K = {k}: predicted {speedup:.2f}× at α = {alpha:.2f}.")
    k, speedup = best_k(costs, alpha, k_max, drafter)
    if k == 0:
        best = max(predicted_speedup(costs, alpha, j, drafter) for j in range(1, k_max + 1))
        reason = (f"No K pays on this machine (best predicted {best:.2f}× at α = {alpha:.2f}: scoring "
                  f"2 tokens costs {costs.verify_steps(2):.1f} steps), so the speculative lane runs the target alone.")
    else:
        reason = (f"K = {k} chosen for this machine: predicted {speedup:.2f}× at α = {alpha:.2f} "
                  f"(scoring {k + 1} tokens costs {costs.verify_steps(k + 1):.1f} steps, a draft step "
                  f"{costs.d(1) / costs.t(1):.2f}).")
    return Plan(drafter, k, alpha, speedup, True, reason)


# ---- K policies: the decoding loop asks one for each round's K, telling it the run's evidence so far.
# next_k(accepted, rejections, last_full) -> K; accepted = drafts accepted so far, rejections = rounds
# that ended in a rejection, last_full = whether the previous round accepted every draft.


class FixedK:
    """The same K every round."""

    def __init__(self, k: int):
        self.k = k

    def next_k(self, accepted: int, rejections: int, last_full: bool | None) -> int:
        return self.k


class GrowShrinkK:
    """The simple adaptive rule: one more draft after a fully accepted round, one fewer after a rejection."""

    def __init__(self, k: int, k_min: int, k_max: int):
        self.k, self.k_min, self.k_max = k, k_min, k_max

    def next_k(self, accepted: int, rejections: int, last_full: bool | None) -> int:
        if last_full is not None:
            self.k = min(self.k + 1, self.k_max) if last_full else max(self.k - 1, self.k_min)
        return self.k


class AutoK:
    """The best K at the running α̂ (the plan's α as the prior, the run's rounds as evidence).

    When the plan found no K that pays, every round is a plain target step: without drafts there is no
    new evidence, and the lane runs at the target's own speed.
    """

    def __init__(self, costs: CostModel, plan: Plan, k_max: int):
        self.costs, self.plan, self.k_max = costs, plan, k_max

    def next_k(self, accepted: int, rejections: int, last_full: bool | None) -> int:
        if self.plan.k == 0:
            return 0
        alpha = estimate_alpha(accepted, rejections, self.plan.alpha)
        return best_k(self.costs, alpha, self.k_max, self.plan.drafter)[0]


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


# ---- what earlier runs on this machine taught: the α prior


class AlphaHistory:
    """Accepted drafts and rejections of earlier runs, per drafter and decoding mode, in one JSON file.

    Older evidence fades (each run scales the totals by DECAY first) so the prior follows what the
    user actually runs.
    """

    DECAY = 0.9

    def __init__(self, path: Path | None):
        self.path = path
        self.counts: dict[str, list[float]] = {}
        if path is not None and path.is_file():
            try:
                self.counts = json.loads(path.read_text())
            except (OSError, ValueError):
                self.counts = {}  # a damaged file only loses the prior

    @staticmethod
    def key(drafter: str, greedy: bool) -> str:
        return f"{drafter}/{'greedy' if greedy else 'sampling'}"

    def prior(self, drafter: str, greedy: bool) -> float:
        accepted, rejections = self.counts.get(self.key(drafter, greedy), (0.0, 0.0))
        default = DEFAULT_ALPHA.get(drafter, 0.5)
        return estimate_alpha(accepted, rejections, default, weight=5.0)

    def record(self, drafter: str, greedy: bool, accepted: int, rejections: int) -> None:
        if accepted + rejections == 0:
            return
        old = self.counts.get(self.key(drafter, greedy), (0.0, 0.0))
        self.counts[self.key(drafter, greedy)] = [old[0] * self.DECAY + accepted, old[1] * self.DECAY + rejections]
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_suffix(".tmp")
            scratch.write_text(json.dumps(self.counts))
            scratch.replace(self.path)
