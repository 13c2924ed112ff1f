"""Every figure from the records: each quantity of metrics.py from a hand-written sequence of rounds."""

import pytest

from specdemo.decoding.costs import CostModel
from specdemo.decoding.events import End, Round, TokenEvent
from specdemo.results.metrics import (
    acceptance_by_position,
    accepted_histogram,
    alpha_hat,
    call_seconds,
    draft_step_s,
    leviathan_speedup,
    mean_acceptance_length,
    measured_speedup,
    summarize,
    target_step_s,
    evidence_by_position,
    verify_call_s,
)


def step(index, verify_tokens=1, verify_s=0.04, context=20):
    """A plain target call: the prefill or a round at K = 0."""
    return Round(index, context, 0, "", [], 0.0, verify_tokens, verify_s, 0, 0, 1, 0.0, 0.1 * index)


def round_(index, drafted, accepted, emitted=None, verify_s=0.05, draft_calls=None, rollback_s=0.002):
    calls = draft_calls if draft_calls is not None else [(1, 0.01)] * drafted
    return Round(index, 20 + index, drafted, "model", calls, sum(s for _, s in calls), drafted + 1, verify_s, drafted,
                 accepted, accepted + 1 if emitted is None else emitted, rollback_s, 0.1 * index)


# The prefill; a round whose first call prefills the draft (4 drafts, 2 kept, rejected at the 3rd); a fully
# accepted round (4 of 4, then the bonus); a round at K = 0; a round that ends the text: its 4 drafts are all
# accepted but the 2nd is the EOS, so 2 tokens reach the text and the drafts after the EOS count for nothing.
ROUNDS = [
    step(0, verify_tokens=20, verify_s=0.3),
    round_(1, 4, 2, draft_calls=[(21, 0.08), (1, 0.01), (1, 0.01), (1, 0.01)]),
    round_(2, 4, 4),
    step(3),
    round_(4, 4, 4, emitted=2, draft_calls=[(2, 0.012), (1, 0.01), (1, 0.01), (1, 0.01)]),
]
TOKENS = [TokenEvent(i, "x", "target", 0, 0.05 * (i + 1), margin=0.2 if i == 3 else 5.0) for i in range(1 + 3 + 5 + 1 + 2)]


def test_alpha_hat_counts_kept_drafts_against_rounds_that_ended_in_a_rejection():
    # kept drafts 2 + 4 + 2 = 8; one rejection (round 1); the EOS round is neither a rejection nor its later drafts
    assert alpha_hat(ROUNDS) == pytest.approx(8 / 9)
    assert alpha_hat([step(0), step(1)]) == 0.0


def test_mean_acceptance_length_is_tokens_per_target_call_after_the_prefill():
    assert mean_acceptance_length(ROUNDS) == pytest.approx((3 + 5 + 1 + 2) / 4)


def test_acceptance_by_position_is_the_share_of_rounds_that_drafted_an_ith_token_and_kept_it():
    # position 1: drafted in 3 rounds, kept in 3; 2: 3 and 3; 3: drafted in 2 (not after the EOS), kept in 1; 4: 2 and 1
    assert acceptance_by_position(ROUNDS, 5) == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.0])


def test_the_evidence_by_position_stops_at_the_first_rejection_and_at_the_end_of_the_text():
    tested, accepted = evidence_by_position(ROUNDS, 5)
    assert tested == [3, 3, 2, 1, 0] and accepted == [3, 3, 1, 1, 0]


def test_the_histogram_counts_drafting_rounds_by_kept_drafts():
    assert accepted_histogram(ROUNDS, 4) == [0, 0, 2, 0, 1]


def test_call_times_leave_out_the_prefills():
    assert target_step_s(ROUNDS) == pytest.approx(0.04)  # the K = 0 round's single-token call
    assert verify_call_s(ROUNDS) == pytest.approx(0.05)
    assert draft_step_s(ROUNDS) == pytest.approx((0.012 + 0.01 * 10) / 11)  # not the 21-token draft prefill
    seen = call_seconds(ROUNDS)
    assert {k: seen[k] for k in ("target", "draft")} == {"target": {1: 0.04, 5: 0.05}, "draft": {1: 0.01, 2: 0.012}}
    # The loop's own time: a round's wall time (0.1 s apart here) beyond its calls and trims; the draft's prefill round
    # is left out, and the K = 0 round is a step.
    assert seen["overhead"]["round"] == pytest.approx((0.008 + 0.006) / 2) and seen["overhead"]["step"] == pytest.approx(0.06)


def test_leviathans_equation_one():
    # α = 0.8, K = 4, c = 0.1: (1 - 0.8^5) / (0.2 * 1.4)
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert leviathan_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)
    assert leviathan_speedup(0.0, 4, 0.2) == pytest.approx(1 / 1.8)  # nothing accepted: a slowdown


def test_the_summary_adds_up_from_the_records():
    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=500.0, target_rollback_s=0.001, draft_s=(0.01, 0.012),
                      draft_prefill_tps=2000.0)
    end = End("speculative", "eos", 1.0, 20, {"target": 100}, k_max=4, drafter="model")
    s = summarize(TOKENS, ROUNDS, end, costs)
    assert (s.tokens, s.target_calls, s.rounds, s.proposed, s.accepted, s.rejections) == (12, 5, 3, 12, 8, 1)
    assert s.draft_calls == 12 and s.mean_k == pytest.approx(4.0)
    assert s.draft_acceptance_rate == pytest.approx(8 / 12)
    assert s.ttft_s == pytest.approx(0.05) and s.tokens_per_s == pytest.approx(12.0)
    assert s.near_ties == 1
    assert s.draft_cost == pytest.approx(s.draft_step_s / 0.04)  # c against the cost model's single step
    assert s.leviathan_speedup == pytest.approx(leviathan_speedup(8 / 9, 4.0, s.draft_cost))
    assert s.predicted_speedup > 1.0
    assert s.target_s == pytest.approx(0.3 + 0.05 * 3 + 0.04) and s.rollback_s == pytest.approx(0.006)


def test_a_lane_that_drafted_nothing_is_predicted_at_the_targets_own_speed():
    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=500.0, target_rollback_s=0.0)
    end = End("speculative", "max_new_tokens", 0.2, 20, k_max=4, drafter="model")
    s = summarize(TOKENS[:3], [step(0, 20), step(1), step(2)], end, costs)
    assert s.predicted_speedup == 1.0 and s.alpha_hat == 0.0 and s.rounds == 0 and s.leviathan_speedup == 0.0


def test_measured_speedup_compares_throughput():
    ar = summarize(TOKENS, [step(0, 20)] + [step(i) for i in range(1, 12)], End("autoregressive", "eos", 2.0, 20))
    spec = summarize(TOKENS, ROUNDS, End("speculative", "eos", 1.0, 20, k_max=4))
    assert measured_speedup(ar, spec) == pytest.approx(2.0)


# ---- the glossary: each figure's formula, checked against the field it names

# The glossary's figures for ROUNDS and TOKENS, worked out by hand from its formulas (not by the functions under test):
# 8 drafts kept of 12 proposed (round 4's two after its EOS never count), one rejection; 11 tokens after the prefill's
# in 4 target calls; the first token at 0.05 s, the 12th at 1.0 s (the End's wall time).
BY_HAND = {
    "alpha_hat": 8 / 9,
    "draft_acceptance_rate": 8 / 12,
    "mean_acceptance_length": (3 + 5 + 1 + 2) / 4,
    "acceptance_by_position": [1.0, 1.0, 0.5, 0.5, 0.0],
    "ttft_s": 0.05,
    "tpot_s": (1.0 - 0.05) / 11,
}


def test_every_glossary_formula_gives_the_field_it_names():
    from dataclasses import fields

    from specdemo.results import metrics
    from specdemo.results.figures import GLOSSARY

    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=500.0, target_rollback_s=0.001, draft_s=(0.01, 0.012),
                      draft_prefill_tps=2000.0)
    s = summarize(TOKENS, ROUNDS, End("speculative", "eos", 1.0, 20, k_max=5, drafter="model"), costs)
    names = {f.name for f in fields(s)}
    for term in GLOSSARY:
        assert term.key in names or callable(getattr(metrics, term.key, None)), term.key
        if term.key in BY_HAND:
            assert getattr(s, term.key) == pytest.approx(BY_HAND[term.key]), term.label
    # c: a draft step (the draft calls on one or two tokens: ten of 0.01 s and one of 0.012, the draft's catch-up
    # after a bonus; its 21-token prefill left out) over a target step (the plain step at K = 0: 0.04 s)
    c = (10 * 0.01 + 0.012) / 11 / 0.04
    assert s.draft_cost == pytest.approx(c)
    # eq. 1 at α̂ = 8/9, mean K = 12 drafts / 3 drafting rounds = 4: (1 − α^5) / ((1 − α)(c·4 + 1))
    a = 8 / 9
    assert s.mean_k == pytest.approx(4.0)
    assert s.leviathan_speedup == pytest.approx((1 - a ** 5) / ((1 - a) * (c * 4 + 1)))


def test_the_figures_page_carries_the_glossary_as_the_code_defines_it():
    from pathlib import Path

    from specdemo.results.figures import glossary_markdown

    assert glossary_markdown() in (Path(__file__).parents[2] / "docs" / "figures.md").read_text(encoding="utf-8")



def test_a_lane_is_predicted_on_the_plan_it_ran_under_not_on_its_end():
    from specdemo.decoding.drafters import strategy
    from specdemo.decoding.planner import Plan
    from specdemo.results.lane import drain
    from specdemo.settings import KPolicy

    costs = CostModel(target_s=(0.04,) * 13, target_prefill_tps=500.0, target_rollback_s=0.001, draft_s=(0.01, 0.012),
                      draft_prefill_tps=2000.0)
    end = End("speculative", "eos", 1.0, 20, k_max=4, drafter="model")
    plan = Plan(KPolicy.fixed(4), strategy("model"), 4, costs)
    priced = drain([plan, *TOKENS, *ROUNDS, end])
    assert priced.summary.predicted_speedup == summarize(TOKENS, ROUNDS, end, costs).predicted_speedup > 1.0
    assert drain([*TOKENS, *ROUNDS, end]).summary.predicted_speedup == 0.0  # unpriced: nothing predicted
