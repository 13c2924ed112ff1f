"""Whether a parting of greedy lanes is a near-tie or a defect (specdemo/results/parting.py): the band a compile's measured
batching noise allows, and that no bug can buy itself a wider one."""

import numpy as np

from specdemo.decoding import loops
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.decoding.events import TokenEvent
from specdemo.results import fidelity
from specdemo.results.lane import drain
from specdemo.results.parting import BAND_CAP, near_tie_band, parting
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer, StaleRollbackModel


def lane(ids: list[int], margins: list[float]) -> list[TokenEvent]:
    return [TokenEvent(i, f"w{i}", "target", step, 0.0, margin=m) for step, (i, m) in enumerate(zip(ids, margins))]


def test_a_rollback_that_leaves_a_stale_token_visible_is_a_defect_at_every_parting():
    vocab, settings = 32, GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(4))
    target, draft = StaleRollbackModel(vocab, "target", scale=3.0), FakeModel(vocab, "draft", scale=3.0)
    answers = [([i, i + 1], [(7 * i + 3 * j) % vocab for j in range(40)]) for i in range(4)]
    noise = fidelity.batching_noise(target, answers)  # as warm-up measures it
    verdicts = []
    for i in range(100):
        prompt = [i % vocab, i // vocab, 1]
        ar = drain(loops.autoregressive(target, FakeTokenizer(), prompt, settings, set()))
        spec = drain(loops.speculative(target, ModelDrafter(draft, settings, np.random.default_rng(0)),
                                          FakeTokenizer(), prompt, settings, set()))
        parted = parting(ar.tokens, spec.tokens, noise)
        verdicts.append(parted.verdict if parted else None)
        assert parted is None or "This compile is suspect" in parted.sentence()
    assert verdicts.count("defect") >= 95 and "near-tie" not in verdicts  # the bug shows, and is called what it is


def test_no_measured_noise_widens_the_band_beyond_the_cap():
    assert near_tie_band(4.2) == BAND_CAP and near_tie_band(0.1) == 0.2 and near_tie_band(0.0) > 0
    loud = fidelity.BatchingNoise(4.2, 96, (2, 13), clean_gap_change=4.2)
    parted = parting(lane([1, 2], [3.0, 2.0]), lane([1, 5], [3.0, 1.5]), loud)
    assert parted.verdict == "defect" and parted.suspect == loud.suspect
    assert f"at most {BAND_CAP}" in parted.sentence() and "This compile is suspect" in parted.sentence()


def test_a_sound_compile_s_parting_is_not_called_suspect():
    sound = fidelity.BatchingNoise(0.12, 96, (2, 13), clean_gap_change=0.0)
    parted = parting(lane([1, 2], [3.0, 0.1]), lane([1, 5], [3.0, 0.05]), sound)
    assert parted.verdict == "near-tie" and parted.suspect is None and "suspect" not in parted.sentence()
