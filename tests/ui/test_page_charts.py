"""The run's charts (specdemo/ui/charts.py) and the cost surface they draw from: pure SVG, read without a browser."""

import re

from specdemo.decoding import planner, pricing
from specdemo.decoding.costs import CostModel
from specdemo.results.counterfactual import counterfactual
from specdemo.settings import GenerationSettings, KPolicy
from specdemo.ui import charts

STEP = 0.04


def machine(per_token: float, draft_steps: float) -> CostModel:
    """t(n) = t(1) (1 + per_token (n - 1)); a draft step costs `draft_steps` target steps."""
    return CostModel(target_s=tuple(STEP * (1 + per_token * n) for n in range(13)), target_prefill_tps=1000.0,
                     target_rollback_s=0.0, draft_s=(STEP * draft_steps,) * 2, draft_prefill_tps=4000.0)


FLAT = machine(0.01, 0.2)  # memory-bound: scoring 13 tokens costs 1.1 steps
STEEP = machine(0.45, 0.5)  # compute-bound: each extra token scored costs almost half a step, a draft step half


def test_on_a_flat_cost_curve_drafts_pay_at_low_acceptance():
    assert pricing.break_even_alpha(FLAT, 1) < 0.3
    assert pricing.break_even_alpha(FLAT, 8) < 0.7


def test_on_a_steep_cost_curve_drafts_pay_only_near_full_acceptance():
    assert pricing.break_even_alpha(STEEP, 1) > 0.9
    assert all((pricing.break_even_alpha(STEEP, k) or 1.0) > 0.9 for k in range(1, 13))
    assert pricing.break_even_alpha(machine(2.0, 1.0), 1) is None  # nothing pays here, even every draft accepted


def test_the_break_even_line_is_where_the_surface_crosses_one():
    for k in (1, 4, 8):
        alpha = pricing.break_even_alpha(FLAT, k)
        below, above = pricing.cost_surface(FLAT, [k], [alpha - 0.01, alpha + 0.01])
        assert below[0] < 1.0 < above[0]


def test_the_surface_sentence_names_the_threshold_and_the_best_k_at_the_runs_acceptance():
    text = planner.surface_sentence(FLAT, 12, 0.9, pricing.Acceptance((0.9,)))
    threshold = min(a for k in range(1, 13) if (a := pricing.break_even_alpha(FLAT, k)) is not None)
    best = pricing.best_k(FLAT, pricing.Acceptance((0.9,)), 12)[0]
    assert f"drafts pay when α is above {threshold:.2f}" in text and f"the best K is {best}" in text
    assert planner.surface_sentence(machine(2.0, 1.0), 12) == "On this machine no K pays, even if every draft were accepted."


def test_the_surface_marks_the_runs_point_and_draws_the_break_even_line():
    svg = charts.cost_surface(FLAT, 12, run_alpha=0.9, run_k=6.0)
    assert svg.count("<rect") > 12 * 21 and "this run: α̂ 0.90, mean K 6.0" in svg and "stroke-dasharray" in svg


def test_what_each_k_would_have_given_plots_every_k_the_oracle_and_this_run():
    mask = [1] + [1, 1, 1, 0] * 20
    would = counterfactual(mask, list(range(20)), list(range(81)), FLAT, GenerationSettings(max_new_tokens=81, k_policy=KPolicy("fixed", k_max=12)))
    svg = charts.would_have_given(would, 4.2, 1.7)
    assert all(f">{k}</text>" in svg for k in range(1, 13))
    assert "this run: mean K 4.2, measured 1.70×" in svg and "best K each round" in svg


def test_charts_without_data_say_why_and_draw_no_empty_axes():
    for svg in (charts.would_have_given(None, 0.0, 0.0), charts.acceptance_by_position([0.0] * 12),
                charts.cost_surface(None, 12)):
        assert "<polyline" not in svg and "<rect" not in svg
        assert not re.search(r"\d\.\d{5,}", svg)  # no "0.000000" axis noise
    assert "Nothing was drafted" in charts.acceptance_by_position([0.0] * 12)


def test_acceptance_by_position_draws_a_bar_per_drafted_position_and_the_prior():
    svg = charts.acceptance_by_position([0.9, 0.8, 0.5] + [0.0] * 9, prior=[0.9, 0.81, 0.73])
    assert svg.count("<title>position") == 3 and "90%" in svg and "prior before the run" in svg
