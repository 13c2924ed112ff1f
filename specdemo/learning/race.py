"""Timing races between two compiles of one model, in the decoding loop's own call patterns: how tune (and the draft
plan, specdemo/learning/draft_choice.py) tell whether a challenger is faster than the incumbent on a shared machine.

    verdict = race(incumbent, challenger, draft, sample_target)   # t(1) + t(4) + t(7) of two targets
    verdict = race(incumbent, challenger, target, sample_draft)   # a draft step inside a round, of two drafts
    verdict.faster, verdict.ratio                                  # challenger clearly MARGIN faster; its time ÷ the incumbent's

A sample is a few calls as the loop makes them (single steps one after another; a round's draft steps, then the
target's verify call, both caches rolled back), each kind counted by its fastest call: other work on a shared machine
only ever adds time, so the fastest is the one it disturbed least. The two compiles are sampled in pairs, back to back, the order
alternating, so the drift of a shared machine hits both alike and each pair gives one log ratio
d = ln(challenger's sample ÷ incumbent's).

The stopping rule, a sequential test on those paired log ratios: after MIN_PAIRS pairs, and after every pair from
then on, the LEVEL confidence interval of their mean (Student's t on the pairs' own spread) is compared with the
MARGIN band, ±ln(1 / (1 − MARGIN)) around 0. The race stops as soon as the interval lies wholly outside the band: the
challenger clearly faster by more than MARGIN (`faster`: the tune may take it), or clearly slower by more than MARGIN.
Otherwise it runs to MAX_PAIRS pairs and the challenger is not faster: a tie keeps the incumbent. Simulated with a
spread of 2 to 20 % a sample (normal and heavy-tailed noise, 1,000 races each; tests/learning/test_race.py), a challenger no
faster than the incumbent is crowned in under 3 % of races and one exactly MARGIN faster in under 5 %; one 10 % faster
is crowned after 4–5 pairs at a 2 % spread, in 88 % of races at 5 %, and a third at 10 % (noise costs gains, not
false ones).

A race that runs to its cap on a busy host (host/load.py: stolen time, others' CPU time) is run again, BUSY_REPEATS
times at most, where a watch of the host finds it quiet by then: the paired samples cancel the drift of a host, not a
neighbour who takes a core for part of the race.
Still busy, its verdict is kept, marked (Verdict.busy), and what is decided on it says so. A race that settles on a
busy host stands: its interval was taken on its own spread.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from specdemo.host import load

CONTEXT = 160  # tokens of context every timed call follows
PIECE = 16  # tokens a call of the context's prefill (see prefill)
PER_SAMPLE, UNTIMED = 2, 1  # timed calls of each kind in one sample (the fastest counts), after an untimed first call
ROUND = 4  # the short verify call's size (K = 3 drafts and the target's token) and the draft steps per round, minus one
# The verify calls a target is timed at: a short round's and a long one's (K = 6, what auto K plans where drafts are
# cheap). Both, because a compile's cost can jump between them: the GGUF's own blocks under dynamic quantization in
# groups of 32 score 4 tokens in 1.3 single steps but 5 in 1.9 (AMD EPYC Zen 5), in groups of 16 1.3 and 1.4.
VERIFY_SIZES = (ROUND, 7)

MARGIN = 0.03  # a challenger is faster only if it takes at most 1 − MARGIN of the incumbent's time (noise is no gain)
LEVEL = 0.98  # the coverage of the confidence interval the stopping rule reads
MIN_PAIRS, MAX_PAIRS = 4, 12  # pairs of samples before the first look, and at most
PRECISE = 0.05  # a race that measures rather than decides (the draft plan's) also stops once the ratio is known to ±5 %
MEASURING_PAIRS = 8  # and after this many pairs at most: what it prices is a predicted speedup, itself within MARGIN
BUSY_REPEATS = 1  # a race run to its cap on a busy host is run again at most this many times


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


FAITHFUL_VERIFY = 5  # tokens of the verification the faithful race times beside a single step: K = 4, the plan's usual


def sample_step(model, other=None) -> float:
    """One sample of a target's single step, as the autoregressive lane makes them one after another (the fastest of
    PER_SAMPLE after an untimed first call), the cache rolled back after; `other` is not called."""
    steps = []
    for i in range(UNTIMED + PER_SAMPLE):
        model.forward(_ids(1, i))
        steps.append(model.last_call_s)
    model.rollback(CONTEXT)
    return min(steps[UNTIMED:])


def sample_step_and_verify(model, other=None) -> float:
    """One sample of t(1) + t(FAITHFUL_VERIFY) of a target: a single step as the autoregressive lane makes them and a
    verification call as the speculative lane makes it (n rows of logits), the cache rolled back after; `other` is not
    called. The faithful race's sample: a layout must be quick at both lanes' calls (specdemo's kernels decode a weight
    block once for 4 activation rows, the plugin's for many)."""
    total = sample_step(model)
    verifies = []
    for _ in range(PER_SAMPLE):
        model.forward(_ids(FAITHFUL_VERIFY), logits_to_keep=FAITHFUL_VERIFY)
        verifies.append(model.last_call_s)
        model.rollback(CONTEXT)
    return total + min(verifies)


def sample_target(model, draft) -> float:
    """One sample of t(1) + t(4) + t(7) of a target (VERIFY_SIZES), in the loop's patterns: steps one after another,
    and verify calls of n tokens (n rows of logits) after ROUND - 1 draft steps, the caches rolled back after each
    (both hold CONTEXT tokens before and after). The sample's first call is untimed: it follows the other compile's."""
    total = sample_step(model, draft)
    for n in VERIFY_SIZES:
        verifies = []
        for i in range(PER_SAMPLE):
            for j in range(ROUND - 1):
                draft.forward(_ids(1, j))
            model.forward(_ids(n), logits_to_keep=n)
            verifies.append(model.last_call_s)
            model.rollback(CONTEXT)
            draft.rollback(CONTEXT)
        total += min(verifies)
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
    return min(steps)


@dataclass(frozen=True)
class Verdict:
    """What a race of a challenger against the incumbent found (seconds are a sample's, as `sample` gives them)."""

    incumbent_s: float  # the incumbent's median sample
    challenger_s: float  # the challenger's
    ratio: float  # the challenger's time over the incumbent's: exp of the mean paired log ratio
    low: float  # the LEVEL confidence interval of that ratio
    high: float
    pairs: int  # pairs of samples taken
    busy: str = ""  # why the race may not show the quiet host's times, in one sentence (HostLoad.busy); "" when clean

    @property
    def faster(self) -> bool:
        """The challenger clearly takes less than 1 − MARGIN of the incumbent's time."""
        return self.high < 1 - MARGIN

    @property
    def slower(self) -> bool:
        """The challenger clearly takes more than 1 / (1 − MARGIN) of the incumbent's time."""
        return self.low > 1 / (1 - MARGIN)

    @property
    def settled(self) -> bool:
        """The interval lies wholly outside the MARGIN band: the race may stop."""
        return self.faster or self.slower

    @property
    def precise(self) -> bool:
        """The interval is within ±PRECISE of the ratio."""
        return self.high <= self.ratio * (1 + PRECISE) and self.low >= self.ratio / (1 + PRECISE)


def verdict(incumbent: list[float], challenger: list[float]) -> Verdict:
    """The verdict on paired samples (seconds; incumbent[i] and challenger[i] taken back to back)."""
    d = [math.log(c / a) for a, c in zip(incumbent, challenger)]
    mean = statistics.fmean(d)
    half = t_quantile(1 - (1 - LEVEL) / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 \
        else math.inf
    return Verdict(statistics.median(incumbent), statistics.median(challenger), math.exp(mean),
                   math.exp(mean - half), math.exp(mean + half), len(d))


def race(incumbent, challenger, other, sample, measuring: bool = False) -> Verdict:
    """Sample the two compiles in pairs (the order alternating) until the stopping rule settles or MAX_PAIRS pairs;
    `other` is the model each sample's calls interleave with (the draft of a target's sample, the target of a draft's).
    `measuring`: the ratio is what is wanted, not a decision (the draft plan prices it), so the race also stops once
    the ratio is `precise`, and after MEASURING_PAIRS pairs at most. Run to its cap on a busy host, the race is run
    again (BUSY_REPEATS) if a watch of the host finds it quiet by then; the verdict of the least busy take is kept,
    `busy` saying why when every take was."""
    for model in (incumbent, challenger, other):
        if model is not None:  # a single step's race has no other model
            prefill(model)
    takes = []
    while not takes or takes[-1].busy and not stopped(takes[-1], measuring) and len(takes) <= BUSY_REPEATS:
        if takes and load.busy_now(load.WATCH_S):
            break  # a host still loaded would only run it to its cap again
        watch = load.start()
        ours, theirs = _pairs(incumbent, challenger, other, sample, measuring)
        # Judged by the host's counters alone: the race's own noise is in its interval already (a noisy race ties;
        # it does not crown), and the range of a dozen pairs' ratios grows with their number.
        takes.append(replace(verdict(ours, theirs), busy=load.judge(load.since(watch))))
    return min(takes, key=lambda take: (bool(take.busy), take.high / take.low))


def stopped(result: Verdict, measuring: bool = False) -> bool:
    """Whether a race stopped by its rule (settled; or, `measuring`, precise) rather than at its cap."""
    return result.settled or measuring and result.precise


def _pairs(incumbent, challenger, other, sample, measuring: bool) -> tuple[list[float], list[float]]:
    """The paired samples of one race (incumbent's, challenger's), by race's rule."""
    ours, theirs = [], []
    for i in range(MEASURING_PAIRS if measuring else MAX_PAIRS):
        if i % 2 == 0:
            ours.append(sample(incumbent, other))
            theirs.append(sample(challenger, other))
        else:
            theirs.append(sample(challenger, other))
            ours.append(sample(incumbent, other))
        if i + 1 >= MIN_PAIRS and stopped(verdict(ours, theirs), measuring):
            break
    return ours, theirs


def alone(model, other, sample, samples: int = MIN_PAIRS) -> float:
    """A compile's median sample when there is no one to race (seconds)."""
    prefill(model)
    prefill(other)
    return statistics.median(sample(model, other) for _ in range(samples))


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the normal quantile z corrected by the series of Abramowitz & Stegun 26.7.5 (within 0.5 %
    of the exact value from 3 degrees of freedom on)."""
    z = statistics.NormalDist().inv_cdf(p)
    terms = ((z ** 3 + z) / 4,
             (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(term / df ** (k + 1) for k, term in enumerate(terms))
