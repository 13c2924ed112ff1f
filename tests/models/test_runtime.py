"""The OpenVINO runtime and its KV cache, on tiny random models (fast, exact)."""

import numpy as np
import pytest

from specdemo.models import runtime
from specdemo.models.runtime import LONG_CALL, OVModel
from specdemo.settings import ModelSettings

PROMPT = [5, 17, 99, 3, 250, 42, 7]


def _model(folder, kv="f32", inference="f32"):
    """Exact arithmetic by default: f32 activations and KV cache, so comparisons can be tight."""
    settings = ModelSettings(str(folder), precision="fp16", kv_cache_precision=kv, inference_precision=inference)
    return OVModel(folder, settings)


def _greedy(model, feed, steps):
    """Greedy tokens and their logit rows, continuing from whatever the cache holds."""
    tokens, rows = [], []
    for _ in range(steps):
        row = model.forward(feed)[0]
        rows.append(row)
        tokens.append(int(row.argmax()))
        feed = [tokens[-1]]
    return tokens, np.stack(rows)


def test_rollback_continues_exactly_like_plain_decoding(tiny_target):
    model = _model(tiny_target)
    plain, plain_rows = _greedy(model, PROMPT, 20)

    model.reset()
    _greedy(model, PROMPT, 15)  # go further than we keep...
    model.rollback(len(PROMPT) + 8)  # ...then keep the prompt and the first 8 generated tokens
    again, again_rows = _greedy(model, [plain[8]], 11)

    assert again == plain[9:]
    np.testing.assert_allclose(again_rows, plain_rows[9:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv, inference", [("u8", "f32"), ("f16", "f32"), ("", "")])
def test_rollback_is_exact_with_compressed_caches_and_default_precisions(tiny_target, kv, inference):
    model = _model(tiny_target, kv, inference)
    plain, plain_rows = _greedy(model, PROMPT, 16)
    model.reset()
    _greedy(model, PROMPT, 12)
    model.rollback(len(PROMPT) + 4)
    again, again_rows = _greedy(model, [plain[4]], 11)
    assert again == plain[5:]
    np.testing.assert_allclose(again_rows, plain_rows[5:], rtol=1e-4, atol=1e-4)


def test_rounds_of_drafts_and_rollbacks_past_compaction_score_like_plain_decoding(tiny_target, monkeypatch):
    """Rollback masks the forgotten positions; when they pile up the cache is compacted. Either way the next scores are
    those of a cache that never held them."""
    from specdemo.models import runtime

    monkeypatch.setattr(runtime, "COMPACT_AFTER", 12)
    plain, plain_rows = _greedy(_model(tiny_target), PROMPT, 40)
    model = _model(tiny_target)
    model.forward(PROMPT[:-1])  # the loops' invariant: the cache holds the text but its last token
    compactions = 0
    for i in range(40):
        last = PROMPT[-1] if i == 0 else plain[i - 1]
        rows = model.forward([last, 1, 2, 3], logits_to_keep=4)  # the true token, then three drafts never kept
        np.testing.assert_allclose(rows[0], plain_rows[i], rtol=1e-5, atol=1e-5)
        before = model.forgotten
        model.rollback(len(PROMPT) + i)
        compactions += model.forgotten < before
    assert compactions >= 5 and model.length == len(PROMPT) + 39


def test_rollback_to_zero_is_a_fresh_start(tiny_target):
    model = _model(tiny_target)
    first, _ = _greedy(model, PROMPT, 6)
    model.rollback(0)
    assert model.length == 0
    second, _ = _greedy(model, PROMPT, 6)
    assert first == second


def test_rollback_refuses_to_grow_the_cache(tiny_target):
    model = _model(tiny_target)
    model.forward(PROMPT)
    with pytest.raises(ValueError, match="cannot roll back"):
        model.rollback(len(PROMPT) + 1)


def test_scoring_many_tokens_in_one_call_equals_one_at_a_time(tiny_target):
    model = _model(tiny_target)
    tokens, rows = _greedy(model, PROMPT, 6)
    model.reset()
    model.forward(PROMPT[:-1])
    batched = model.forward([PROMPT[-1]] + tokens[:5], logits_to_keep=6)  # (6, V)
    assert batched.argmax(-1).tolist() == tokens
    np.testing.assert_allclose(batched, rows, rtol=1e-4, atol=1e-4)


def test_only_the_requested_logit_rows_come_back(tiny_target):
    model = _model(tiny_target)
    assert model.sliced_logits
    assert model.forward(PROMPT).shape == (1, 512)
    model.reset()
    assert model.forward(PROMPT, logits_to_keep=3).shape == (3, 512)


def test_kv_cache_size_is_reported_in_bytes(tiny_target):
    model = _model(tiny_target, "f16")
    assert model.kv_cache_bytes() == 0
    model.forward(PROMPT)
    # 2 layers x (keys + values) x 2 kv heads x 7 tokens x 16 head dims x 2 bytes
    assert model.kv_cache_precision == "f16"
    assert model.kv_cache_bytes() == 2 * 2 * 2 * len(PROMPT) * 16 * 2


def test_a_long_input_fed_in_pieces_scores_like_one_call(tiny_target, monkeypatch):
    from specdemo.models import runtime

    model = _model(tiny_target)
    whole = model.forward(PROMPT * 3, logits_to_keep=2)
    monkeypatch.setattr(runtime, "PREFILL_CHUNK", 4)  # 21 tokens in pieces of 4, 4, 4, 4 and 5
    model.reset()
    pieces = model.forward(PROMPT * 3, logits_to_keep=2)
    assert model.length == 21 and model.calls == 1  # one call, however many pieces
    np.testing.assert_allclose(pieces, whole, rtol=1e-5, atol=1e-5)


def test_a_trimmed_head_scores_exactly_its_rows_of_the_full_head(tiny_target):
    ids = np.array([2, 5, 17, 99, 250, 300], dtype=np.int64)
    full = _model(tiny_target).forward(PROMPT)[0]
    settings = ModelSettings(str(tiny_target), precision="fp16", kv_cache_precision="f32", inference_precision="f32")
    trimmed = OVModel(tiny_target, settings, head_ids=ids)
    assert trimmed.head_tokens == len(ids) and trimmed.vocab_size == full.size
    np.testing.assert_allclose(trimmed.forward(PROMPT)[0], full[ids], rtol=1e-5, atol=1e-5)


def test_compacting_a_u8_cache_changes_no_score(tiny_target, monkeypatch):
    """The plugin's default cache is u8: compaction copies its kept positions out and back. The same rounds of drafts
    and rollbacks score the same whether the cache was compacted along the way or never (a u8 cache's batched calls
    differ from single steps by up to ~0.1 logits here, compaction or not, so the comparison is round against round)."""
    from specdemo.models import runtime

    def rounds(compact_after: int) -> tuple[np.ndarray, int]:
        monkeypatch.setattr(runtime, "COMPACT_AFTER", compact_after)
        model = _model(tiny_target, kv="u8")
        model.forward(PROMPT[:-1])
        scores, compactions, last = [], 0, PROMPT[-1]
        for i in range(40):
            rows = model.forward([last, 1, 2, 3], logits_to_keep=4)  # a token, then three drafts never kept
            scores.append(rows[0])
            last = int(rows[0].argmax())
            before = model.forgotten
            model.rollback(len(PROMPT) + i)
            compactions += model.forgotten < before
        return np.stack(scores), compactions

    compacted, compactions = rounds(12)
    never, none = rounds(10_000)
    assert compactions >= 5 and none == 0
    np.testing.assert_allclose(compacted, never, rtol=1e-4, atol=1e-4)  # attention sums over a shorter cache


def test_a_long_call_that_may_be_interrupted_scores_as_an_ordinary_call(tiny_target):
    model = _model(tiny_target)
    long_prompt = (PROMPT * 8)[:LONG_CALL + 3]
    plain = model.forward(long_prompt)
    model.reset()
    with model.interruptible(lambda: False):
        np.testing.assert_array_equal(model.forward(long_prompt), plain)
    assert model.length == len(long_prompt)


def test_a_long_call_stops_part_way_when_asked_and_leaves_an_empty_cache_that_works(tiny_target, monkeypatch):
    monkeypatch.setattr(runtime, "POLL_MS", 0)  # asked as soon as it starts: a tiny model's call is over in 10 ms
    model = _model(tiny_target)
    expected = model.forward(PROMPT)
    model.forward(PROMPT * 5)
    with model.interruptible(lambda: True), pytest.raises(runtime.Interrupted):
        model.forward(PROMPT * 30)  # 210 tokens: long enough not to end before its first poll on a busy host
    assert model.length == 0
    np.testing.assert_allclose(model.forward(PROMPT), expected, rtol=1e-6, atol=1e-6)


def test_a_short_call_is_never_interrupted(tiny_target, monkeypatch):
    monkeypatch.setattr(runtime, "POLL_MS", 0)
    model = _model(tiny_target)
    with model.interruptible(lambda: True):
        model.forward(PROMPT)  # a lane's step or verify call: run as the lanes run it, and never stopped
    assert model.length == len(PROMPT)
