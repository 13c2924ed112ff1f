"""Whether a compile setting keeps the greedy lanes identical, as tune asks it of a faster target setting: its verify
calls may choose another greedy token than its single steps (the kernels for one and for several rows round
differently) no more often than the defaults' do, counting noise aside. Only the fastest configuration's target may
trade identity for speed.

    judge = identity.judge(pairs)            # model -> fidelity.BatchingNoise over up to POSITIONS answer tokens
    identity.parts_no_more(trial, defaults)  # the rule, on trials whose parting rates were measured
"""

from __future__ import annotations

from specdemo.learning import builtin
from specdemo.settings import CONFIGURATIONS, ModelSettings

POSITIONS = 320  # built-in code and prose answer tokens scored by single steps and by verify calls (~1 min)
SIZES = (2, 4, 8, 13)  # verify-call sizes tried: K = 1, 3, 7 and 12


def keeps_identity(target: ModelSettings) -> bool:
    """Whether tune holds this target to the defaults' parting rate: every target but the fastest configuration's,
    which trades identity for speed by design."""
    fastest = CONFIGURATIONS["fastest"][0]
    return (target.source, target.precision) != (fastest.source, fastest.precision)


def examples(code: list[dict]) -> list[dict]:
    """The built-in code answers and prose answers (assets/prose.json, where near-ties are common) in turns, so that a
    cap on positions keeps both."""
    prose = builtin.prose_answers()
    return [e for pair in zip(code, prose) for e in pair] + code[len(prose):] + prose[len(code):]


def judge(pairs: list[tuple[list[int], list[int]]]):
    """model -> fidelity.BatchingNoise over `pairs` (prompt ids, answer ids), up to POSITIONS tokens: its flips only
    (the verify calls with nothing rolled back, which no parting comes from, are not made: ~30 s less a setting)."""
    from specdemo.results.fidelity import batching_noise

    return lambda model: batching_noise(model, pairs, POSITIONS, SIZES, clean=False)


def parts_no_more(trial, defaults) -> bool:
    """Whether `trial`'s verify calls part from its single steps no more often than the defaults', counting noise aside
    (both tune.Trial). The defaults' partings are a count of rare events: a candidate may part up to one standard
    deviation of that count (at least one parting) more often over as many positions. 3 partings against the defaults'
    2 in 320 positions is no evidence of a difference (the GGUF's blocks in groups of 16 on the Zen 5, 18 % faster); 6
    against 2 is (bf16). `defaults` None (not measured): only a candidate that parts at most once passes, as it would
    against any defaults (~1 min of measuring the defaults spared)."""
    partings = round(trial.parting_rate * trial.parting_positions / 1000)  # a count, kept as a rate
    if defaults is None:
        return partings <= 1
    expected = defaults.parting_rate * trial.parting_positions / 1000
    return partings <= expected + max(1.0, expected ** 0.5)


def measured(trial, model, compiled, parting, log) -> bool:
    """Whether the trial's parting rate (per 1,000 positions) is known, measured once and kept on it: on `model`, else
    on a compile of its own (`compiled(trial)`; None when memory does not allow one), let go after."""
    if trial.parting_rate != trial.parting_rate:
        model = model if model is not None else compiled(trial)
        if model is None:
            return False
        noise = parting(model)
        trial.parting_rate, trial.parting_positions = noise.parting_rate, noise.positions
        log(f"  {trial.role} {trial.setting.describe()}: greedy choices of verify calls differ from single steps at "
            f"{trial.parting_rate:.1f} per 1,000 positions")
    return True
