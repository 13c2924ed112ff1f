"""What each K would have given: the counterfactual walks of a greedy answer, checked against real runs of the loop on
fake models, and the planner learning from the match masks."""

import numpy as np
import pytest

from specdemo.decoding import loops
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters.lookup import PromptLookupDrafter
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.learning.profile import Keys, Profile
from specdemo.results.counterfactual import (
    accepted_run,
    corrected,
    counterfactual,
    draft_pass,
    mask_counts,
    observed_matches,
    replay_counts,
    walk_fixed,
    walk_oracle,
    walk_replayed,
)
from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

PROMPT = [0, 1, 2, 1, 0, 2, 2]
N = 70
COSTS = CostModel(target_s=tuple(0.05 * (1 + 0.1 * n) for n in range(13)), target_prefill_tps=1000.0,
                  target_rollback_s=0.001, draft_s=(0.01, 0.012), draft_prefill_tps=4000.0, draft_rollback_s=0.001)


def answer_of(target: FakeModel, n: int = N) -> list[int]:
    return drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, GenerationSettings(max_new_tokens=n), set())).ids


def test_every_fixed_k_accepts_round_by_round_what_a_real_run_accepts():
    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    answer = answer_of(target)
    mask = draft_pass(draft, PROMPT, answer)[0]
    assert 0.2 < sum(mask) / len(mask) < 0.9  # the draft agrees sometimes: rejections and accepted runs both happen
    for k in range(1, 9):
        settings = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k))
        drafter = ModelDrafter(draft, settings, np.random.default_rng(0))
        run = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set()))
        assert run.ids == answer
        walk = walk_fixed(mask, k, COSTS, len(PROMPT), N, 1.0)
        assert walk.accepted == [r.accepted for r in run.rounds[1:]], f"K = {k}"
        assert walk.target_calls == run.summary.target_calls and walk.draft_calls == run.summary.draft_calls


def test_the_confidence_stop_is_walked_as_a_stopped_run_drafts():
    """Under the confidence stop the walk accepts round by round what a real stopped run accepts and makes its target
    calls; its draft calls can differ only after a round's first rejected draft (confidences there stand in)."""
    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    answer = answer_of(target)
    mask, confidence = draft_pass(draft, PROMPT, answer)
    assert mask == draft_pass(draft, PROMPT, answer)[0] and 0.0 < min(confidence) < max(confidence[1:]) <= 1.0
    cut = 0
    for stops in ((0.3,), (0.6,), (0.2, 0.4, 0.6, 0.3)):  # one threshold everywhere, or one per draft position
        for k in (2, 5, 8):
            settings = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k))
            drafter = ModelDrafter(draft, settings, np.random.default_rng(0), stops)
            run = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set()))
            assert run.ids == answer
            walk = walk_fixed(mask, k, COSTS, len(PROMPT), N, 1.0, confidence, stops)
            assert walk.accepted == [r.accepted for r in run.rounds[1:]], (stops, k)
            assert walk.target_calls == run.summary.target_calls and walk.stops == stops
            unstopped = walk_fixed(mask, k, COSTS, len(PROMPT), N, 1.0)
            assert walk.draft_calls <= unstopped.draft_calls
            cut += unstopped.draft_calls - walk.draft_calls
    assert cut > 0  # the stop saved draft steps somewhere


def test_gated_rounds_are_walked_as_a_gated_run_goes():
    """In gated rounds the walk turns back the rounds a real gated run turns back and accepts round by round what it
    accepts. Without a confidence stop (whose drafts after a rejected one the walk prices from stand-in confidences)
    it costs what the run's calls cost on the same curve, but for the first round: the walk prices the draft's prefill
    of the prompt and its first draft as two calls, the run feeds the prompt and the first token in one."""
    from specdemo.decoding.pricing import priced_round

    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    answer = answer_of(target)
    mask, confidence = draft_pass(draft, PROMPT, answer)
    for gate, stops in ((0.5, ()), (0.6, (0.4,)), (0.7, (0.3, 0.5))):
        for k in (1, 3, 6):
            settings = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k))
            drafter = ModelDrafter(draft, settings, np.random.default_rng(0), stops, gate)
            run = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set()))
            assert run.ids == answer
            walk = walk_fixed(mask, k, COSTS, len(PROMPT), N, 1.0, confidence, stops, gate)
            assert walk.accepted == [r.accepted for r in run.rounds[1:]], (gate, k)
            assert 0 < walk.gated == run.summary.gated < walk.rounds
            if not stops:
                priced = sum(priced_round(COSTS, r) for r in run.rounds)
                assert walk.seconds - priced == pytest.approx(COSTS.d(1) - 1 / COSTS.draft_prefill_tps)


def test_the_counterfactual_says_what_gating_would_have_done():
    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    answer = answer_of(target)
    mask, confidence = draft_pass(draft, PROMPT, answer)
    would = counterfactual(mask, PROMPT, answer, COSTS, GenerationSettings(max_new_tokens=N), confidence=confidence)
    best = max(would.gated, key=lambda w: w.speedup)
    assert len(would.gated) == len(would.fixed) and best.gate == pytest.approx(0.12)  # t(2) / t(1) − 1, and a trim
    assert f"gated: {best.rounds - best.gated} of {best.rounds} rounds drafted" in would.gate_sentence()
    assert counterfactual(mask, PROMPT, answer, COSTS, GenerationSettings(max_new_tokens=N)).gate_sentence() == ""


def test_prompt_lookup_accepts_round_by_round_what_a_real_lookup_run_accepts():
    target = FakeModel(3, "target", scale=3.0)  # peaked: the answer repeats itself, so lookup finds drafts
    answer = answer_of(target)
    for k in (1, 3, 6):
        settings = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k), drafter="prompt-lookup")
        run = drain(loops.speculative(target, PromptLookupDrafter(3), FakeTokenizer(), PROMPT, settings, set()))
        walk = walk_replayed(PromptLookupDrafter(3), PROMPT, answer, k, COSTS, N, 1.0)
        assert walk.accepted == [r.accepted for r in run.rounds[1:]] and sum(walk.accepted) > 0


class BatchedDiffers(FakeModel):
    """A draft whose batched calls (more than one row kept, as the teacher-forced pass makes them) choose another
    token than its single steps at every third position: the rounding of batched kernels, exaggerated."""

    def forward(self, ids, logits_to_keep=1):
        rows = super().forward(ids, logits_to_keep)
        if logits_to_keep > 1:
            for r in range(len(rows)):
                if (len(self.cache) - len(rows) + r) % 3 == 0:
                    rows[r, np.argmax(rows[r])] -= 100.0  # the runner-up wins
        return rows


def test_the_runs_own_drafting_replaces_the_passes_guesses_so_its_k_is_walked_exactly():
    target, draft = FakeModel(3, "target"), BatchedDiffers(3, "draft")
    answer = answer_of(target)
    k = 3
    settings = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k))
    run = drain(loops.speculative(target, ModelDrafter(draft, settings, np.random.default_rng(0)), FakeTokenizer(),
                                     PROMPT, settings, set()))
    assert run.ids == answer
    guessed = draft_pass(draft, PROMPT, answer)[0]
    assert walk_fixed(guessed, k, COSTS, len(PROMPT), N, 1.0).accepted != [r.accepted for r in run.rounds[1:]]
    would = counterfactual(guessed, PROMPT, answer, COSTS, GenerationSettings(max_new_tokens=N, k_policy=KPolicy("fixed", k_max=8)), run.rounds)
    walk = would.fixed[k - 1]
    assert walk.accepted == [r.accepted for r in run.rounds[1:]] and walk.target_calls == run.summary.target_calls
    assert would.observed > 0 and 0 < would.corrected <= would.observed


def test_what_a_run_observed_is_read_from_its_rounds():
    from specdemo.decoding.events import Round

    def round_(index, drafter, drafted, accepted, emitted):
        return Round(index=index, context=0, k=drafted, drafter=drafter, draft_calls=[], draft_s=0.0,
                     verify_tokens=drafted + 1, verify_s=0.0, drafted=drafted, accepted=accepted, emitted=emitted,
                     rollback_s=0.0, t=0.0)

    rounds = [round_(0, "", 0, 0, 1),  # the prefill writes position 0
              round_(1, "model", 3, 1, 2),  # positions 1 kept, 2 its first rejected draft
              round_(2, "model", 2, 2, 3),  # 3 and 4 kept, 5 the bonus token (not drafted)
              round_(3, "prompt-lookup", 2, 0, 1),  # 6: lookup's draft says nothing of the model's
              round_(4, "", 0, 0, 1),  # 7: a plain step
              round_(5, "model", 3, 2, 1)]  # 8 kept and the text ended there (an EOS): the rest never counted
    assert observed_matches(rounds, 10) == [None, 1, 0, 1, 1, None, None, None, 1, None]
    mask, observed, changed = corrected([1, 1, 1, 1, 0, 0, 1, 1, 0, 1], observed_matches(rounds, 10))
    assert mask == [1, 1, 0, 1, 1, 0, 1, 1, 1, 1] and (observed, changed) == (5, 3)


def test_a_round_accepts_the_run_of_matches_from_its_start_capped_at_k():
    mask = [1, 1, 1, 0, 1, 1, 1, 1]
    assert accepted_run(mask, 1, 8) == 2 and accepted_run(mask, 4, 2) == 2 and accepted_run(mask, 4, 9) == 4
    assert accepted_run(mask, 3, 5) == 0


def test_the_oracle_is_never_slower_than_any_fixed_k_and_may_skip_drafting():
    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    answer = answer_of(target)
    mask = draft_pass(draft, PROMPT, answer)[0]
    ar = 0.05 * N
    oracle = walk_oracle(mask, 8, COSTS, len(PROMPT), N, ar)
    assert all(oracle.seconds <= walk_fixed(mask, k, COSTS, len(PROMPT), N, ar).seconds + 1e-9 for k in range(1, 9))
    assert 0 in oracle.ks  # where the next draft would be rejected anyway, a plain step is cheaper
    assert sum(oracle.accepted) + oracle.rounds == N - 1


def test_mask_counts_test_each_position_only_after_matches():
    tested, accepted = mask_counts([1, 1, 0, 1, 1], 3)
    # starts 1..4: from 1, the 1st matches and the 2nd fails; from 2, the 1st fails; from 3, two match and the answer
    # ends; from 4, one matches and the answer ends
    assert tested == [4, 2, 0] and accepted == [3, 1, 0]


def test_lookup_counts_come_from_proposals_alone():
    prompt, answer = [5, 6, 7, 8], [5, 6, 7, 9]
    tested, accepted = replay_counts(PromptLookupDrafter(2), prompt, answer, 3)
    assert tested[0] >= 1 and accepted[0] >= 1 and accepted[2] == 0


def test_without_a_draft_model_only_the_model_free_strategies_are_walked():
    from specdemo.decoding.drafters import STRATEGIES

    answer = answer_of(FakeModel(3, "target"), 20)
    result = counterfactual(None, PROMPT, answer, COSTS, GenerationSettings(max_new_tokens=20, k_policy=KPolicy("fixed", k=4, k_max=4)))
    assert result.fixed == [] and result.greedy_only
    assert "prompt-lookup" in result.replayed and "suffix" not in result.replayed  # suffix keeps state across runs
    assert set(result.replayed) == {name for name, s in STRATEGIES.items() if not s.needs_model and s.counterfactual.replayable}
    assert all(len(walks) == 4 for walks in result.replayed.values())
    assert set(result.evidence) == set(result.replayed)


def test_the_planner_moves_off_k_zero_after_one_run_whose_masks_say_drafts_match(tiny_pair, tiny_target, tmp_path,
                                                                                  monkeypatch):
    """A new machine whose prior says nothing pays runs K = 0 at first; the greedy run's match mask (a draft identical
    to the target matches everywhere) teaches the planner, and the next plan drafts."""
    from specdemo.models.loading import load_model
    from tests.conftest import exact

    monkeypatch.setenv("SPECDEMO_LEARN", "1")
    engine = Engine(tiny_pair[0], load_model(exact(tiny_target)), Profile(tmp_path))  # no history: α = 0.8
    # A compute-bound machine: a verify call of 2 tokens costs 1.35 steps, a draft step 0.45: at α = 0.8 nothing pays.
    machine = CostModel(target_s=tuple(0.1 * (1 + 0.35 * n) for n in range(13)), target_prefill_tps=1000.0,
                        target_rollback_s=0.0, draft_s=(0.045, 0.05), draft_prefill_tps=4000.0)
    engine.keys = Keys("a compute-bound machine", engine.keys.pair)
    engine.profile.keep_costs(engine.keys.costs, machine)
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.auto())
    prompt = "w5 w17 w99 w3 w250 w42 w7"
    assert engine.plan(prompt, settings).k == 0
    run = drain(engine.speculative(prompt, settings))
    assert run.summary.rounds == 0  # K = 0: nothing drafted, nothing learnt from the rounds
    would = engine.would_have_given(engine.prompt_ids(prompt, settings), settings, run.ids)
    assert min(w.speedup for w in would.fixed) > 1.0  # every K would have paid on this answer
    engine.profile.learn_from_answer(engine.keys, would.evidence)  # as the CLI, the page and the bench do
    assert engine.plan(prompt, settings).k > 0


def test_an_answer_that_ends_in_an_eos_is_walked_to_its_end_as_the_run_went():
    """EOS 3 ends the answer inside a round; the walk at every K makes the run's target and draft calls, also when
    the EOS is among drafts the target accepted (the drafts after it never count)."""
    target, eos = FakeModel(6, "target", scale=2.0), {3}
    settings = GenerationSettings(max_new_tokens=N)
    answer = drain(loops.autoregressive(target, FakeTokenizer(), PROMPT, settings, eos)).ids
    assert answer[-1] == 3 and 5 < len(answer) < N  # the EOS ended it, well before the budget
    for draft in (FakeModel(6, "target", scale=2.0), FakeModel(6, "draft", scale=2.0)):  # agrees always, or sometimes
        mask = draft_pass(draft, PROMPT, answer)[0]
        for k in (1, 3, 6):
            fixed = GenerationSettings(max_new_tokens=N, k_policy=KPolicy.fixed(k))
            run = drain(loops.speculative(target, ModelDrafter(draft, fixed, np.random.default_rng(0)), FakeTokenizer(),
                                             PROMPT, fixed, eos))
            assert run.ids == answer
            walk = walk_fixed(mask, k, COSTS, len(PROMPT), N, 1.0)
            assert walk.target_calls == run.summary.target_calls, (draft.salt, k)
            assert walk.draft_calls == run.summary.draft_calls, (draft.salt, k)
