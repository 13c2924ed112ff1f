"""What a loaded pair learns about this machine, kept in the machine profile: its cost curve (specdemo/learning/measuring.py,
once per compiled pair; the calls also pay every first-call cost), how far its batched calls move a top-2 gap
(specdemo/results/fidelity.py, once per compile), and the draft's first acceptance evidence (once per pair).

A page learns it in two stages so that it is ready in seconds: before it is ready, every shape warmed up and a quick,
provisional cost curve (`quick`); after, in turns of their own between visitors' runs, each of the rest (`remaining`):
the full cost curve, the batching noise, the acceptance evidence. A run before them plans by what is there and says so.

A warm-up is handed values (a Pair: the compiled models, the profile, the pair's keys, the built-in answers encoded)
and keeps what it learns in the profile, the owner of what is learnt; what the engine holds (the keys, the batching
noise) it returns, and the engine assigns.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from specdemo.learning import measuring
from specdemo.learning.profile import Keys, Profile
from specdemo.results import fidelity
from specdemo.results.counterfactual import agreement_mask, mask_counts
from specdemo.decoding.drafters import MASKED
from specdemo.models.runtime import OVModel, release_weight_pages


@dataclass(frozen=True)
class Pair:
    """What a warm-up learns about, and where it keeps it."""

    target: OVModel  # the target's compiled model
    draft: OVModel | None  # the draft's; None without a draft model
    profile: Profile  # the machine profile: everything learnt is kept there
    keys: Keys  # the pair's keys in the profile (its costs' key None before its first warm-up)
    examples: list[tuple[list[int], list[int]]]  # the built-in code answers as (prompt ids, answer ids), in the
    #                                              pair's chat template (models/chat.py encode_example)


def know_machine(pair: Pair, k_max: int, fresh: bool, log, quick: bool = False) -> tuple[Keys, fidelity.BatchingNoise | None]:
    """Warm `pair` up (its engine's lock held): its costs known or measured (`fresh`: measured again), its batching
    noise, a first acceptance prior, kept in the profile. Returns the pair's keys (their costs' key now known) and its
    batching noise, for the engine to hold. `quick`: only what a first run needs (every shape warmed up, the costs known
    or measured quickly, the noise if known, else None); the rest is `remaining`. With learning off (profile.learns)
    what it measures serves this process only, and the prior is not calibrated."""
    description = measuring.describe_key(pair.target, pair.draft, k_max + 1)
    key = measuring.cost_key(description)
    known = None if fresh else pair.profile.costs(key)
    measured = measuring.measure(pair.target, pair.draft, k_max + 1, known, log, quick)
    if measured is not known:
        pair.profile.keep_costs(key, measured, description)
    keys = Keys(key, pair.keys.pair)
    if quick:
        noise = pair.profile.noise(key)
    else:
        noise = batching_noise(pair, k_max, log, key)
        if needs_calibration(pair.profile, pair.keys.pair, pair.draft is not None):
            log("learning how often the draft agrees with the target, on built-in answers (once per machine)")
            calibrate(pair, k_max)
    release_weight_pages()  # every shape has run: the plugin works from its own copies of the weights now
    return keys, noise


def needs_calibration(profile: Profile, pair: str, drafts: bool) -> bool:
    """Whether a pair (`pair`: its key) that `drafts` with a draft model has no acceptance evidence of it yet (and
    learning is on)."""
    return drafts and profile.learns() and not profile.acceptance(pair).has_evidence(MASKED, True)


def remaining(pair: Pair, noise: fidelity.BatchingNoise | None, k_max: int, log, interrupted=lambda: False,
              pair_only: bool = False) -> list[tuple[str, Callable[[], fidelity.BatchingNoise | None]]]:
    """What a quickly warmed-up pair (know_machine(quick=True)) still has to learn, its batching noise `noise` as its
    engine holds it, as (what, step) to run one at a time, each with the engine's lock held by the caller: the full
    cost curve where it is provisional, or was measured busy (measuring.measure_again; stopped by `interrupted()`,
    measuring.Interrupted), the batching noise where it
    is unknown, the acceptance evidence where there is none. [] once it knows them all. Each step keeps what it learns
    in the profile; the noise's step returns the noise, for the engine to hold (the others None).

    `pair_only`: only what the pair keeps whatever its compile (the acceptance evidence). A tune about to run measures
    the cost curve afresh and the noise of the compile it chooses (cli/tune_command.tune_machine): measured here first,
    they would serve only the runs before it ends, and hold its start back by a minute."""
    steps, of_the_compile = [], not pair_only
    costs = pair.profile.costs(pair.keys.costs)
    if of_the_compile and costs is not None and (costs.provisional or measuring.measure_again(costs)):
        what = "in full" if costs.provisional else "again (the last measurement was taken while the host was busy)"
        steps.append((f"measuring this machine's call costs {what}",
                      lambda: _measure_in_full(pair, k_max, log, interrupted)))
    if of_the_compile and noise is None:
        steps.append(("measuring the batching noise",
                      lambda: batching_noise(pair, k_max, log, interrupted=interrupted)))
    if needs_calibration(pair.profile, pair.keys.pair, pair.draft is not None):
        steps.append(("learning how often the draft agrees with the target",
                      lambda: calibrate(pair, k_max, interrupted)))
    return [(what, _interruptible(pair, interrupted, step)) for what, step in steps]


def _interruptible(pair: Pair, interrupted: Callable[[], bool], step: Callable[[], object]) -> Callable[[], object]:
    """`step` with both models' long calls (prefills, teacher-forced answers) stopped part-way once `interrupted()` says
    so (OVModel.interruptible): a visitor waits for one node, not for a 3-7 s prefill to end."""
    def run():
        with ExitStack() as stack:
            for model in (pair.target, pair.draft):
                if model is not None:
                    stack.enter_context(model.interruptible(interrupted))
            return step()
    return run


def _measure_in_full(pair: Pair, k_max: int, log, interrupted) -> None:
    """The full cost curve in place of the provisional or busy one (its key stays: the same compiled models)."""
    before = pair.profile.costs(pair.keys.costs)
    measured = measuring.measure(pair.target, pair.draft, k_max + 1, None, log, interrupted=interrupted)
    pair.profile.keep_costs(pair.keys.costs, measuring.counted(measured, before))


def batching_noise(pair: Pair, k_max: int, log, key: str | None = None,
                   interrupted=lambda: False) -> fidelity.BatchingNoise:
    """How far this target's batched calls move a top-2 gap from its single steps (fidelity.BatchingNoise): what a
    parting of the greedy lanes is judged against. Measured once per compile (~7 s on 2 cores), kept under `key` (the
    pair's costs key; default its keys'). `interrupted()` is asked before each answer's calls of each size: True stops
    it (measuring.Interrupted, the target's cache emptied, nothing kept)."""
    key = key or pair.keys.costs
    noise = pair.profile.noise(key)
    if noise is None:
        log("measuring how far this compile's batched calls differ from its single steps (once per compile)")
        sizes = tuple(n for n in fidelity.NOISE_SIZES if n <= k_max + 1)
        try:
            stop = lambda: measuring.stop_if(interrupted, "while measuring the batching noise")  # noqa: E731
            noise = fidelity.batching_noise(pair.target, pair.examples, sizes=sizes, check=stop)
        except measuring.Interrupted:
            pair.target.reset()
            raise
        pair.profile.keep_noise(key, noise)
    if noise.suspect:
        log(f"this compile is suspect: {noise.suspect}")
    return noise


def calibrate(pair: Pair, k_max: int, interrupted=lambda: False) -> None:
    """The acceptance prior's first evidence, before any run: where the draft's greedy token equals the target's on a
    few built-in answers (teacher forced, a couple of seconds; 14 s on the 2-core Zen 3 with an INT4 draft). Without it
    a new machine would plan its first run on a guessed α, and a guess that says no K pays would draft nothing and so
    teach nothing. `interrupted()` is asked before each answer: True stops it (measuring.Interrupted, nothing kept), so
    a visitor waits for one answer, not all of them (as a step of `remaining`, not even for that: _interruptible)."""
    tested, accepted = [0] * k_max, [0] * k_max
    for prompt, text in pair.examples:
        measuring.stop_if(interrupted, "before an answer of the draft's agreement")
        mask = agreement_mask(pair.target, pair.draft, prompt, text)
        for totals, counts in zip((tested, accepted), mask_counts(mask, k_max)):
            for i, n in enumerate(counts):
                totals[i] += n
    pair.profile.record_acceptance(pair.keys.pair, MASKED, True, tested, accepted)
