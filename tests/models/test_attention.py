"""specdemo's CachedAttention (kernels/src/attention.hpp, cached_attention.own_attention): grouped-query causal attention over a
cache the op keeps, equal to numpy's on every ISA path this CPU runs; a row's result the same bits whatever the rows
beside it; a call at an earlier position rolls the cache back; in a native model it stands for every layer's stateful
SDPA and scores as that did."""

import numpy as np
import pytest

from specdemo.models import cached_attention, export, kernels, runtime
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


def feed(op, q, k, v, past):
    """One call of `op` (a compiled CachedAttention): q (heads, L, d), k and v (kv_heads, L, d) at positions past ..
    past + L − 1."""
    positions = np.arange(past, past + q.shape[1], dtype=np.int64)[None]
    return op([cached_attention.by_position(x) for x in (q, k, v)] + [positions])[0][0]


@pytest.mark.parametrize("heads, kv_heads, d", [(12, 2, 128), (14, 2, 64), (4, 2, 40), (6, 3, 12)])
def test_it_is_grouped_causal_attention_over_what_earlier_calls_stored_on_every_isa(heads, kv_heads, d, each_isa):
    """Head sizes of the 1.5B target and the 0.5B draft, one whose rows take 8 columns at a time, one that is no whole
    number of vectors (the scalar path then); calls of 1 to 40 rows (many blocks of rows a task)."""
    rng = np.random.default_rng(1)
    total = 70
    q = rng.standard_normal((heads, total, d), dtype=np.float32) * 2
    k, v = (rng.standard_normal((kv_heads, total, d), dtype=np.float32) for _ in range(2))
    for isa in each_isa:
        kernels.use(isa)
        op = cached_attention.compiled(kernels.new_core(), heads, kv_heads, d)
        start = 0
        for rows in (20, 1, 3, 40, 6):
            end = start + rows
            got = feed(op, q[:, start:end], k[:, start:end], v[:, start:end], start)
            want = cached_attention.reference(q[:, start:end], k[:, :end], v[:, :end])
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{isa}, rows {start}..{end}")
            start = end


def test_given_the_rotary_frequencies_it_rotates_q_and_k_at_their_positions_as_the_graph_did(each_isa):
    """The op applies the rotary embedding itself (own_attention folds gguf_graph's into it): the same attention as over
    q and k rotated beforehand, at the positions of each call, and still each row's bits alone or beside others."""
    rng = np.random.default_rng(3)
    heads, kv_heads, d, total = 14, 2, 64, 40
    frequencies = (1.0 / 1e6 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    q = rng.standard_normal((heads, total, d), dtype=np.float32) * 2
    k, v = (rng.standard_normal((kv_heads, total, d), dtype=np.float32) for _ in range(2))
    rotate = cached_attention.rotated
    for isa in each_isa:
        kernels.use(isa)
        op = cached_attention.compiled(kernels.new_core(), heads, kv_heads, d, frequencies=frequencies)
        for start, end in ((0, 30), (30, 31), (31, 36)):
            got = feed(op, q[:, start:end], k[:, start:end], v[:, start:end], start)
            want = cached_attention.reference(rotate(q[:, start:end], start, frequencies), rotate(k[:, :end], 0, frequencies),
                                              v[:, :end])
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{isa}, rows {start}..{end}")
        alone = [feed(op, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], i)[0] for i in range(31, 36)]
        assert np.array_equal(got, np.array(alone)), isa


def test_a_row_s_result_is_the_same_bits_whatever_the_rows_beside_it_on_every_isa(each_isa):
    """Verification scores K + 1 rows in one call where decoding scored them one by one: both give each row the same
    bits (greedy speculative decoding equals autoregressive token for token)."""
    rng = np.random.default_rng(2)
    heads, kv_heads, d, past = 12, 2, 128, 37
    q = rng.standard_normal((heads, past + 9, d), dtype=np.float32)
    k, v = (rng.standard_normal((kv_heads, past + 9, d), dtype=np.float32) for _ in range(2))
    for isa in each_isa:
        kernels.use(isa)
        op = cached_attention.compiled(kernels.new_core(), heads, kv_heads, d)
        feed(op, q[:, :past], k[:, :past], v[:, :past], 0)
        together = feed(op, q[:, past:], k[:, past:], v[:, past:], past)
        alone = [feed(op, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], i)[0] for i in range(past, past + 9)]
        assert np.array_equal(together, np.array(alone)), isa


def test_a_call_at_an_earlier_position_rolls_the_cache_back_and_one_past_what_it_holds_is_refused():
    rng = np.random.default_rng(3)
    heads, kv_heads, d = 4, 2, 16
    q = rng.standard_normal((heads, 12, d), dtype=np.float32)
    k, v = (rng.standard_normal((kv_heads, 12, d), dtype=np.float32) for _ in range(2))
    k2, v2 = (rng.standard_normal((kv_heads, 3, d), dtype=np.float32) for _ in range(2))
    op = cached_attention.compiled(kernels.new_core(), heads, kv_heads, d)
    feed(op, q[:, :10], k[:, :10], v[:, :10], 0)  # 10 positions, then back to 6 and 3 others written over 6..8
    got = feed(op, q[:, 6:9], k2, v2, 6)
    keys, values = np.concatenate([k[:, :6], k2], 1), np.concatenate([v[:, :6], v2], 1)
    np.testing.assert_allclose(got, cached_attention.reference(q[:, 6:9], keys, values), rtol=2e-5, atol=2e-5)
    with pytest.raises(RuntimeError, match="the call follows 20 positions, the cache holds 9"):
        feed(op, q[:, :1], k[:, :1], v[:, :1], 20)


def native_pair(tmp_path, monkeypatch, **change):
    """A tiny native model loaded twice: its attention specdemo's, and the plugin's stateful SDPA."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    settings = ModelSettings(str(gguf), precision="gguf-native", **change)
    own = OVModel(tmp_path / "ir", settings)
    with monkeypatch.context() as patch:
        patch.setattr(cached_attention, "own_attention", lambda *_: 0)
        plugin = OVModel(tmp_path / "ir", settings)
    return own, plugin


def test_the_own_attention_reads_positions_so_the_attention_mask_feeds_no_node(tmp_path):
    """A one-token call's compile then has every node's shapes fixed, the attention's too (runtime._compile_fixed)."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    core = kernels.new_core()
    model = core.read_model(tmp_path / "ir" / "openvino_model.xml")
    assert cached_attention.own_attention(model, core) == 2
    readers = {p.get_friendly_name(): {r.get_node().get_type_name() for r in p.output(0).get_target_inputs()}
               for p in model.get_parameters()}
    assert readers["attention_mask"] == set() and "CachedAttention" in readers["position_ids"]


def test_a_native_model_attends_with_its_own_op_in_every_layer_and_scores_as_the_plugin_s_sdpa(tmp_path, monkeypatch):
    """The op takes q, k and v as the projections lay them out and applies the rotary embedding: no Transpose, RoPE, Cos
    or Sin is left to the plugin."""
    own, plugin = native_pair(tmp_path, monkeypatch)
    assert own.own_attention == tiny_gguf.LAYERS and plugin.own_attention == 0
    runtime = own.compiled.get_runtime_model()
    assert not {"ReadValue", "Assign", "ScaledDotProductAttentionWithKVCache", "RoPE", "Transpose", "Math"} & {
        op.get_rt_info()["layerType"].astype(str) for op in runtime.get_ordered_ops()}
    assert not own.request.query_state()
    prompt, steps = list(range(40, 60)), [7, 8, 9, 10, 11]
    for model in (own, plugin):
        model.forward(prompt)
    got, want = own.forward(steps, logits_to_keep=5), plugin.forward(steps, logits_to_keep=5)
    # the same attention by other sums: the next layer's 8-bit activations may round a value the other way
    assert np.abs(got - want).mean() <= 0.01 * np.abs(want).mean()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert own.kv_cache_bytes() == 25 * tiny_gguf.LAYERS * 2 * tiny_gguf.KV_HEADS * tiny_gguf.HEAD_DIM * 4


def test_a_rolled_back_native_model_scores_as_one_that_never_saw_the_forgotten_tokens(tmp_path, monkeypatch):
    own, _ = native_pair(tmp_path, monkeypatch)
    prompt = list(range(40, 60))
    own.forward(prompt + [1, 2, 3, 4])
    own.rollback(len(prompt))
    after = own.forward([7, 8], logits_to_keep=2)
    own.reset()
    fresh = own.forward(prompt + [7, 8], logits_to_keep=2)
    assert np.array_equal(after, fresh)
    assert own.length == len(prompt) + 2 and own.forgotten == 0


def test_one_token_calls_run_their_own_compile_with_the_same_cache_and_the_same_bits(tmp_path, monkeypatch):
    """A native model's decoding steps run a compile whose shapes are fixed (OVModel._compile_fixed) beside the general
    one: both read and write the same keys and values (the ops' copies share them), the weights are packed once, and a
    step scores a position as a verification of several rows does, bit for bit."""
    own, _ = native_pair(tmp_path, monkeypatch)
    step_inputs = {port.get_any_name(): port.get_partial_shape() for port in own._fixed[1].get_compiled_model().inputs}
    assert str(step_inputs["input_ids"]) == "[1,1]" and step_inputs["attention_mask"].is_dynamic
    packed = kernels.packings()
    prompt, steps = list(range(40, 60)), [7, 8, 9, 10]
    own.forward(prompt)
    one_by_one = np.array([own.forward([token])[0] for token in steps])
    own.rollback(len(prompt))
    together = own.forward(steps, logits_to_keep=len(steps))
    assert np.array_equal(one_by_one, together)
    assert kernels.packings() == packed  # the general compile's first many-row call found the step's packing


def test_calls_of_a_fixed_token_count_run_their_own_compile_and_score_as_the_general_one_bit_for_bit(tmp_path):
    """A loader's fixed_calls (a target's verifications) each get a compile with every shape fixed, which such a call
    runs: its logits are the general compile's, and its keys and values are the same cache's."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    settings = ModelSettings(str(gguf), precision="gguf-native")
    fixed, general = OVModel(tmp_path / "ir", settings, fixed_calls=(3,)), OVModel(tmp_path / "ir", settings)
    inputs = {port.get_any_name(): port.get_partial_shape() for port in fixed._fixed[3].get_compiled_model().inputs}
    assert str(inputs["input_ids"]) == "[1,3]" and sorted(general._fixed) == [1]
    prompt, drafts = list(range(40, 60)), [7, 8, 9]
    for model in (fixed, general):
        model.forward(prompt)
    scored = fixed.forward(drafts, logits_to_keep=3)
    assert fixed._last is fixed._fixed[3]
    assert np.array_equal(scored, general.forward(drafts, logits_to_keep=3))
    for model in (fixed, general):  # a step then reads the keys and values the fixed compile wrote
        model.rollback(len(prompt) + 1)
    assert np.array_equal(fixed.forward([8]), general.forward([8]))


def test_fixed_calls_read_inputs_set_once_and_score_each_call_as_the_general_compile_does(tmp_path):
    """A fixed compile's inputs are arrays set once, which each call writes its ids, positions and rows to keep into
    (OVModel._preset_inputs): calls of every fixed size, keeping fewer rows or all, after rollbacks, score as the
    general compile scores them, bit for bit."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    settings = ModelSettings(str(gguf), precision="gguf-native")
    fixed = OVModel(tmp_path / "ir", settings, fixed_calls=(2, 3))
    general = OVModel(tmp_path / "ir", settings, profiled=True)  # profiled: every call on the general compile
    assert sorted(fixed._preset) == [1, 2, 3] and general._preset == {} and general._fixed == {1: general.request}
    read = fixed._fixed[2].get_tensor("input_ids").data
    assert np.shares_memory(read, fixed._preset[2]["input_ids"])
    prompt = list(range(40, 60))
    calls = [([5], 1, None), ([6, 7], 1, None), ([6, 7], 2, 21), ([1, 2, 3], 3, None), ([9], 1, 22), ([4, 8], 2, None)]
    for model in (fixed, general):
        model.forward(prompt)
    for ids, keep, back_to in calls:
        for model in (fixed, general):
            if back_to is not None:
                model.rollback(back_to)
        assert np.array_equal(fixed.forward(ids, logits_to_keep=keep), general.forward(ids, logits_to_keep=keep)), ids
        assert fixed._last is fixed._fixed[len(ids)]


def test_a_kv_cache_precision_asked_for_keeps_the_plugin_s_attention(tmp_path, monkeypatch):
    own, _ = native_pair(tmp_path, monkeypatch, kv_cache_precision="u8")
    assert own.own_attention == 0 and own.kv_cache_precision == "u8" and own._fixed[1] is own.request


def test_the_check_at_load_finds_the_attention_right_on_every_isa_and_says_where_it_is_not(each_isa, monkeypatch):
    for isa in each_isa:
        kernels.use(isa)
        assert cached_attention.misfit(kernels.new_core()) is None, isa
    real = cached_attention.reference
    monkeypatch.setattr(cached_attention, "reference", lambda q, *rest: real(q, *rest) * 1.0001)
    assert (cached_attention.misfit(kernels.new_core()) or "").startswith("for attention (30 query rows: off by")


class FirstWaitUnfinished:
    """An infer request whose first wait_for says its call still runs, whether or not it has ended; the rest is the
    request's own."""

    def __init__(self, request):
        self._request, self._asked = request, False

    def wait_for(self, milliseconds: int) -> bool:
        if not self._asked:
            self._asked = True
            return False
        return self._request.wait_for(milliseconds)

    def __getattr__(self, name: str):
        return getattr(self._request, name)


def test_a_native_model_whose_long_call_was_stopped_part_way_starts_over_from_an_empty_cache(tmp_path, monkeypatch):
    """Some layers' ops wrote the stopped call's keys and values, others not: the emptied cache (a mask of 0 positions
    before the next call) is the same for all of them."""
    own, _ = native_pair(tmp_path, monkeypatch)
    # asked as soon as it starts, in a call long enough to be running then on a loaded host: 40 tokens of a tiny model
    # were sometimes over before the first question, and 200 once too while a CI run loaded both cores (the asking
    # thread descheduled): the first question is then told the call still runs
    monkeypatch.setattr(runtime, "POLL_MS", 0)
    prompt = list(range(40, 240))
    expected = own.forward(prompt[:12])
    own.forward(prompt)
    monkeypatch.setattr(own, "request", FirstWaitUnfinished(own.request))
    with own.interruptible(lambda: True), pytest.raises(runtime.Interrupted):
        own.forward(prompt)
    assert own.length == 0
    assert np.array_equal(own.forward(prompt[:12]), expected)
