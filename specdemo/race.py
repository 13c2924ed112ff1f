"""Timing races between compiles of one model, in the decoding loop's own call patterns: how tune (and the draft plan,
specdemo/draft_choice.py) tell which candidate is fastest on a shared machine.

    seconds = race([compile_a, compile_b], draft, sample_target)   # each target's median t(1) + t(ROUND)
    seconds = race([draft_a, draft_b], target, sample_draft)       # each draft's median step inside a round

A sample is a few calls as the loop makes them (single steps one after another; a round's draft steps, then the
target's verify call, both caches rolled back). The candidates take turns sample by sample, in alternating order, so
the drift of a shared machine hits them alike; heats run until two in a row agree on the fastest.
"""

from __future__ import annotations

import statistics

CONTEXT = 160  # tokens of context every timed call follows
PER_SAMPLE, UNTIMED = 3, 1  # timed calls in one sample of a candidate, after an untimed one
RACE_ROUNDS = 5  # samples of every candidate in one heat, taken in turns
MAX_HEATS = 4  # heats run until two in a row agree on the fastest
ROUND = 4  # the verify call's size (K = 3 drafts and the target's token) and the draft steps per round, minus one


def _ids(n: int, offset: int = 0) -> list[int]:
    # Ordinary token ids (common sub-words in any large vocabulary); their values do not change the cost.
    return [(1000 + 37 * (i + offset)) % 30000 + 100 for i in range(n)]


def prefill(model) -> None:
    """The context every timed call follows."""
    model.reset()
    model.forward(_ids(CONTEXT))


def sample_target(model, draft) -> float:
    """One sample of t(1) + t(ROUND) of a target, in the loop's patterns: steps one after another, and verify calls of
    ROUND tokens (ROUND rows of logits) after ROUND - 1 draft steps, the caches rolled back after each (both hold
    CONTEXT tokens before and after)."""
    steps, verifies = [], []
    for i in range(UNTIMED + PER_SAMPLE):
        model.forward(_ids(1, i))
        steps.append(model.last_call_s)
    model.rollback(CONTEXT)
    for i in range(UNTIMED + PER_SAMPLE):
        for j in range(ROUND - 1):
            draft.forward(_ids(1, j))
        model.forward(_ids(ROUND), logits_to_keep=ROUND)
        verifies.append(model.last_call_s)
        model.rollback(CONTEXT)
        draft.rollback(CONTEXT)
    return statistics.median(steps[UNTIMED:]) + statistics.median(verifies[UNTIMED:])


def sample_draft(model, target) -> float:
    """One sample of a draft step inside a round: ROUND - 1 draft steps, then the target's verify call, both rolled back."""
    steps = []
    for i in range(UNTIMED + PER_SAMPLE):
        for j in range(ROUND - 1):
            model.forward(_ids(1, j))
            if i >= UNTIMED:
                steps.append(model.last_call_s)
        target.forward(_ids(ROUND), logits_to_keep=ROUND)
        model.rollback(CONTEXT)
        target.rollback(CONTEXT)
    return statistics.median(steps)


def race(models: list, other, sample) -> list[float]:
    """Each model's median seconds. The models take turns sample by sample (in alternating order), so the drift of a
    shared machine hits them alike, in heats of RACE_ROUNDS samples, until two heats in a row agree on the fastest (at
    most MAX_HEATS); the medians are over every sample."""
    for model in [*models, other]:
        prefill(model)
    samples = [[] for _ in models]
    winners = []
    for heat in range(MAX_HEATS):
        this = [[] for _ in models]
        for r in range(RACE_ROUNDS):
            order = range(len(models)) if r % 2 == 0 else reversed(range(len(models)))
            for i in order:
                this[i].append(sample(models[i], other))
        winners.append(min(range(len(models)), key=lambda i: statistics.median(this[i])))
        for i, values in enumerate(this):
            samples[i] += values
        if len(winners) >= 2 and winners[-1] == winners[-2]:
            break
    return [statistics.median(values) for values in samples]
