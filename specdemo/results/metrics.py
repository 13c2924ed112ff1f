"""Every figure of a run, derived from its records: one pure function and one name per quantity.

The decoding loops record (events.Round: one per target call; events.TokenEvent: one per token) and
count nothing; the CLI, the page, the bench and the GenAI adapter read their figures from here.
How each figure is named, written and what other tools call it is said once, in specdemo/results/figures.py (the README's
glossary is its table).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

from specdemo.decoding.drafters import strategy
from specdemo.decoding.pricing import Acceptance, predicted_lane_speedup
from specdemo.decoding.verification import NEAR_TIE_LOGIT_GAP

if TYPE_CHECKING:
    from specdemo.decoding.costs import CostModel
    from specdemo.decoding.events import End, Round, TokenEvent


@dataclass
class Summary:
    """The figures of one finished lane, every one derived by this module (see the names above)."""

    mode: str  # "autoregressive" or "speculative"
    tokens: int = 0  # new tokens emitted
    wall_s: float = 0.0  # from the start (prompt in hand) to the last token
    ttft_s: float = 0.0  # time to the first token
    tpot_s: float = 0.0  # time per output token after the first: (wall - TTFT) / (tokens - 1)
    tokens_per_s: float = 0.0
    target_calls: int = 0  # inference calls on the target, prefill included
    draft_calls: int = 0  # inference calls on the draft model, prefill included
    proposed: int = 0  # draft tokens the target scored
    accepted: int = 0  # of them, kept by the acceptance rule
    rounds: int = 0  # rounds that drafted (plain target steps at K = 0 not counted)
    gated: int = 0  # rounds the gate turned back: a draft step, then a plain target step (events.Round.gated)
    rejections: int = 0  # rounds that ended in a rejected draft
    alpha_hat: float = 0.0  # α̂ = accepted / (accepted + rejections)
    draft_acceptance_rate: float = 0.0  # accepted / proposed
    mean_acceptance_length: float = 0.0  # tokens per target call after the prefill, the target's own token included
    acceptance_by_position: list[float] = field(default_factory=list)  # [i - 1]: share of rounds with an i-th draft that kept it
    accepted_histogram: list[int] = field(default_factory=list)  # rounds by how many drafts were kept
    target_s: float = 0.0  # time inside target calls
    draft_s: float = 0.0  # time drafting (draft calls, or the lookup)
    rollback_s: float = 0.0  # time trimming KV caches
    target_step_s: float = 0.0  # mean single-token target call after the prefill (autoregressive steps, K = 0 rounds)
    verify_call_s: float = 0.0  # mean target call of a round that drafted
    draft_step_s: float = 0.0  # mean draft call on 1 or 2 tokens (a draft prefill left out); the lookup's time per round
    draft_cost: float = 0.0  # c: a draft step in single target steps
    leviathan_speedup: float = 0.0  # Leviathan et al.'s eq. 1 from α̂, mean K and c
    predicted_speedup: float = 0.0  # from this machine's call costs at the run's acceptance, mean K, N and prompt
    mean_k: float = 0.0  # drafts per round that drafted
    near_ties: int = 0  # greedy tokens whose margin was below NEAR_TIE_LOGIT_GAP (the choice could flip)
    stop_reason: str = ""  # "eos", "max_new_tokens" or "cancelled"
    drafter: str = ""  # speculative: the drafter the lane ran with
    kv_cache_bytes: dict[str, int] = field(default_factory=dict)  # per model, at the end
    compiled_as: str = ""  # a peer's compile where it differs from ours, in words (GenAI's KV cache: genai.fit)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(tokens: Sequence["TokenEvent"], rounds: Sequence["Round"], end: "End", costs: "CostModel | None" = None
              ) -> Summary:
    """The lane's Summary from its tokens, its rounds and its End; `costs`: the CostModel the lane was planned with
    (Plan.costs), which prices the prediction and the target step; None: an unpriced lane, predicted nothing."""
    drafting = drafting_rounds(rounds)
    proposed = sum(r.drafted for r in drafting)
    accepted = sum(r.kept for r in drafting)
    rejections = sum(r.rejected for r in drafting)
    mean_k = proposed / len(drafting) if drafting else 0.0
    t1 = costs.t(1) if costs is not None else target_step_s(rounds) or verify_call_s(rounds)
    c = draft_cost(draft_step_s(rounds), t1)
    alpha = alpha_hat(rounds)
    by_position = acceptance_by_position(rounds, end.k_max)
    summary = Summary(
        mode=end.mode,
        tokens=len(tokens),
        wall_s=end.wall_s,
        ttft_s=tokens[0].t if tokens else 0.0,
        tpot_s=(end.wall_s - tokens[0].t) / (len(tokens) - 1) if len(tokens) > 1 else 0.0,
        tokens_per_s=tokens_per_s(len(tokens), end.wall_s),
        target_calls=len(rounds),
        draft_calls=sum(len(r.draft_calls) for r in rounds),
        proposed=proposed,
        accepted=accepted,
        rounds=len(drafting),
        gated=sum(r.gated for r in rounds),
        rejections=rejections,
        alpha_hat=alpha,
        draft_acceptance_rate=draft_acceptance_rate(accepted, proposed),
        mean_acceptance_length=mean_acceptance_length(rounds),
        acceptance_by_position=by_position,
        accepted_histogram=accepted_histogram(rounds, end.k_max),
        target_s=sum(r.verify_s for r in rounds),
        draft_s=sum(r.draft_s for r in rounds),
        rollback_s=sum(r.rollback_s for r in rounds),
        target_step_s=target_step_s(rounds),
        verify_call_s=verify_call_s(rounds),
        draft_step_s=draft_step_s(rounds),
        draft_cost=c,
        leviathan_speedup=leviathan_speedup(alpha, mean_k, c) if drafting else 0.0,
        mean_k=mean_k,
        near_ties=sum(t.margin is not None and t.margin < NEAR_TIE_LOGIT_GAP for t in tokens),
        stop_reason=end.stop_reason,
        drafter=end.drafter,
        kv_cache_bytes=dict(end.kv_cache_bytes),
    )
    if costs is not None:  # drafting nothing, the lane runs at the target's own speed: 1.0
        acceptance = run_acceptance(rounds, end.k_max)
        summary.predicted_speedup = predicted_lane_speedup(costs, acceptance, mean_k, len(tokens), end.prompt_tokens,
                                                           strategy(end.drafter))
    return summary


def drafting_rounds(rounds: Sequence["Round"]) -> list["Round"]:
    """The rounds that drafted something (the prefill and plain target steps draft nothing)."""
    return [r for r in rounds if r.drafted]


def tokens_per_s(tokens: int, wall_s: float) -> float:
    return tokens / wall_s if wall_s > 0 else 0.0


def alpha_hat(rounds: Sequence["Round"]) -> float:
    """α̂ = accepted / (accepted + rounds that ended in a rejection); 0 when nothing was drafted. Drafts after the
    end of the text (an EOS among the accepted drafts) count as neither."""
    accepted = sum(r.kept for r in rounds)
    rejections = sum(r.rejected for r in rounds)
    return accepted / (accepted + rejections) if accepted + rejections else 0.0


def draft_acceptance_rate(accepted: int, proposed: int) -> float:
    """Accepted / proposed: llama.cpp's draft_n_accepted / draft_n, SGLang's spec_accept_rate."""
    return accepted / proposed if proposed else 0.0


def mean_acceptance_length(rounds: Sequence["Round"]) -> float:
    """Tokens emitted per target call after the prefill, the target's own token included (1.0 without drafts)."""
    after = rounds[1:]
    return sum(r.emitted for r in after) / len(after) if after else 0.0


def acceptance_counts(rounds: Sequence["Round"], k_max: int) -> tuple[list[int], list[int]]:
    """(drafted, accepted) at positions 1 … k_max: how many rounds drafted an i-th token, and how many kept it (drafts
    after the end of the text, an EOS among the accepted ones, are left out)."""
    drafted, accepted = [0] * k_max, [0] * k_max
    for r in rounds:
        for i in range(min(r.kept if r.cut else r.drafted, k_max)):
            drafted[i] += 1
            accepted[i] += i < r.kept
    return drafted, accepted


def acceptance_by_position(rounds: Sequence["Round"], k_max: int) -> list[float]:
    """For i = 1 … k_max: of the rounds that drafted an i-th token, the share that kept it (0 where none did)."""
    drafted, accepted = acceptance_counts(rounds, k_max)
    return [a / d if d else 0.0 for d, a in zip(drafted, accepted)]


def evidence_by_position(rounds: Sequence["Round"], k_max: int) -> tuple[list[int], list[int]]:
    """(tested, accepted) at positions 1 … k_max, where a draft counts as tested only if every draft before it was
    accepted: the evidence for the conditional rates of the acceptance model (pricing.Acceptance)."""
    tested, accepted = [0] * k_max, [0] * k_max
    for r in rounds:
        n_tested, n_accepted = r.tested()
        for i in range(min(n_tested, k_max)):
            tested[i] += 1
            accepted[i] += i < n_accepted
    return tested, accepted


def run_acceptance(rounds: Sequence["Round"], k_max: int) -> Acceptance:
    """The run's own acceptance model: its conditional rate at each position it tested, α̂ past them."""
    tested, accepted = evidence_by_position(rounds, k_max)
    alpha = alpha_hat(rounds)
    rates = [a / t if t else alpha for t, a in zip(tested, accepted)]
    while len(rates) > 1 and not tested[len(rates) - 1]:
        rates.pop()
    return Acceptance(tuple(rates) or (alpha,))


def accepted_histogram(rounds: Sequence["Round"], k_max: int) -> list[int]:
    """Rounds that drafted, by how many of their drafts were kept (0 … k_max)."""
    counts = [0] * (k_max + 1)
    for r in drafting_rounds(rounds):
        counts[min(r.kept, k_max)] += 1
    return counts


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def target_step_s(rounds: Sequence["Round"]) -> float:
    """Mean seconds of a single-token target call after the prefill: an autoregressive step."""
    return _mean([r.verify_s for r in rounds[1:] if r.verify_tokens == 1])


def verify_call_s(rounds: Sequence["Round"]) -> float:
    """Mean seconds of the target call of a round that drafted."""
    return _mean([r.verify_s for r in drafting_rounds(rounds)])


def draft_step_s(rounds: Sequence["Round"]) -> float:
    """Mean seconds of a draft-model call on one or two tokens (a draft prefill feeds more and is left out); for a
    drafter without a model, its seconds per drafting round."""
    calls = [s for r in rounds for n, s in r.draft_calls if n <= 2]
    if calls:
        return _mean(calls)
    return _mean([r.draft_s for r in drafting_rounds(rounds)])


def draft_cost(draft_step: float, target_step: float) -> float:
    """c: a draft step in single target steps (0 when either is unknown)."""
    return draft_step / target_step if draft_step and target_step else 0.0


def leviathan_speedup(alpha: float, k: float, c: float) -> float:
    """Leviathan et al. eq. 1: expected walltime improvement for acceptance rate α, K drafts and draft cost c
    (it prices a verify call at one single step)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return (k + 1) / (c * k + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (c * k + 1))


def measured_speedup(autoregressive: Summary, speculative: Summary) -> float:
    """The one definition of speedup used by the CLI, the page and the benchmark: speculative tokens/s over
    autoregressive tokens/s, each lane timed from its prompt in hand to its last token (warm-up excluded).

    It equals the wall-time ratio when both lanes emit the same number of tokens (greedy), and stays
    fair when sampling makes their lengths differ.
    """
    return speculative.tokens_per_s / autoregressive.tokens_per_s if autoregressive.tokens_per_s else 0.0


def speedup_from_calls(tokens_per_round: float, k: float, draft_step: float, verify_call: float, target_step: float) -> float:
    """Speedup from model calls alone: a round of k draft steps and one verify call emits `tokens_per_round`
    tokens, which autoregressive decoding pays one `target_step` each for. This is the planner's S(K) with
    measured seconds; with verify_call == target_step it is Leviathan's eq. 1 for the same tokens per round."""
    return tokens_per_round * target_step / (k * draft_step + verify_call)


TIME_PARTS = ("target prefill", "target verify", "draft prefill", "draft steps", "rollback")


def time_split(rounds: Sequence["Round"]) -> dict[str, float]:
    """Seconds of one lane in each of TIME_PARTS: the target's prefill and later calls, the draft's prefill (its
    calls on more than two tokens) and steps, the KV-cache trims. The rest of its wall time is the loop's own."""
    draft_prefill = sum(s for r in rounds for n, s in r.draft_calls if n > 2)
    return {
        "target prefill": rounds[0].verify_s if rounds else 0.0,
        "target verify": sum(r.verify_s for r in rounds[1:]),
        "draft prefill": draft_prefill,
        "draft steps": sum(r.draft_s for r in rounds) - draft_prefill,
        "rollback": sum(r.rollback_s for r in rounds),
    }


def call_seconds(rounds: Sequence["Round"]) -> dict[str, dict]:
    """What one lane paid: {"target": {n: median seconds of its calls on n tokens}, "draft": {…}, "overhead": {"step": s,
    "round": s}}, prefills left out. The overhead is a step's or a round's wall time beyond its model calls and cache
    trims (the loop's own Python: logits copies, the rule, events). This is the observation each run folds into the cost
    model (costs.fold)."""
    target: dict[int, list[float]] = {}
    draft: dict[int, list[float]] = {}
    overhead: dict[str, list[float]] = {}
    for before, r in zip(rounds, rounds[1:]):
        target.setdefault(r.verify_tokens, []).append(r.verify_s)
        for n, s in r.draft_calls:
            if n <= 2:
                draft.setdefault(n, []).append(s)
        if not any(n > 2 for n, _ in r.draft_calls):  # a draft prefill's round says nothing of a round's overhead
            spent = r.t - before.t - r.verify_s - r.draft_s - r.rollback_s
            overhead.setdefault("round" if r.drafted else "step", []).append(max(spent, 0.0))
    return {"target": {n: statistics.median(s) for n, s in sorted(target.items())},
            "draft": {n: statistics.median(s) for n, s in sorted(draft.items())},
            "overhead": {kind: statistics.median(s) for kind, s in overhead.items()}}
