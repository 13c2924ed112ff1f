"""Timing races between compiles of one model, in the decoding loop's own call patterns: how tune (and the draft plan,
specdemo/draft_choice.py) tell which candidate is fastest on a shared machine.

    seconds = race([compile_a, compile_b], draft, sample_target)   # each target's median t(1) + t(4) + t(7)
    seconds = race([draft_a, draft_b], target, sample_draft)       # each draft's median step inside a round

A sample is a few calls as the loop makes them (single steps one after another; a round's draft steps, then the
target's verify call, both caches rolled back). The candidates take turns sample by sample, in alternating order, so
the drift of a shared machine hits them alike; heats run until two in a row agree on the fastest. Tune and the draft
plan race two at a time (the incumbent against one challenger), so that two compiles of a model are alive at once.
"""

from __future__ import annotations

import statistics

CONTEXT = 160  # tokens of context every timed call follows
PIECE = 16  # tokens a call of the context's prefill (see prefill)
PER_SAMPLE, UNTIMED = 3, 1  # timed calls in one sample of a candidate, after an untimed one
RACE_ROUNDS = 5  # samples of every candidate in one heat, taken in turns
MAX_HEATS = 4  # heats run until two in a row agree on the fastest
ROUND = 4  # the short verify call's size (K = 3 drafts and the target's token) and the draft steps per round, minus one
# The verify calls a target is timed at: a short round's and a long one's (K = 6, what auto K plans where drafts are
# cheap). Both, because a compile's cost can jump between them: the GGUF's own blocks under dynamic quantization in
# groups of 32 score 4 tokens in 1.3 single steps but 5 in 1.9 (AMD EPYC Zen 5), in groups of 16 1.3 and 1.4.
VERIFY_SIZES = (ROUND, 7)


def _ids(n: int, offset: int = 0) -> list[int]:
    # Ordinary token ids (common sub-words in any large vocabulary); their values do not change the cost.
    return [(1000 + 37 * (i + offset)) % 30000 + 100 for i in range(n)]


def prefill(model) -> None:
    """The context every timed call follows, fed PIECE tokens a call: the CPU plugin keeps memory sized by a compile's
    longest call after the compile is let go (OpenVINO 2026.4: 70 MiB for one call of 160 tokens of the 1.5B target,
    12 MiB in calls of 16), and tune lets go of a dozen compiles in one process."""
    model.reset()
    context = _ids(CONTEXT)
    for begin in range(0, CONTEXT, PIECE):
        model.forward(context[begin:begin + PIECE])


def sample_target(model, draft) -> float:
    """One sample of t(1) + t(4) + t(7) of a target (VERIFY_SIZES), in the loop's patterns: steps one after another,
    and verify calls of n tokens (n rows of logits) after ROUND - 1 draft steps, the caches rolled back after each
    (both hold CONTEXT tokens before and after)."""
    steps = []
    for i in range(UNTIMED + PER_SAMPLE):
        model.forward(_ids(1, i))
        steps.append(model.last_call_s)
    model.rollback(CONTEXT)
    total = statistics.median(steps[UNTIMED:])
    for n in VERIFY_SIZES:
        verifies = []
        for i in range(UNTIMED + PER_SAMPLE):
            for j in range(ROUND - 1):
                draft.forward(_ids(1, j))
            model.forward(_ids(n), logits_to_keep=n)
            verifies.append(model.last_call_s)
            model.rollback(CONTEXT)
            draft.rollback(CONTEXT)
        total += statistics.median(verifies[UNTIMED:])
    return total


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
