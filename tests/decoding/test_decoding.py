"""The decoding loops on tiny random models: exact, so every rule can be checked token for token.

Two differently seeded random models disagree often, which exercises rejection and rollback on
almost every round.
"""

import time

import numpy as np
import pytest

from specdemo.decoding.events import ACCEPTED, BONUS, CORRECTED, TARGET
from specdemo.models.loading import load_model
from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy
from tests.conftest import exact

PROMPT = "w5 w17 w99 w3 w250 w42 w7"


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def self_engine(tiny_pair, tiny_target):
    """The target drafting for itself (a second copy, with its own cache): every draft token must be accepted."""
    return Engine(tiny_pair[0], load_model(exact(tiny_target)))


@pytest.mark.parametrize("k, adaptive", [(1, False), (4, False), (7, False), (2, True)])
def test_greedy_speculative_equals_autoregressive(engine, k, adaptive):
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy(("adaptive" if adaptive else "fixed"), k=k))
    ar = drain(engine.autoregressive(PROMPT, settings))
    spec = drain(engine.speculative(PROMPT, settings))
    assert spec.ids == ar.ids
    assert spec.summary.proposed > spec.summary.accepted  # rejections happened, so rollback was exercised


def test_a_draft_identical_to_the_target_is_always_accepted(self_engine):
    settings = GenerationSettings(max_new_tokens=26, k_policy=KPolicy.fixed(4))  # the first token, then 5 rounds of 4 + bonus
    spec = drain(self_engine.speculative(PROMPT, settings))
    summary = spec.summary
    assert summary.alpha_hat == 1.0 and summary.draft_acceptance_rate == 1.0
    assert {t.source for t in spec.tokens} == {TARGET, ACCEPTED, BONUS}
    assert summary.accepted_histogram[4] == summary.target_calls - 1  # every round kept all 4


def test_provenance_labels_follow_the_rounds(engine):
    spec = drain(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(3)))).tokens
    assert spec[0].source == TARGET and spec[0].step == 0
    for token in spec:
        if token.source == CORRECTED:
            assert token.rejected and token.rejected[0] != token.id
        else:
            assert token.rejected == []
    steps = [t.step for t in spec]
    assert steps == sorted(steps)


def test_generation_stops_at_max_new_tokens_inside_an_accepted_block(self_engine):
    for n in (1, 2, 5, 13):
        spec = drain(self_engine.speculative(PROMPT, GenerationSettings(max_new_tokens=n, k_policy=KPolicy.fixed(4))))
        assert len(spec.tokens) == n and spec.summary.stop_reason == "max_new_tokens"


def test_generation_stops_at_eos_even_inside_an_accepted_block(self_engine):
    ar = drain(self_engine.autoregressive(PROMPT, GenerationSettings(max_new_tokens=12))).ids
    eos = ar[6]  # pretend the 7th greedy token ends the text
    saved = self_engine.eos_ids
    self_engine.eos_ids = {eos}
    try:
        spec = drain(self_engine.speculative(PROMPT, GenerationSettings(max_new_tokens=12, k_policy=KPolicy.fixed(4))))
    finally:
        self_engine.eos_ids = saved
    assert spec.ids == ar[: ar.index(eos) + 1]
    assert spec.summary.stop_reason == "eos"


def test_prompt_lookup_speculation_equals_autoregressive(engine):
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(4), drafter="prompt-lookup")
    prompt = "w5 w6 w7 w8 w9 w5 w6 w7 w8 w9 w5 w6"
    ar = drain(engine.autoregressive(prompt, settings))
    spec = drain(engine.speculative(prompt, settings))
    assert spec.ids == ar.ids
    assert spec.summary.proposed > 0 and spec.summary.draft_calls == 0  # drafts, and no model call for them


def test_the_summary_adds_up(engine):
    spec = drain(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=30, k_policy=KPolicy.fixed(4))))
    s = spec.summary
    assert s.tokens == len(spec.tokens) == 30
    assert s.accepted == sum(t.source == ACCEPTED for t in spec.tokens)
    assert s.draft_acceptance_rate == pytest.approx(s.accepted / s.proposed)
    assert s.alpha_hat == pytest.approx(s.accepted / (s.accepted + s.rejections))
    assert sum(n * rounds for n, rounds in enumerate(s.accepted_histogram)) == s.accepted
    assert 0 < s.ttft_s <= s.wall_s and s.target_s + s.draft_s <= s.wall_s
    assert s.draft_cost > 0 and s.leviathan_speedup > 0
    assert s.mean_acceptance_length == pytest.approx((s.tokens - 1) / (s.target_calls - 1))


def test_sampling_with_a_seed_repeats_exactly(engine):
    settings = GenerationSettings(max_new_tokens=30, temperature=1.0, top_k=50, seed=11)
    first = drain(engine.speculative(PROMPT, settings))
    second = drain(engine.speculative(PROMPT, settings))
    assert first.ids == second.ids
    assert all(t.p_target is not None for t in first.tokens)


def test_an_empty_instruction_is_refused(engine):
    with pytest.raises(ValueError, match="the instruction is empty"):
        next(engine.speculative("   \n", GenerationSettings()))


def test_accepted_drafts_after_an_eos_are_neither_emitted_nor_counted(self_engine):
    settings = GenerationSettings(max_new_tokens=26, k_policy=KPolicy.fixed(4))
    ar = drain(self_engine.autoregressive(PROMPT, settings)).ids
    eos = ar[7]  # pretend the 8th token ends the text: with a self-draft it arrives as an accepted draft
    saved = self_engine.eos_ids
    self_engine.eos_ids = {eos}
    try:
        spec = drain(self_engine.speculative(PROMPT, settings))
    finally:
        self_engine.eos_ids = saved
    s = spec.summary
    assert spec.ids[-1] == eos and s.stop_reason == "eos"
    assert s.accepted == sum(t.source == ACCEPTED for t in spec.tokens)
    assert sum(n * rounds for n, rounds in enumerate(s.accepted_histogram)) == s.accepted


def test_auto_k_keeps_greedy_output_exact_and_reports_its_plan(engine):
    engine.warm_up(k_max=8)
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.auto())
    ar = drain(engine.autoregressive(PROMPT, settings))
    spec = drain(engine.speculative(PROMPT, settings))
    assert spec.ids == ar.ids
    s = spec.summary
    assert spec.plan is not None and spec.plan.reason and s.drafter in ("model", "prompt-lookup")
    assert s.predicted_speedup > 0


def test_gated_rounds_keep_greedy_output_exact(engine):
    """A gate at the median of the draft's confidence along the answer turns about half the rounds back to plain
    target steps: the compiled draft's cache must then take the target's token, and the text stays the target's."""
    from specdemo.decoding.drafters import MASKED_STRATEGY
    from specdemo.decoding.planner import Plan
    from specdemo.results.counterfactual import draft_pass

    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(3))
    ids = engine.prompt_ids(PROMPT, settings)
    ar = drain(engine.autoregressive_ids(ids, settings))
    _, confidence = draft_pass(engine.draft.runtime, ids, ar.ids)
    gate = float(np.median(confidence[1:]))
    spec = drain(engine.speculative_ids(ids, settings, Plan(settings.k_policy, MASKED_STRATEGY, 3, gate=gate)))
    assert spec.ids == ar.ids
    gated = [r.gated for r in spec.rounds[1:] if r.k]
    assert 0.2 < sum(gated) / len(gated) < 0.8
    assert spec.summary.proposed > spec.summary.accepted  # rejections in the rounds let through: rollback exercised


def test_warm_up_is_not_part_of_a_lanes_time(tiny_pair, monkeypatch):
    """A model whose very first call is slow (as a CPU plugin's first call of a shape is): after warm-up,
    no lane's figures may contain it.

    The slow call moves the clock on by an hour instead of sleeping, so a lane that contained it would
    report an hour whatever the machine's load, and one that did not reports seconds at most."""
    from specdemo.models.runtime import OVModel

    hour, clock, skew = 3600.0, time.perf_counter, {"s": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + skew["s"])
    forward = OVModel.forward

    def slow_first_forward(self, *args, **kwargs):
        if not skew["s"]:
            skew["s"] = hour
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(OVModel, "forward", slow_first_forward)
    engine = Engine(tiny_pair[0], None)
    warm = engine.warm_up(k_max=4)
    s = drain(engine.autoregressive(PROMPT, GenerationSettings(max_new_tokens=8))).summary
    assert warm >= hour and engine.warm_up_s == warm
    assert s.wall_s < hour and s.ttft_s < hour and s.target_s < hour


def test_a_trimmed_draft_head_keeps_greedy_speculation_exact(tiny_pair, tiny_draft):
    draft = load_model(exact(tiny_draft, head_tokens=100))
    assert draft.runtime.head_tokens < draft.runtime.vocab_size
    engine = Engine(tiny_pair[0], draft)
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(4))
    ar = drain(engine.autoregressive(PROMPT, settings))
    spec = drain(engine.speculative(PROMPT, settings))
    assert spec.ids == ar.ids
    head = set(draft.runtime.head_ids.tolist())
    assert all(t.id in head for t in spec.tokens if t.source == ACCEPTED)  # drafts come from the head alone


def test_a_trimmed_draft_head_samples_from_a_proper_distribution(tiny_draft):
    import numpy as np

    from specdemo.decoding.drafters.model import ModelDrafter

    draft = load_model(exact(tiny_draft, head_tokens=100))
    settings = GenerationSettings(temperature=1.0, seed=3)
    drafter = ModelDrafter(draft.runtime, settings, np.random.default_rng(3))
    proposal = drafter.propose([5, 17, 99, 3], 3)
    off_head = np.setdiff1d(np.arange(draft.runtime.vocab_size), draft.runtime.head_ids)
    assert proposal.q.shape == (3, draft.runtime.vocab_size)
    assert np.allclose(proposal.q.sum(axis=1), 1.0) and not proposal.q[:, off_head].any()


def test_without_a_draft_model_the_model_drafter_is_refused_with_a_sentence(tiny_pair):
    engine = Engine(tiny_pair[0], None)
    with pytest.raises(ValueError, match=r"^no draft model is loaded; choose a drafter that needs none \(prompt-lookup"):
        next(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=4)))
    lookup = drain(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=4, drafter="prompt-lookup")))
    assert lookup.summary.tokens == 4 and lookup.summary.drafter == "prompt-lookup"  # the way out it names works
