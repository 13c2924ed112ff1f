"""What each K would have given on this very answer: exact for greedy decoding, priced by this machine's costs.

After a greedy run, one teacher-forced draft pass over prompt + answer gives, for every position j of the
answer, whether the draft's greedy token there (given the answer before j) equals the answer's token:
the match mask m. A greedy round that starts at position j with K drafts proposes exactly the draft's
greedy tokens given the answer so far, so it accepts the run of matches m[j], m[j+1], … capped at K,
and the target's token follows. Walking the answer round by round gives, for any K, the rounds, the
target and draft calls and, with the cost model, the time; for every round the best K (the oracle, by
dynamic programming); and, with no model at all, what every model-free strategy (prompt lookup, …) would have drafted,
its own drafter replayed on the answer.

The teacher-forced pass scores the answer in batched calls, while the loop drafts one token per call, and the two
can round a near-tie of the draft differently. So where the run being explained drafted with the model, its own
rounds say what the draft proposed, and those observations replace the pass's guesses (observed_matches): at the
run's own fixed K the walk then repeats the run's rounds exactly, and elsewhere the pass fills in what the run did
not observe. The walk is exact under one more condition: an answer that does not depend on K. Where batched and
single-token target calls order a near-tie differently, another K may write another answer; the bench counts how
often that happens.

The confidence stop (a round's drafting ends once the product of the draft's top probabilities for its j drafts
falls below this machine's break-even at position j, pricing.confidence_stops) is walked too, by the drafter's own
rule (drafters.base.stop_threshold), from the same pass's top probabilities: exact for every draft up to and
including a round's first rejected one (the draft saw the answer's own tokens there); the drafts after it, rejected
whatever they are, were drafted from the draft's own tokens, which the pass never saw, so their confidences stand in
from the answer's (they change only how many draft steps the round pays).

Gated rounds (a round whose first draft's confidence is below this machine's break-even for verifying it,
pricing.gate_threshold, is a plain target step after that draft step) are walked the same way, from the same pass:
the gate reads the first draft's confidence, drafted from the answer's own tokens, so it is exact.

Sampled runs have no such mask (a sampled draft is not a function of the text), so none of this applies
to them. The same masks are the planner's evidence of acceptance by draft position (mask_counts).
"""

from __future__ import annotations

import numpy as np

from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED, MASKED_STRATEGY, STRATEGIES, Strategy, strategy
from specdemo.decoding.drafters.base import stop_threshold
from specdemo.decoding.pricing import confidence_stops, gate_threshold, gated_out_cost, round_cost
from specdemo.models.runtime import OVModel
from specdemo.results.would import Counterfactual, Walk

PIECE = 64  # answer tokens per teacher-forced call: 64 rows of logits (~39 MB for a 151,936-token vocabulary)


def greedy_choices(model: OVModel, prompt_ids: list[int], text_ids: list[int],
                   with_confidence: bool = False):
    """The model's greedy token after prompt + text[:j] for j = 1 … len(text) - 1 (what it would choose in place of
    text[j]), by teacher forcing in pieces of PIECE tokens; with `with_confidence`, also its softmax probability (as the
    loop's drafter weighs it: OVModel.greedy_ids). Leaves the model's cache empty."""
    model.reset()
    model.forward(prompt_ids)
    choices, confidences = [], []
    for start in range(0, len(text_ids) - 1, PIECE):
        piece = text_ids[start : min(start + PIECE, len(text_ids) - 1)]  # the last token predicts nothing we need
        logits = model.forward(piece, logits_to_keep=len(piece))  # (len(piece), V'): row r for text[start + r + 1]
        if with_confidence:  # as the loop's drafter chooses and weighs (a trimmed head's other rows too)
            ids, top = model.greedy_ids(logits, confidence=True)
            confidences.append(top)
        else:
            ids = model.greedy_ids(logits)
        choices.append(ids)
    model.reset()
    chosen = np.concatenate(choices) if choices else np.zeros(0, dtype=np.int64)
    if not with_confidence:
        return chosen
    return chosen, (np.concatenate(confidences) if confidences else np.zeros(0))


def draft_pass(draft: OVModel, prompt_ids: list[int], answer_ids: list[int]) -> tuple[list[int], list[float]]:
    """The match mask m and, per answer position, the draft's top probability there (position 0: 1.0, never drafted):
    what the confidence stop reads. m[j]: does the draft's greedy token after prompt + answer[:j] equal answer[j]? m[0]
    is 1 by convention (the first token is the target's prefill, never drafted)."""
    choices, confidence = greedy_choices(draft, prompt_ids, answer_ids, with_confidence=True)
    return _matches(choices, answer_ids), [1.0] + [float(c) for c in confidence]


def _matches(choices: np.ndarray, answer_ids: list[int]) -> list[int]:
    return [1] + [int(x) for x in choices == np.asarray(answer_ids[1:])]


def agreement_mask(target: OVModel, draft: OVModel, prompt_ids: list[int], text_ids: list[int]) -> list[int]:
    """Like draft_pass's mask on any text, not only the target's own answer: does the draft's greedy token equal the
    target's at every position? (On the target's greedy answer the two are the same.)"""
    ours, theirs = greedy_choices(draft, prompt_ids, text_ids), greedy_choices(target, prompt_ids, text_ids)
    return [1] + [int(x) for x in ours == theirs]


def observed_matches(rounds, length: int) -> list[int | None]:
    """What a speculative run's own drafting showed of the match mask, per answer position: 1 where the model's draft
    was kept, 0 where its first rejected draft stood, None where the run did not draft with the model (the prefill's
    token, bonus tokens, lookup rounds, after the text ended). `rounds` are the run's events.Round records, the
    prefill first; the answer is the run's own text (or a text it shares up to `length`)."""
    seen: list[int | None] = [None] * length
    position = 0
    for r in rounds:
        if r.index > 0 and r.drafter == MASKED and r.drafted:
            for i in range(r.kept):
                if position + i < length:
                    seen[position + i] = 1
            if r.accepted < r.drafted and not r.cut and position + r.accepted < length:
                seen[position + r.accepted] = 0
        position += r.emitted
    return seen


def corrected(mask: list[int], seen: list[int | None]) -> tuple[list[int], int, int]:
    """`mask` with the run's own observations in place of the teacher-forced guesses: (mask, positions observed,
    positions changed)."""
    out, observed, changed = list(mask), 0, 0
    for j, value in enumerate(seen[: len(mask)]):
        if value is not None and j > 0:
            observed += 1
            changed += out[j] != value
            out[j] = value
    return out, observed, changed


def accepted_run(mask: list[int], j: int, cap: int) -> int:
    """Drafts a greedy round starting at answer position j accepts with at most `cap` drafts."""
    n = 0
    while n < cap and j + n < len(mask) and mask[j + n]:
        n += 1
    return n


def mask_counts(mask: list[int], k_max: int) -> tuple[list[int], list[int]]:
    """(tested, accepted) at draft positions 1 … k_max over every round start: position i is tested where the
    i - 1 drafts before it matched. The acceptance model's evidence (specdemo/learning/profile/acceptance.py)."""
    tested, accepted = [0] * k_max, [0] * k_max
    for j in range(1, len(mask)):
        for i in range(k_max):
            if j + i >= len(mask):
                break
            tested[i] += 1
            if not mask[j + i]:
                break
            accepted[i] += 1
    return tested, accepted


def replay_counts(drafter, prompt_ids: list[int], answer_ids: list[int], k_max: int) -> tuple[list[int], list[int]]:
    """(tested, accepted) at draft positions 1 … k_max for a model-free drafter on this answer, over every position
    where it proposed something: its evidence for the planner, as mask_counts is the draft model's."""
    tested, accepted = [0] * k_max, [0] * k_max
    drafter.reset()
    seq = list(prompt_ids) + answer_ids[:1]
    for j in range(1, len(answer_ids)):
        for i, token in enumerate(drafter.propose(seq, k_max).tokens):
            if j + i >= len(answer_ids):
                break
            tested[i] += 1
            if token != answer_ids[j + i]:
                break
            accepted[i] += 1
        seq.append(answer_ids[j])
        drafter.keep(len(seq) - 1)
    return tested, accepted


def _prefills(costs: CostModel, prompt_tokens: int, drafter: Strategy | None) -> float:
    """The target's prefill, and the drafter's own (`drafter` None: nothing drafted, no draft prefill)."""
    draft = drafter.prefill_seconds(costs, prompt_tokens) if drafter is not None else 0.0
    return prompt_tokens / costs.target_prefill_tps + draft


def drafted_before_stop(confidence: list[float], j: int, cap: int, stops: tuple[float, ...]) -> int:
    """Drafts a round starting at answer position j proposes under the confidence stop, as the loop's drafter does:
    the first always, each next one while the product of the drafts' top probabilities so far is at least the stop's
    threshold at that position."""
    product, n = 1.0, 0
    while n < cap and product >= stop_threshold(stops, n):
        product *= confidence[j + n] if j + n < len(confidence) else 1.0
        n += 1
    return n


def walk_fixed(mask: list[int], k: int, costs: CostModel, prompt_tokens: int, max_new_tokens: int,
               autoregressive_s: float, confidence: list[float] | None = None, stops: tuple[float, ...] = (),
               gate: float = 0.0) -> Walk:
    """The draft model at a fixed K, round by round over the answer, as the loop would have run it; with `stops` and
    the draft's `confidence` per position, under the confidence stop; with a `gate` too, in gated rounds (a round
    whose first draft's confidence is below it is a plain target step after that draft step: gated_out_cost). The
    gate reads the first draft's confidence, drafted from the answer's own tokens: exact."""
    j, accepted, draft_calls, seconds, full = 1, [], 0, _prefills(costs, prompt_tokens, MASKED_STRATEGY), False
    gated = 0
    while j < len(mask):
        cap = min(k, max_new_tokens - j - 1)  # the loop never drafts past max_new_tokens
        if gate and cap > 0 and confidence is not None and confidence[j] < gate:
            seconds += gated_out_cost(costs, float(full))
            accepted.append(0)
            draft_calls += 1
            gated += 1
            full = False
            j += 1
            continue
        if stops and confidence is not None:
            cap = drafted_before_stop(confidence, j, cap, stops)
        n = accepted_run(mask, j, cap)
        seconds += round_cost(costs, cap, MASKED_STRATEGY, float(full))
        accepted.append(n)
        draft_calls += cap
        full = cap > 0 and n == cap
        j += n + 1
    return Walk(k, len(accepted), len(accepted) + 1, draft_calls, seconds, autoregressive_s / seconds, accepted,
                stops=stops if confidence is not None else (), gate=gate if confidence is not None else 0.0,
                gated=gated)


def walk_oracle(mask: list[int], k_max: int, costs: CostModel, prompt_tokens: int, max_new_tokens: int,
                autoregressive_s: float) -> Walk:
    """The best K for every round (K = 0, a plain target step, included), by dynamic programming from the end."""
    size = len(mask)
    best = np.zeros((size + 1, 2))  # best[j, full]: seconds from position j on; full: the round before accepted all
    choice = np.zeros((size + 1, 2), dtype=int)
    for j in range(size - 1, 0, -1):
        for full in (0, 1):
            options = []
            for k in range(0, min(k_max, max(max_new_tokens - j - 1, 0)) + 1):
                n = accepted_run(mask, j, k)
                after = min(j + n + 1, size)
                options.append(round_cost(costs, k, MASKED_STRATEGY, float(full)) + best[after, int(k > 0 and n == k)])
            choice[j, full] = int(np.argmin(options))
            best[j, full] = min(options)
    ks, accepted, j, full = [], [], 1, 0
    while j < size:
        k = int(choice[j, full])
        n = accepted_run(mask, j, k)
        ks.append(k)
        accepted.append(n)
        full = int(k > 0 and n == k)
        j += n + 1
    drafts = sum(ks)
    seconds = float(best[1, 0]) + _prefills(costs, prompt_tokens, MASKED_STRATEGY if drafts else None)
    return Walk(0, len(ks), len(ks) + 1, drafts, seconds, autoregressive_s / seconds, accepted, ks)


def walk_replayed(drafter, prompt_ids: list[int], answer_ids: list[int], k: int, costs: CostModel,
                  max_new_tokens: int, autoregressive_s: float) -> Walk:
    """A model-free drafter at a fixed K, round by round over the answer: its proposals need no model, only the text
    so far, so it is replayed as it is."""
    drafter.reset()
    priced_as = strategy(drafter.kind)
    seq = list(prompt_ids) + answer_ids[:1]
    j, accepted, seconds = 1, [], _prefills(costs, len(prompt_ids), priced_as)
    while j < len(answer_ids):
        cap = min(k, max_new_tokens - j - 1)
        drafts = drafter.propose(seq, cap).tokens if cap > 0 else []
        n = 0
        while n < len(drafts) and j + n < len(answer_ids) and drafts[n] == answer_ids[j + n]:
            n += 1
        seconds += round_cost(costs, len(drafts), priced_as)
        accepted.append(n)
        seq.extend(answer_ids[j : j + n + 1])
        drafter.keep(len(seq) - 1)
        j += n + 1
    return Walk(k, len(accepted), len(accepted) + 1, 0, seconds, autoregressive_s / seconds, accepted)


def replay_drafters(settings) -> dict:
    """A fresh drafter of every model-free strategy the counterfactual may replay (Walking.replayable), by name, for
    `settings` (GenerationSettings)."""
    rng = np.random.default_rng(0)  # deterministic drafters: the generator is never drawn from
    return {name: s.make(None, settings, rng) for name, s in STRATEGIES.items()
            if not s.needs_model and s.counterfactual.replayable}


def autoregressive_seconds(costs: CostModel, prompt_tokens: int, tokens: int) -> float:
    """Predicted seconds of the autoregressive lane: the prefill, then one step per further token."""
    return prompt_tokens / costs.target_prefill_tps + max(tokens - 1, 0) * (costs.t(1) + costs.step_overhead_s)


def counterfactual(mask: list[int] | None, prompt_ids: list[int], answer_ids: list[int], costs: CostModel,
                   settings, rounds=None, confidence: list[float] | None = None) -> Counterfactual:
    """Every fixed K, the oracle and every model-free strategy on this answer, for K = 1 … settings.k_max
    (GenerationSettings); `mask` None (no draft model): the model-free strategies only. `rounds`: the speculative run
    that wrote this answer, whose own drafting replaces the mask's guesses where it saw. `confidence`: the draft's top
    probability per position (draft_pass), for every K under the confidence stop. Its `evidence` holds what each walked
    strategy's acceptance learns from the answer."""
    k_max, max_new_tokens = settings.k_max, settings.max_new_tokens
    observed = changed = 0
    if mask is not None and rounds:
        mask, observed, changed = corrected(mask, observed_matches(rounds, len(mask)))
    ar = autoregressive_seconds(costs, len(prompt_ids), len(answer_ids))
    args = (costs, len(prompt_ids), max_new_tokens, ar)
    fixed = [walk_fixed(mask, k, *args) for k in range(1, k_max + 1)] if mask is not None else []
    stops = confidence_stops(costs, k_max)
    stopped = [walk_fixed(mask, k, *args, confidence, stops) for k in range(1, k_max + 1)] \
        if mask is not None and confidence is not None and stops else []
    gate = gate_threshold(costs)
    gated = [walk_fixed(mask, k, *args, confidence, stops, gate) for k in range(1, k_max + 1)] \
        if mask is not None and confidence is not None and gate else []
    oracle = walk_oracle(mask, k_max, *args) if mask is not None else Walk(0, 0, 0, 0, 0.0, 0.0)
    drafters = replay_drafters(settings)
    replayed = {name: [walk_replayed(d, prompt_ids, answer_ids, k, costs, max_new_tokens, ar) for k in range(1, k_max + 1)]
                for name, d in drafters.items()}
    result = Counterfactual(len(answer_ids), mask or [], ar, fixed, oracle, replayed, observed=observed,
                            corrected=changed, stopped=stopped, gated=gated)
    result.evidence = {name: replay_counts(d, prompt_ids, answer_ids, k_max) for name, d in drafters.items()}
    if mask is not None:
        result.evidence[MASKED] = mask_counts(mask, k_max)
    return result
