"""The cost model: corrected by what runs really pay (converging after a change, deaf to one run under load), kept
across processes, and said in words. The runs are the real loops on fake models whose calls report chosen seconds."""

import numpy as np
import pytest

from specdemo.decoding import loops
from specdemo.decoding.costs import CostModel, fold, monotone
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.learning import measuring
from specdemo.results import metrics
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

PROMPT = [0, 1, 2, 1, 0, 2, 2]
# As measured: a flat curve (a verify call costs what a step costs), 40 ms a step, a draft step 12 ms.
MEASURED = CostModel(target_s=(0.04,) * 13, target_prefill_tps=1000.0, target_rollback_s=0.001, draft_s=(0.012, 0.013),
                     draft_prefill_tps=4000.0, draft_rollback_s=0.001, measured_at="2026-11-23T04:00:00")


def target_seconds(step: float, per_token: float):
    """A target whose call on n tokens takes step * (1 + per_token * (n - 1)) seconds (a prefill: 1 ms a token)."""
    return lambda n: n * 0.001 if n > 20 else step * (1 + per_token * (n - 1))


def observe_a_pair(target_cost, draft_cost, k: int = 4) -> dict:
    """One autoregressive and one speculative run of the real loops; what their calls cost, as folded into the model."""
    target, draft = FakeModel(3, "target", seconds=target_cost), FakeModel(3, "draft", seconds=draft_cost)
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(k))
    ar = drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, settings, set()))
    drafter = ModelDrafter(draft, settings, np.random.default_rng(0))
    spec = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set()))
    return ar.rounds, spec.rounds


def fold_runs(model: CostModel, target_cost, draft_cost, runs: int, start: float = 0.0) -> CostModel:
    for i in range(runs):
        ar, spec = observe_a_pair(target_cost, draft_cost)
        model = fold(model, metrics.call_seconds(ar), at=start + 60 * i)
        model = fold(model, metrics.call_seconds(spec), at=start + 60 * i + 5)
    return model


def test_the_model_converges_to_what_runs_pay_after_a_change_of_shape():
    # The loop pays a 5-token verify call at 1.5 steps where the measurement said 1.0, and a step 35 ms, not 40.
    model = fold_runs(MEASURED, target_seconds(0.035, 0.125), lambda n: 0.01, runs=2)
    assert model.t(1) == pytest.approx(0.035)
    assert model.verify_steps(5) == pytest.approx(1.5)
    assert model.d(1) == pytest.approx(0.01)
    assert model.verify_steps(4) == pytest.approx(1.375)  # the sizes between follow the same line
    assert model.runs == 4
    assert model.measured_target_s == MEASURED.target_s  # the measurement itself is kept


def test_sizes_no_run_used_are_scaled_like_their_nearest_neighbours():
    model = fold_runs(MEASURED, target_seconds(0.04, 0.125), lambda n: 0.012, runs=2)  # only K = 4: 5-token calls
    assert model.verify_steps(5) == pytest.approx(1.5)
    assert model.verify_steps(13) == pytest.approx(1.5)  # beyond: the nearest correction, 1.5x the measured 1.0
    assert model.verify_steps(2) == pytest.approx(1.0 + 0.5 * 1 / 4)  # between 1 (measured) and 5: interpolated
    assert list(model.target_s) == sorted(model.target_s)  # never cheaper to score more


def test_one_run_under_load_moves_nothing():
    settled = fold_runs(MEASURED, target_seconds(0.035, 0.125), lambda n: 0.01, runs=3)
    loaded = fold_runs(settled, target_seconds(0.07, 0.4), lambda n: 0.03, runs=1, start=600)
    assert loaded.t(1) == pytest.approx(settled.t(1))
    assert loaded.verify_steps(5) == pytest.approx(settled.verify_steps(5))
    assert loaded.d(1) == pytest.approx(settled.d(1))


def test_one_run_cannot_move_the_measurement_and_two_that_agree_do():
    once = fold_runs(MEASURED, target_seconds(0.06, 0.0), lambda n: 0.012, runs=1)
    assert once.t(1) == pytest.approx(0.04)  # slower than measured once: maybe load, so not believed yet
    twice = fold_runs(MEASURED, target_seconds(0.06, 0.0), lambda n: 0.012, runs=2)
    assert twice.t(1) == pytest.approx(0.06)


def test_a_runs_verify_calls_are_compared_with_the_same_moments_single_steps():
    # The machine slowed down by half between two pairs of runs; the shape it pays (1.5 steps at 5 tokens) did not.
    model = fold_runs(MEASURED, target_seconds(0.035, 0.125), lambda n: 0.01, runs=2)
    model = fold_runs(model, target_seconds(0.0525, 0.125), lambda n: 0.01, runs=2, start=3600)
    assert model.verify_steps(5) == pytest.approx(1.5)


def test_a_folded_model_survives_the_machine_profile(tmp_path, monkeypatch):
    from specdemo.learning.profile import Profile

    monkeypatch.setenv("SPECDEMO_LEARN", "1")  # what is measured is written (with learning off it stays in memory)
    model = fold_runs(MEASURED, target_seconds(0.035, 0.125), lambda n: 0.01, runs=2)
    Profile(tmp_path).keep_costs("pair", model, {"version": measuring.COSTS_VERSION})
    again = Profile(tmp_path).costs("pair")  # another process reading the same home
    assert again == model
    assert fold(again, {"target": {1: 0.035}, "draft": {}}).runs == model.runs + 1


def test_the_standing_says_when_it_was_measured_and_how_many_runs_corrected_it():
    assert MEASURED.standing() == "measured 2026-11-23 04:00:00; no run has corrected it yet"
    model = fold_runs(MEASURED, target_seconds(0.035, 0.125), lambda n: 0.01, runs=2)
    assert "corrected by 4 runs; last change" in model.standing() and "t(5)/t(1) 1.00 → 1.50" in model.standing()


def test_a_dip_in_a_measured_cost_curve_is_noise_and_is_levelled():
    assert monotone([1.0, 1.2, 1.1, 1.5]) == (1.0, 1.2, 1.2, 1.5)


def test_the_cost_model_survives_a_round_trip_through_json():
    assert CostModel.from_dict(MEASURED.to_dict()) == MEASURED


def test_the_loops_own_time_per_step_and_round_joins_the_model_and_the_prediction():
    from specdemo.decoding.pricing import Acceptance, predicted_speedup

    model = MEASURED
    for i in range(3):
        model = fold(model, {"target": {1: 0.04}, "draft": {}, "overhead": {"step": 0.002, "round": 0.006}}, at=60.0 * i)
    assert model.step_overhead_s == pytest.approx(0.002) and model.round_overhead_s == pytest.approx(0.006)
    cheaper = predicted_speedup(MEASURED, Acceptance((0.9,)), 4)
    assert predicted_speedup(model, Acceptance((0.9,)), 4) < cheaper  # a round's overhead is paid once per round
