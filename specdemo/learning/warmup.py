"""What a loaded pair learns about this machine, kept in the machine profile: its cost curve (specdemo/learning/measuring.py,
once per compiled pair; the calls also pay every first-call cost), how far its batched calls move a top-2 gap
(specdemo/results/fidelity.py, once per compile), and the draft's first acceptance evidence (once per pair).

A page learns it in two stages so that it is ready in seconds: before it is ready, every shape warmed up and a quick,
provisional cost curve (`quick`); after, in turns of their own between visitors' runs, each of the rest (`remaining`):
the full cost curve, the batching noise, the acceptance evidence. A run before them plans by what is there and says so.
"""

from __future__ import annotations

from typing import Callable

from specdemo.learning import builtin, measuring
from specdemo.results import fidelity
from specdemo.results.counterfactual import agreement_mask, mask_counts
from specdemo.decoding.drafters import MASKED
from specdemo.learning.profile import Keys
from specdemo.models.runtime import release_weight_pages
from specdemo.settings import GenerationSettings

_NO_LIMIT = GenerationSettings(max_new_tokens=1)  # a built-in prompt is checked against the context, not an answer


def know_machine(engine, k_max: int, fresh: bool, log, quick: bool = False) -> tuple[Keys, fidelity.BatchingNoise | None]:
    """Warm `engine` (an engine.Engine, its lock held) up: its costs known or measured (`fresh`: measured again), its
    batching noise, a first acceptance prior, kept in the profile. Returns the pair's keys (their costs' key now known)
    and its batching noise, for the engine to hold. `quick`: only what a first run needs (every shape warmed up, the
    costs known or measured quickly, the noise if known, else None); the rest is `remaining`. With learning off
    (profile.learns) what it measures serves this process only, and the prior is not calibrated."""
    target, draft = engine.target.runtime, engine.draft.runtime if engine.draft else None
    description = measuring.describe_key(target, draft, k_max + 1)
    key = measuring.cost_key(description)
    known = None if fresh else engine.profile.costs(key)
    measured = measuring.measure(target, draft, k_max + 1, known, log, quick)
    if measured is not known:
        engine.profile.keep_costs(key, measured, description)
    keys = Keys(key, engine.keys.pair)
    if quick:
        noise = engine.profile.noise(key)
    else:
        noise = batching_noise(engine, k_max, log, key)
        if needs_calibration(engine):
            log("learning how often the draft agrees with the target, on built-in answers (once per machine)")
            calibrate(engine, k_max)
    release_weight_pages()  # every shape has run: the plugin works from its own copies of the weights now
    return keys, noise


def needs_calibration(engine) -> bool:
    """Whether the pair has a draft model and no acceptance evidence of it yet (and learning is on)."""
    return engine.draft is not None and engine.profile.learns() and not engine.acceptance().has_evidence(MASKED, True)


def remaining(engine, k_max: int, log, interrupted=lambda: False,
              pair_only: bool = False) -> list[tuple[str, Callable[[], None]]]:
    """What a quickly warmed-up `engine` (know_machine(quick=True)) still has to learn, as (what, step) to run one at a
    time, each with the engine's lock held by the caller: the full cost curve where it is provisional (stopped by
    `interrupted()`, measuring.Interrupted), the batching noise where it is unknown, the acceptance evidence where there
    is none. [] once it knows them all.

    `pair_only`: only what the pair keeps whatever its compile (the acceptance evidence). A tune about to run measures
    the cost curve afresh and the noise of the compile it chooses (cli/tune_command.tune_machine): measured here first,
    they would serve only the runs before it ends, and hold its start back by a minute."""
    steps, of_the_compile = [], not pair_only
    if of_the_compile and engine.costs is not None and engine.costs.provisional:
        steps.append(("measuring this machine's call costs in full",
                      lambda: _measure_in_full(engine, k_max, log, interrupted)))
    if of_the_compile and engine.noise is None:
        steps.append(("measuring the batching noise", lambda: setattr(engine, "noise", batching_noise(engine, k_max, log))))
    if needs_calibration(engine):
        steps.append(("learning how often the draft agrees with the target", lambda: calibrate(engine, k_max)))
    return steps


def _measure_in_full(engine, k_max: int, log, interrupted) -> None:
    """The full cost curve in place of the provisional one (its key stays: the same compiled models)."""
    target, draft = engine.target.runtime, engine.draft.runtime if engine.draft else None
    engine.profile.keep_costs(engine.keys.costs,
                              measuring.measure(target, draft, k_max + 1, None, log, interrupted=interrupted))


def _examples(engine) -> list[tuple[list[int], list[int]]]:
    """The built-in code answers as (prompt ids, answer ids) for this engine's chat template."""
    return [(engine.prompt_ids(e["instruction"], _NO_LIMIT), engine.tokenizer.encode(e["answer"], add_special_tokens=False))
            for e in builtin.code_answers()]


def batching_noise(engine, k_max: int, log, key: str | None = None) -> fidelity.BatchingNoise:
    """How far this target's batched calls move a top-2 gap from its single steps (fidelity.BatchingNoise): what a
    parting of the greedy lanes is judged against. Measured once per compile (~7 s on 2 cores), kept under `key` (the
    pair's costs key; default the engine's)."""
    key = key or engine.keys.costs
    noise = engine.profile.noise(key)
    if noise is None:
        log("measuring how far this compile's batched calls differ from its single steps (once per compile)")
        sizes = tuple(n for n in fidelity.NOISE_SIZES if n <= k_max + 1)
        noise = fidelity.batching_noise(engine.target.runtime, _examples(engine), sizes=sizes)
        engine.profile.keep_noise(key, noise)
    if noise.suspect:
        log(f"this compile is suspect: {noise.suspect}")
    return noise


def calibrate(engine, k_max: int) -> None:
    """The acceptance prior's first evidence, before any run: where the draft's greedy token equals the target's on a
    few built-in answers (teacher forced, a couple of seconds). Without it a new machine would plan its first run on a
    guessed α, and a guess that says no K pays would draft nothing and so teach nothing."""
    tested, accepted = [0] * k_max, [0] * k_max
    for prompt, text in _examples(engine):
        mask = agreement_mask(engine.target.runtime, engine.draft.runtime, prompt, text)
        for totals, counts in zip((tested, accepted), mask_counts(mask, k_max)):
            for i, n in enumerate(counts):
                totals[i] += n
    engine.profile.record_acceptance(engine.keys.pair, MASKED, True, tested, accepted)
