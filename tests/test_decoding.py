"""The decoding loops on tiny random models: exact, so every rule can be checked token for token.

Two differently seeded random models disagree often, which exercises rejection and rollback on
almost every round.
"""

import threading
import time

import pytest

from specdemo.engine import Engine, load_model
from specdemo.events import ACCEPTED, BONUS, CORRECTED, TARGET, Summary
from specdemo.settings import GenerationSettings, ModelSettings

PROMPT = "w5 w17 w99 w3 w250 w42 w7"


def _exact(folder):
    return ModelSettings(str(folder), precision="fp16", kv_cache_precision="f32", inference_precision="f32")


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft):
    return Engine(load_model(_exact(tiny_target)), load_model(_exact(tiny_draft)))


@pytest.fixture(scope="module")
def self_engine(tiny_target):
    """The target drafting for itself: every draft token must be accepted."""
    return Engine(load_model(_exact(tiny_target)), load_model(_exact(tiny_target)))


def _run(events):
    tokens = []
    for event in events:
        if isinstance(event, Summary):
            return tokens, event
        tokens.append(event)
    raise AssertionError("no summary")


@pytest.mark.parametrize("k, adaptive", [(1, False), (4, False), (7, False), (2, True)])
def test_greedy_speculative_equals_autoregressive(engine, k, adaptive):
    settings = GenerationSettings(max_new_tokens=40, k=k, adaptive=adaptive)
    ar, _ = _run(engine.autoregressive(PROMPT, settings))
    spec, summary = _run(engine.speculative(PROMPT, settings))
    assert [t.id for t in spec] == [t.id for t in ar]
    assert summary.proposed > summary.accepted  # rejections happened, so rollback was exercised


def test_a_draft_identical_to_the_target_is_always_accepted(self_engine):
    settings = GenerationSettings(max_new_tokens=26, k=4)  # the first token, then 5 rounds of 4 + bonus
    spec, summary = _run(self_engine.speculative(PROMPT, settings))
    assert summary.alpha == 1.0 and summary.draft_acceptance_rate == 1.0
    assert {t.source for t in spec} == {TARGET, ACCEPTED, BONUS}
    assert summary.accepted_histogram[4] == summary.target_calls - 1  # every round kept all 4


def test_provenance_labels_follow_the_rounds(engine):
    spec, _ = _run(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=40, k=3)))
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
        spec, summary = _run(self_engine.speculative(PROMPT, GenerationSettings(max_new_tokens=n, k=4)))
        assert len(spec) == n and summary.stop_reason == "max_new_tokens"


def test_generation_stops_at_eos_even_inside_an_accepted_block(self_engine):
    ar, _ = _run(self_engine.autoregressive(PROMPT, GenerationSettings(max_new_tokens=12)))
    eos = ar[6].id  # pretend the 7th greedy token ends the text
    self_engine.eos_ids = {eos}
    try:
        spec, summary = _run(self_engine.speculative(PROMPT, GenerationSettings(max_new_tokens=12, k=4)))
    finally:
        self_engine.eos_ids = {1}
    first = next(i for i, t in enumerate(ar) if t.id == eos)
    assert [t.id for t in spec] == [t.id for t in ar[: first + 1]]
    assert summary.stop_reason == "eos"


def test_cancel_stops_between_steps_and_the_next_run_is_exact(engine):
    settings = GenerationSettings(max_new_tokens=40, k=3)
    cancel = threading.Event()
    events = engine.speculative(PROMPT, settings, cancel)
    for i, event in enumerate(events):
        if i == 5:
            cancel.set()
        if isinstance(event, Summary):
            assert event.stop_reason == "cancelled" and event.tokens < 40
    ar, _ = _run(engine.autoregressive(PROMPT, settings))
    spec, _ = _run(engine.speculative(PROMPT, settings))
    assert [t.id for t in spec] == [t.id for t in ar]


def test_prompt_lookup_speculation_equals_autoregressive(engine):
    settings = GenerationSettings(max_new_tokens=40, k=4, drafter="prompt-lookup")
    prompt = "w5 w6 w7 w8 w9 w5 w6 w7 w8 w9 w5 w6"
    ar, _ = _run(engine.autoregressive(prompt, settings))
    spec, summary = _run(engine.speculative(prompt, settings))
    assert [t.id for t in spec] == [t.id for t in ar]
    assert summary.draft_calls > 0


def test_the_summary_adds_up(engine):
    spec, s = _run(engine.speculative(PROMPT, GenerationSettings(max_new_tokens=30, k=4)))
    assert s.tokens == len(spec) == 30
    assert s.accepted == sum(t.source == ACCEPTED for t in spec)
    assert s.draft_acceptance_rate == pytest.approx(s.accepted / s.proposed)
    assert s.alpha == pytest.approx(s.accepted / (s.accepted + s.rejections))
    assert sum(n * rounds for n, rounds in enumerate(s.accepted_histogram)) == s.accepted
    assert 0 < s.ttft_s <= s.wall_s and s.target_s + s.draft_s <= s.wall_s
    assert s.cost_ratio > 0 and s.expected_speedup > 0


def test_sampling_with_a_seed_repeats_exactly(engine):
    settings = GenerationSettings(max_new_tokens=30, temperature=1.0, top_k=50, seed=11)
    first, _ = _run(engine.speculative(PROMPT, settings))
    second, _ = _run(engine.speculative(PROMPT, settings))
    assert [t.id for t in first] == [t.id for t in second]
    assert all(t.p_target is not None for t in first)


def test_an_empty_instruction_is_refused(engine):
    with pytest.raises(ValueError, match="the instruction is empty"):
        next(engine.speculative("   \n", GenerationSettings()))


def test_accepted_drafts_after_an_eos_are_neither_emitted_nor_counted(self_engine):
    settings = GenerationSettings(max_new_tokens=26, k=4)
    ar, _ = _run(self_engine.autoregressive(PROMPT, settings))
    eos = ar[7].id  # pretend the 8th token ends the text: with a self-draft it arrives as an accepted draft
    saved = self_engine.eos_ids
    self_engine.eos_ids = {eos}
    try:
        spec, s = _run(self_engine.speculative(PROMPT, settings))
    finally:
        self_engine.eos_ids = saved
    assert spec[-1].id == eos and s.stop_reason == "eos"
    assert s.accepted == sum(t.source == ACCEPTED for t in spec)
    assert sum(n * rounds for n, rounds in enumerate(s.accepted_histogram)) == s.accepted


def test_auto_k_keeps_greedy_output_exact_and_reports_its_plan(engine):
    engine.warm_up(k_max=8)
    settings = GenerationSettings(max_new_tokens=40, k_auto=True)
    ar, _ = _run(engine.autoregressive(PROMPT, settings))
    spec, s = _run(engine.speculative(PROMPT, settings))
    assert [t.id for t in spec] == [t.id for t in ar]
    assert s.plan and s.drafter in ("model", "prompt-lookup")
    assert s.predicted_speedup > 0


def test_warm_up_is_not_part_of_a_lanes_time(tiny_target, monkeypatch):
    """A model whose very first call is slow (as a CPU plugin's first call of a shape is): after warm-up,
    no lane's figures may contain it."""
    from specdemo.runtime import OVModel

    engine = Engine(load_model(_exact(tiny_target)), None)
    forward = OVModel.forward
    first = {"done": False}

    def slow_first_forward(self, *args, **kwargs):
        if not first["done"]:
            first["done"] = True
            time.sleep(1.0)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(OVModel, "forward", slow_first_forward)
    warm = engine.warm_up(k_max=4)
    _, s = _run(engine.autoregressive(PROMPT, GenerationSettings(max_new_tokens=8)))
    assert warm >= 1.0 and engine.warm_up_s == warm
    assert s.wall_s < 1.0 and s.ttft_s < 1.0


def test_a_trimmed_draft_head_keeps_greedy_speculation_exact(tiny_target, tiny_draft):
    draft = load_model(ModelSettings(str(tiny_draft), precision="fp16", kv_cache_precision="f32",
                                     inference_precision="f32", head_tokens=100))
    assert draft.runtime.head_tokens < draft.runtime.vocab_size
    engine = Engine(load_model(_exact(tiny_target)), draft)
    settings = GenerationSettings(max_new_tokens=40, k=4)
    ar, _ = _run(engine.autoregressive(PROMPT, settings))
    spec, s = _run(engine.speculative(PROMPT, settings))
    assert [t.id for t in spec] == [t.id for t in ar]
    head = set(draft.runtime.head_ids.tolist())
    assert all(t.id in head for t in spec if t.source == ACCEPTED)  # drafts come from the head alone


def test_a_trimmed_draft_head_samples_from_a_proper_distribution(tiny_draft):
    import numpy as np

    from specdemo.drafting import ModelDrafter

    draft = load_model(ModelSettings(str(tiny_draft), precision="fp16", kv_cache_precision="f32",
                                     inference_precision="f32", head_tokens=100))
    settings = GenerationSettings(temperature=1.0, seed=3)
    drafter = ModelDrafter(draft.runtime, settings, np.random.default_rng(3))
    proposal = drafter.propose([5, 17, 99, 3], 3)
    off_head = np.setdiff1d(np.arange(draft.runtime.vocab_size), draft.runtime.head_ids)
    assert proposal.q.shape == (3, draft.runtime.vocab_size)
    assert np.allclose(proposal.q.sum(axis=1), 1.0) and not proposal.q[:, off_head].any()
