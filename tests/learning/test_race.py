"""The race's stopping rule on synthetic timings: a clear winner stops early, a tie runs to the cap and keeps the
incumbent, and noisy data does not crown a false winner more often than specdemo/learning/race.py's docstring says."""

import math

import numpy as np
import pytest

from specdemo.learning import race


class Timed:
    """A stand-in compile whose every sample is drawn from `draw` (seconds)."""

    def __init__(self, draw):
        self.draw = draw

    def reset(self):
        pass

    def forward(self, ids, logits_to_keep=1):
        pass


def sample(model, other) -> float:
    return model.draw()


def noisy(ratio: float, spread: float, rng, heavy: bool = False):
    """An incumbent of 50 ms and a challenger `ratio` times as long, both sampled with a log-normal spread `spread` (or
    a Student t with 3 degrees of freedom, for a shared machine's hiccups, `heavy`)."""
    def noise() -> float:
        return rng.standard_t(3) / math.sqrt(3) if heavy else rng.standard_normal()

    def draw(mean_s):
        return lambda: mean_s * math.exp(spread * noise())

    return Timed(draw(0.050)), Timed(draw(0.050 * ratio))


def test_a_clear_winner_stops_after_the_first_look():
    incumbent, challenger = Timed(lambda: 0.050), Timed(lambda: 0.040)
    verdict = race.race(incumbent, challenger, Timed(lambda: 0.0), sample)
    assert verdict.faster and verdict.pairs == race.MIN_PAIRS and verdict.ratio == pytest.approx(0.8)
    rng = np.random.default_rng(0)
    verdict = race.race(*noisy(0.90, 0.02, rng), Timed(lambda: 0.0), sample)  # 10 % faster, 2 % spread
    assert verdict.faster and verdict.pairs <= race.MIN_PAIRS + 1


def test_a_clear_loser_stops_early_too():
    verdict = race.race(Timed(lambda: 0.050), Timed(lambda: 0.100), Timed(lambda: 0.0), sample)
    assert verdict.slower and not verdict.faster and verdict.pairs == race.MIN_PAIRS


def test_a_tie_runs_to_the_cap_and_keeps_the_incumbent():
    rng = np.random.default_rng(1)
    verdict = race.race(*noisy(1.0, 0.03, rng), Timed(lambda: 0.0), sample)
    assert verdict.pairs == race.MAX_PAIRS and not verdict.faster and not verdict.slower
    assert verdict.low < 1 < verdict.high


def test_a_race_that_measures_stops_once_its_ratio_is_precise():
    """The draft plan prices a trimmed head's step ratio rather than deciding on it: a 2 % gain, a tie for the rule,
    is known to ±5 % long before the cap at a 1 % spread."""
    rng = np.random.default_rng(2)
    pair = noisy(0.98, 0.01, rng)
    verdict = race.race(*pair, Timed(lambda: 0.0), sample, measuring=True)
    assert verdict.pairs < race.MAX_PAIRS and verdict.precise and not verdict.faster
    assert verdict.ratio == pytest.approx(0.98, abs=0.02)


def test_one_lucky_sample_does_not_crown_a_challenger():
    """One unlucky sample of the incumbent (the host busy in it) made a challenger look 44 % faster in one race on a
    shared 2-core machine."""
    draws = iter([0.090] + [0.050] * 100)
    verdict = race.race(Timed(lambda: next(draws)), Timed(lambda: 0.0505), Timed(lambda: 0.0), sample)
    assert not verdict.faster


@pytest.mark.parametrize("heavy", [False, True], ids=["normal", "heavy-tailed"])
def test_noise_crowns_a_false_winner_rarely(heavy):
    """The rates race.py's docstring states, on 600 simulated races each: a challenger no faster than the incumbent is
    crowned in under 3 % of races (at most 4 % here) and one exactly MARGIN faster in under 5 % (at most 8 % here), at
    spreads of 2 to 20 % a sample; one 20 % faster is crowned in most races even at 10 %."""
    rng = np.random.default_rng(41)
    runs = 600

    def crowned(ratio, spread):
        return np.mean([race.race(*noisy(ratio, spread, rng, heavy), Timed(lambda: 0.0), sample).faster
                        for _ in range(runs)])

    for spread in (0.02, 0.05, 0.10, 0.20):
        assert crowned(1.0, spread) <= 0.04
        assert crowned(1 - race.MARGIN, spread) <= 0.08
    assert crowned(0.8, 0.10) > 0.9


def test_the_t_quantile_matches_the_tables():
    """Student's t at the quantiles the rule reads (Abramowitz & Stegun, table 26.10)."""
    for p, df, value in ((0.99, 3, 4.541), (0.99, 11, 2.718), (0.975, 10, 2.228), (0.99, 30, 2.457)):
        assert race.t_quantile(p, df) == pytest.approx(value, rel=0.005)
