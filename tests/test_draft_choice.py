"""The draft plan: each candidate draft (LM-head size, weight precision) measured and priced on this machine's costs;
a cheaper draft wins where its lost acceptance costs less than its saved steps, and only a head size is applied."""

import json
from dataclasses import replace

import pytest

from specdemo import draft_choice, tune
from specdemo.draft_choice import DraftOption, candidates, price
from specdemo.settings import DEFAULT_DRAFT, ModelSettings
from tests.fake_models import FakeModel
from tests.test_planner import machine

AMX = machine(0.02, draft_steps=0.26, n_max=13)  # memory-bound target, a cheap draft
AVX2 = machine(0.30, draft_steps=0.50, n_max=13)  # compute-bound target, a draft step half a target step


def option(head: int, alpha: float, step_s: float, precision: str = "int4", applies: bool = True) -> DraftOption:
    """A candidate with plenty of evidence of acceptance `alpha` at every position."""
    return DraftOption(precision, head, rows=head or 151_936, step_s=step_s, tested=[10_000] * 12,
                       accepted=[int(alpha * 10_000)] * 12, applies=applies)


def test_a_trimmed_head_wins_where_draft_steps_are_dear():
    full, trimmed = option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375)  # 25 % cheaper, acceptance 0.94 -> 0.90
    assert price([full, trimmed], AVX2) is trimmed
    assert trimmed.chosen and not full.chosen
    assert trimmed.predicted_speedup >= 1.03 * full.predicted_speedup


def test_a_cheap_head_that_loses_much_acceptance_is_not_chosen():
    full, trimmed = option(0, 0.94, 0.026), option(8_000, 0.80, 0.0156)  # 40 % cheaper, acceptance 0.94 -> 0.80
    assert price([full, trimmed], AMX) is full
    assert trimmed.predicted_speedup < full.predicted_speedup and trimmed.k < full.k


def test_a_gain_within_the_margin_keeps_the_full_head():
    full, trimmed = option(0, 0.94, 0.026), option(32_000, 0.94, 0.0255)  # 2 % cheaper steps, the same acceptance
    assert price([full, trimmed], AMX) is full
    assert full.predicted_speedup < trimmed.predicted_speedup < 1.03 * full.predicted_speedup


def test_another_precision_is_priced_but_never_chosen():
    full, int8 = option(0, 0.94, 0.050), option(0, 0.96, 0.030, precision="int8", applies=False)
    assert price([full, int8], AVX2) is full
    assert int8.predicted_speedup > full.predicted_speedup  # the table says what it would give
    assert any("another precision" in line for line in draft_choice.table([full, int8]))


def test_candidates_start_from_the_full_head_and_add_a_precision_only_when_prepared():
    heads = [s.head_tokens for s in candidates(DEFAULT_DRAFT, lambda s: False)]
    assert heads[0] == 0 and set(heads) == set(draft_choice.HEADS)
    with_int8 = candidates(DEFAULT_DRAFT, lambda s: s.precision == "int8")
    assert [(s.precision, s.head_tokens) for s in with_int8][-1] == ("int8", 0)


def test_acceptance_is_measured_exactly_against_the_target_on_the_examples():
    """A draft identical to the target agrees on every tested draft; one that is not, on few."""
    vocab = 50
    target = FakeModel(vocab, "target", scale=3.0)

    def compile(settings: ModelSettings):
        model = FakeModel(vocab, "target" if settings.head_tokens == 0 else "other", scale=3.0)
        model.head_tokens = settings.head_tokens or vocab
        return model

    examples = [{"prompt": [1, 2, 3], "answer": [4, 5, 6, 7, 8, 9, 10, 11, 12]}]
    timed = []
    options, _ = draft_choice.measure(target, DEFAULT_DRAFT, examples, lambda e: (e["prompt"], e["answer"]),
                                   lambda s: False, compile, lambda models, t: timed.append(len(models)) or
                                   [0.02] * len(models), lambda message: None)
    assert timed == [len(draft_choice.HEADS)]  # one race over every candidate
    same, *others = options
    assert same.head_tokens == 0 and same.acceptance_rate() == 1.0 and sum(same.tested) > 0
    assert all(o.acceptance_rate() < 0.5 for o in others)


def test_tune_applies_the_planned_head_only_where_it_is_left_open(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"drafts": {tune.draft_key(DEFAULT_DRAFT): {"head_tokens": 16_000}}}))
    assert DEFAULT_DRAFT.head_tokens == -1
    assert tune.apply(DEFAULT_DRAFT, path).head_tokens == 16_000
    assert tune.apply(replace(DEFAULT_DRAFT, head_tokens=0), path).head_tokens == 0  # explicit wins
    assert tune.apply(replace(DEFAULT_DRAFT, precision="int8"), path).head_tokens == 0  # planned for another draft
    assert tune.apply(replace(DEFAULT_DRAFT, device="GPU"), path).head_tokens == 0  # planned on the CPU only
    assert tune.apply(DEFAULT_DRAFT, tmp_path / "none.json").head_tokens == 0  # no plan yet: the full head


def test_the_plan_is_kept_beside_the_compile_settings(tmp_path):
    path = tmp_path / "tune.json"
    full, trimmed = option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375)
    price([full, trimmed], AVX2)
    trial = tune.Trial("draft", tune.DEFAULT, chosen=True)
    tune.save([trial], {"target": DEFAULT_DRAFT, "draft": DEFAULT_DRAFT}, path, [full, trimmed])
    assert tune.chosen_head(DEFAULT_DRAFT, path) == 16_000
    kept = json.loads(path.read_text())["drafts"][tune.draft_key(DEFAULT_DRAFT)]["options"]
    assert [o["chosen"] for o in kept] == [False, True] and kept[1]["predicted_speedup"] == pytest.approx(
        trimmed.predicted_speedup)
