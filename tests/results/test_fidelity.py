"""Fidelity to the GGUF (specdemo/results/fidelity.py) and our greedy text against llama.cpp's (bench/sections.py), on
known logits and known texts."""

import numpy as np
import pytest

from specdemo.bench.schema import Agreement
from specdemo.bench.table import Lane, Run
from specdemo.bench.sections import text_agreement
from specdemo.results import fidelity


class Logits:
    """A model whose teacher-forced logits are given: forward(answer[:-1]) returns `table[:len]`."""

    def __init__(self, table: np.ndarray):
        self.table = table

    def reset(self):
        pass

    def forward(self, ids, logits_to_keep=1):
        return self.table[:logits_to_keep]


def test_agreement_and_logit_error_are_counted_over_every_answer_position():
    reference = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])  # greedy: 1, 0, 2
    flipped = reference.copy()
    flipped[1] = [0.0, 2.5, 0.0]  # position 1 now chooses token 1: |error| (2 + 2.5 + 0) / 3 = 1.5
    examples = [([7, 8], [1, 2, 3, 4])]  # 4 answer tokens: 3 positions scored
    logits = fidelity.reference_logits(Logits(reference), examples)
    assert fidelity.compare(logits, Logits(reference), examples) == (3, 1.0, 0.0)
    positions, agreement, error = fidelity.compare(logits, Logits(flipped), examples)
    assert positions == 3 and agreement == 2 / 3 and np.isclose(error, 1.5 / 3)


def test_the_gguf_reference_is_the_file_s_own_blocks_in_f32_without_dynamic_quantization():
    from specdemo.settings import DEFAULT_TARGET

    reference = fidelity.reference_settings(DEFAULT_TARGET)
    assert (reference.precision, reference.inference_precision, reference.kv_cache_precision,
            reference.dynamic_quantization_group_size) == ("gguf", "f32", "f32", 0)


def run(lane: Lane, instruction: int, ids: list[int]) -> Run:
    return Run(lane, instruction, 0, 100, 1.0, len(ids), ids=ids)


def test_text_agreement_counts_the_tokens_written_before_the_texts_part():
    ours, theirs = Lane("ours", "specdemo", "autoregressive"), Lane("llama.cpp", "llamacpp", "autoregressive")
    runs = [run(ours, 0, [1, 2, 3, 4]), run(theirs, 0, [1, 2, 9, 4]),
            run(ours, 1, [5, 6, 7]), run(theirs, 1, [5, 6, 7, 8])]  # 1: equal until ours stopped
    assert text_agreement(runs, ours, theirs) == [Agreement(0, same_tokens=2, of=4), Agreement(1, same_tokens=3, of=3)]


class Batching:
    """A model whose logits at every position are [2, 1, 0, -1] (gap 1 between its top two) when fed one token per
    call, and whose batched calls of n tokens raise the runner-up by 0.05·n: the gap moves by 0.05·n. It records the
    cache lengths it is rolled back to."""

    def __init__(self):
        self.length, self.rollbacks = 0, []

    def reset(self):
        self.length = 0

    def rollback(self, length):
        self.rollbacks.append((self.length, length))
        self.length = length

    def forward(self, ids, logits_to_keep=1):
        self.length += len(ids)
        rows = np.tile(np.array([2.0, 1.0, 0.0, -1.0]), (logits_to_keep, 1))
        if len(ids) > 1:
            rows[:, 1] += 0.05 * len(ids)
        return rows


def test_batching_noise_is_the_largest_move_of_the_top_two_gap_between_single_and_batched_calls():
    examples = [([7], list(range(11))), ([8], list(range(30)))]  # 10 + 29 positions, capped at 20
    model = Batching()
    noise = fidelity.batching_noise(model, examples, positions=20, sizes=(2, 4))
    assert noise.positions == 20 and noise.sizes == (2, 4)
    # a rolled-back call of 4 positions also scores 3 rejected drafts: 7 rows, 0.05 × 7, the largest change
    assert noise.max_gap_change == pytest.approx(0.35, abs=1e-6)
    assert noise.clean_gap_change == pytest.approx(0.2, abs=1e-6)  # calls of 4 tokens, nothing rolled back: 0.05 × 4
    assert all(before - after == fidelity.REJECTED for before, after in model.rollbacks)  # each call's drafts rolled back


def test_the_parting_rate_alone_needs_no_calls_with_nothing_rolled_back():
    from tests.fake_models import StaleRollbackModel

    examples = [([1, 2], [(7 * j + 3) % 32 for j in range(40)]), ([3, 4], [(5 * j + 1) % 32 for j in range(40)])]
    full = fidelity.batching_noise(StaleRollbackModel(32, "target", scale=3.0), examples)
    flips = fidelity.batching_noise(StaleRollbackModel(32, "target", scale=3.0), examples, clean=False)
    assert (flips.flips, flips.positions, flips.max_gap_change) == (full.flips, full.positions, full.max_gap_change)
    assert flips.parting_rate == full.parting_rate > 0 and flips.clean_gap_change != flips.clean_gap_change  # NaN


def test_a_rollback_that_moves_the_gaps_makes_the_compile_suspect_and_is_kept_apart_from_the_kernels_noise():
    from tests.fake_models import StaleRollbackModel

    examples = [([1, 2], [(7 * j + 3) % 32 for j in range(40)]), ([3, 4], [(5 * j + 1) % 32 for j in range(40)])]
    noise = fidelity.batching_noise(StaleRollbackModel(32, "target", scale=3.0), examples)
    assert noise.clean_gap_change == 0.0  # its single steps and batched calls agree exactly
    assert noise.max_gap_change > fidelity.NOISE_CEILING and noise.flips > noise.positions / 2
    assert noise.suspect is not None and noise.to_dict()["suspect"] == noise.suspect
    assert noise.trusted_gap_change == 0.0  # what its partings are judged by: the change no rollback added to


def test_a_compile_is_suspect_only_where_its_calls_move_a_gap_beyond_what_sound_compiles_showed():
    ceiling = fidelity.NOISE_CEILING
    sound = fidelity.BatchingNoise(ceiling, 96, (2, 13), clean_gap_change=0.0)
    assert sound.suspect is None and sound.trusted_gap_change == ceiling  # judged as the lane runs, drafts rolled back
    assert fidelity.BatchingNoise(ceiling + 0.01, 96, (2, 13), clean_gap_change=0.1).suspect is not None
    assert fidelity.BatchingNoise(0.1, 96, (2, 13), clean_gap_change=ceiling + 0.01).suspect is not None


def test_warm_up_says_when_the_compile_it_loaded_is_suspect():
    from types import SimpleNamespace

    from specdemo.learning import warmup

    loud = fidelity.BatchingNoise(4.2, 96, (2, 13), clean_gap_change=0.0)
    pair = SimpleNamespace(profile=SimpleNamespace(noise=lambda key: loud), keys=SimpleNamespace(costs="key"))
    said = []
    assert warmup.batching_noise(pair, 4, said.append) is loud
    assert said == [f"this compile is suspect: {loud.suspect}"]


def test_a_noise_measured_before_the_clean_calls_were_kept_is_measured_again():
    old = {"max_gap_change": 0.12, "positions": 96, "sizes": [2, 13], "flips": 1, "parting_rate": 10.4}
    with pytest.raises(KeyError):
        fidelity.BatchingNoise.from_dict(old)
    new = fidelity.BatchingNoise(0.12, 96, (2, 13), 1, 0.05)
    assert fidelity.BatchingNoise.from_dict(new.to_dict()) == new


def test_a_compiled_tiny_target_shows_a_small_finite_batching_noise(tiny_pair):
    target = tiny_pair[0].runtime
    noise = fidelity.batching_noise(target, [([1, 2, 3], list(range(10, 40)))], positions=24, sizes=(2, 5))
    assert noise.positions == 24 and 0.0 <= noise.max_gap_change < 0.5 and 0.0 <= noise.clean_gap_change < 0.5
    assert noise.suspect is None
