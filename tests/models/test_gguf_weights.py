"""A GGUF's own blocks as OpenVINO compressed weights (specdemo/models/gguf_weights.py, specdemo/models/gguf_import.py): on tiny
GGUFs written here, for every quantization type the default pair's files hold, the exact layout decompresses to
gguf's own dequantization up to f16 rounding of each group's scale and offset, in a MatMul and in the embedding's
Gather; the mixed layout keeps Q4_K exact and lays the rest per channel within half a step; a weight whose rows are
not the file's is refused, and a Llama file's permuted q/k rows are restored (by both kinds of weights, and caught by
the check when they are not)."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from specdemo.models import gguf_import, gguf_weights, kernels
from specdemo.models.gguf_file import GGUFFile

TYPES = [T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0]  # what the default target (Q4_K, Q6_K) and draft (+ Q5_0, Q8_0) hold
SCALES = {T.Q4_K: [0, 2], T.Q6_K: [208], T.Q5_0: [0], T.Q8_0: [0]}  # byte offsets of each block's f16 scales
ROWS, COLUMNS = 24, 512  # two Q4_K / Q6_K super-blocks per row, 16 Q8_0 / Q5_0 blocks


def random_blocks(kind: T, rows: int, columns: int, seed: int) -> np.ndarray:
    """(rows, bytes per row) uint8: random quantized values and sub-scales, with finite f16 block scales."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    for offset in SCALES[kind]:
        scales = rng.uniform(0.001, 0.02, size=(rows, columns // block)).astype("<f2")
        raw[..., offset:offset + 2] = scales.view(np.uint8).reshape(rows, columns // block, 2)
    return raw.reshape(rows, -1)


def write_gguf(path, tensors: dict, architecture: str = "qwen2", fields: dict | None = None):
    """A GGUF file holding `tensors` ({name: (raw uint8 rows, quantization type)}) and integer `fields`."""
    writer = gguf.GGUFWriter(path, architecture)
    for key, value in (fields or {}).items():
        writer.add_uint32(key, value)
    for name, (raw, kind) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A GGUF file holding one (ROWS, COLUMNS) tensor of every type, named as a layer's projections are."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_gguf(path, {f"blk.{i}.ffn_up.weight": (random_blocks(kind, ROWS, COLUMNS, seed=i), kind)
                             for i, kind in enumerate(TYPES)})


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def reference_of(path, name: str, rows: int = ROWS, columns: int = COLUMNS) -> np.ndarray:
    tensor = tensors(path)[name]
    return gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(rows, columns)


def f16_rounding(blocks: gguf_weights.Blocks) -> np.ndarray:
    """(rows, columns): how far f16 rounding of each group's scale and offset can move its weights (2⁻¹⁰ of |s·q| +
    |b|: twice the f16 step, for the rounding of the products the references make too)."""
    q = np.abs(blocks.q.astype(np.float32))
    bound = q * np.abs(blocks.scale.astype(np.float32))[..., None]
    if blocks.offset is not None:
        bound += np.abs(blocks.offset.astype(np.float32))[..., None]
    return 2.0 ** -10 * bound.reshape(blocks.q.shape[0], -1) + 1e-7


@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
def test_unpacked_blocks_equal_gguf_dequantization_within_f16_rounding_of_each_group(tiny_gguf, kind):
    tensor = tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"]
    reference = reference_of(tiny_gguf, tensor.name)
    blocks = gguf_weights.unpack(kind.name, np.asarray(tensor.data))
    assert blocks.q.min() >= (-8 if blocks.bits == 4 else -128) and blocks.q.max() <= (7 if blocks.bits == 4 else 127)
    assert (np.abs(blocks.dequantize() - reference) <= f16_rounding(blocks)).all()
    assert not (np.abs(np.roll(blocks.dequantize(), 1, axis=1) - reference) <= f16_rounding(blocks)).all()


def test_the_rounding_bound_sees_a_one_percent_error_in_a_q4_k_min(tiny_gguf):
    tensor = tensors(tiny_gguf)["blk.0.ffn_up.weight"]
    blocks = gguf_weights.unpack("Q4_K", np.asarray(tensor.data))
    minimum = 8 * blocks.scale.astype(np.float32) - blocks.offset.astype(np.float32)  # dmin·m
    wrong = gguf_weights.Blocks(blocks.q, blocks.scale, (8 * blocks.scale.astype(np.float32) - 1.01 * minimum)
                                .astype(np.float16), 4)
    assert not (np.abs(wrong.dequantize() - reference_of(tiny_gguf, tensor.name)) <= f16_rounding(blocks)).all()


def one_layer(weights, op: str, name: str, columns: int = COLUMNS):
    """An ov.Model reading tensor `name` of `weights` (gguf_import) as the graph does: a MatMul on activations x
    (1, n, columns), or the embedding's Gather on ids (1, n)."""
    import openvino as ov
    from openvino import opset13 as ops

    if op == "MatMul":
        x = ops.parameter([1, -1, columns], np.float32, name="x")
        node = weights.linear(x, name, "__module.model.layers.0.mlp.up_proj/aten::linear/MatMul")
    else:
        x = ops.parameter([1, -1], np.int32, name="ids")
        node = weights.embedding(x, name, "__module.model.embed_tokens/aten::embedding/Gather")
    return ov.Model([node], [x])


def decompressed(model, op: str, rows: int = ROWS, columns: int = COLUMNS) -> np.ndarray:
    """(rows, columns) the weight the CPU plugin computes with (f32 arithmetic, no dynamic quantization)."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    if op == "MatMul":  # the identity's rows pick out the weight's columns: x·Wᵀ = Wᵀ
        return compiled(np.eye(columns, dtype=np.float32)[None])[0][0].T
    return compiled(np.arange(rows, dtype=np.int64)[None])[0][0]


def block_constants(model) -> list[str]:
    """Element types of the low-bit constants the import added (its weights: signed, no zero point)."""
    return sorted(n.get_element_type().get_type_name() for n in model.get_ordered_ops()
                  if n.get_type_name() == "Constant" and n.get_element_type().get_type_name() in ("i4", "u4", "i8", "u8"))


def import_one(tiny_gguf, tmp_path, kind, op, layout):
    source = tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"]
    name = "blk.0.ffn_up.weight" if op == "MatMul" else "token_embd.weight"
    path = write_gguf(tmp_path / "one.gguf", {name: (np.asarray(source.data), kind)})  # this type alone, renamed
    return one_layer(gguf_import.BlockWeights(GGUFFile(path), layout), op, name), reference_of(path, name)


@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
@pytest.mark.parametrize("op", ["MatMul", "Gather"])
def test_openvino_decompresses_the_exact_layout_to_gguf_dequantization(tiny_gguf, tmp_path, kind, op):
    model, reference = import_one(tiny_gguf, tmp_path, kind, op, "exact")
    blocks = gguf_weights.unpack(kind.name, np.asarray(tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"].data))
    assert (np.abs(decompressed(model, op) - reference) <= f16_rounding(blocks)).all()
    assert block_constants(model) == ["i4" if kind == T.Q4_K else "i8"]


MIXED = {T.Q4_K: ["i4"], T.Q6_K: ["i8"], T.Q5_0: ["i8"], T.Q8_0: ["i8"]}


@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
def test_the_mixed_layout_keeps_q4_k_exact_and_lays_q6_k_per_channel(tiny_gguf, tmp_path, kind):
    model, reference = import_one(tiny_gguf, tmp_path, kind, "MatMul", "mixed")
    assert block_constants(model) == MIXED[kind]
    exact = gguf_weights.unpack(kind.name, np.asarray(tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"].data))
    error = np.abs(decompressed(model, "MatMul") - reference)
    if kind == T.Q6_K:  # one scale a row: within half its step (and its f16 rounding)
        step = np.abs(reference).max(axis=1, keepdims=True) * (1 / 127 + 2.0 ** -9)
        assert (error <= step / 2 + f16_rounding(exact)).all() and error.max() > f16_rounding(exact).max()
    else:  # the file's own arithmetic
        assert (error <= f16_rounding(exact)).all()


def test_the_mixed_layout_lays_the_embedding_per_channel(tiny_gguf, tmp_path):
    model, reference = import_one(tiny_gguf, tmp_path, T.Q4_K, "Gather", "mixed")
    assert block_constants(model) == ["i8"]
    exact = gguf_weights.unpack("Q4_K", np.asarray(tensors(tiny_gguf)["blk.0.ffn_up.weight"].data))
    step = np.abs(reference).max(axis=1, keepdims=True) * (1 / 127 + 2.0 ** -9)  # with its scale's f16 rounding
    assert (np.abs(decompressed(model, "Gather") - reference) <= step / 2 + f16_rounding(exact)).all()


def test_blocks_whose_rows_are_not_the_files_are_refused_with_a_sentence(tiny_gguf, monkeypatch):
    unpacked = gguf_weights.unpack
    monkeypatch.setattr(gguf_import, "unpack", lambda kind, raw: unpacked(kind, np.roll(raw, 1, axis=0)))
    weights = gguf_import.BlockWeights(GGUFFile(tiny_gguf), "exact")
    with pytest.raises(gguf_import.GGUFMismatchError, match="does not match gguf's dequantization of the file"):
        one_layer(weights, "MatMul", "blk.3.ffn_up.weight")  # Q8_0, its rows one place off


# ---- a tiny Llama-architecture GGUF: llama.cpp stores attn_q / attn_k with each head's rotary halves interleaved

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 4, 2, 8, 64


def permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's permutation of a (heads·head_dim, hidden) projection: (h, half, i) → (h, i, half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture
def llama_weights():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
    k = rng.normal(size=(KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
    # Round through Q8_0 once so that the original rows are exactly what the file's blocks dequantize to.
    q8 = lambda w: gguf.quants.dequantize(gguf.quants.quantize(w, T.Q8_0), T.Q8_0).reshape(w.shape)  # noqa: E731
    return q8(q), q8(k)


def llama_gguf(path, q, k, architecture: str = "llama"):
    fields = {f"{architecture}.attention.head_count": HEADS, f"{architecture}.attention.head_count_kv": KV_HEADS}
    return write_gguf(path, {"blk.0.attn_q.weight": (gguf.quants.quantize(permute_like_llama_cpp(q, HEADS), T.Q8_0), T.Q8_0),
                             "blk.0.attn_k.weight": (gguf.quants.quantize(permute_like_llama_cpp(k, KV_HEADS), T.Q8_0), T.Q8_0)},
                      architecture, fields)


def q_and_k(weights) -> tuple[np.ndarray, np.ndarray]:
    """The q and k weights (rows, columns) the CPU plugin computes with when `weights` lays them."""
    import openvino as ov
    from openvino import opset13 as ops

    x = ops.parameter([1, -1, HIDDEN], np.float32, name="x")
    outputs = [weights.linear(x, f"blk.0.attn_{name}.weight", f"__module.model.layers.0.self_attn.{name}_proj/aten::linear/MatMul")
               for name in ("q", "k")]
    compiled = ov.Core().compile_model(ov.Model(outputs, [x]), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    result = compiled(np.eye(HIDDEN, dtype=np.float32)[None])
    return result[0][0].T, result[1][0].T


@pytest.mark.parametrize("layout", [*gguf_weights.LAYOUTS, "dequantized"])
def test_a_llama_ggufs_permuted_q_and_k_rows_are_restored(tmp_path, llama_weights, layout):
    q, k = llama_weights
    file = GGUFFile(llama_gguf(tmp_path / "llama.gguf", q, k))
    weights = gguf_import.DequantizedWeights(file, []) if layout == "dequantized" else gguf_import.BlockWeights(file, layout)
    ours_q, ours_k = q_and_k(weights)
    assert np.abs(ours_q - q).max() <= 1e-3 * np.abs(q).max()
    assert np.abs(ours_k - k).max() <= 1e-3 * np.abs(k).max()


@pytest.mark.parametrize("layout", ["exact", "native"])
def test_q_and_k_rows_left_in_the_files_order_are_caught_by_the_check(tmp_path, llama_weights, monkeypatch, layout):
    q, k = llama_weights
    file = GGUFFile(llama_gguf(tmp_path / "llama.gguf", q, k))
    monkeypatch.setattr(gguf_import, "hf_row_order", lambda rows, heads: np.arange(rows))  # restoring forgotten
    with pytest.raises(gguf_import.GGUFMismatchError, match="attn_q"):
        q_and_k(gguf_import.BlockWeights(file, layout))


def test_a_qwen2_files_q_and_k_rows_are_taken_as_they_are(tmp_path, llama_weights):
    q, k = llama_weights
    path = write_gguf(tmp_path / "qwen2.gguf", {"blk.0.attn_q.weight": (gguf.quants.quantize(q, T.Q8_0), T.Q8_0),
                                                "blk.0.attn_k.weight": (gguf.quants.quantize(k, T.Q8_0), T.Q8_0)},
                      "qwen2", {"qwen2.attention.head_count": HEADS, "qwen2.attention.head_count_kv": KV_HEADS})
    ours_q, ours_k = q_and_k(gguf_import.BlockWeights(GGUFFile(path), "exact"))
    assert np.abs(ours_q - q).max() <= 1e-3 * np.abs(q).max() and np.abs(ours_k - k).max() <= 1e-3 * np.abs(k).max()


def wide_blocks(kind: T, rows: int, columns: int, seed: int) -> np.ndarray:
    """random_blocks whose f16 block scales take any finite value of either sign: subnormal, tiny, huge (products that
    round to subnormal halves or overflow to infinity)."""
    raw = random_blocks(kind, rows, columns, seed).reshape(rows, -1, gguf.GGML_QUANT_SIZES[kind][1])
    rng = np.random.default_rng(seed + 100)
    for offset in SCALES[kind]:
        bits = rng.integers(0, 1 << 16, size=raw.shape[:2], dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # no infinity or NaN: another finite half
        raw[..., offset:offset + 2] = bits.astype("<u2").view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


@pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # numpy's scales that round to infinity, as ours do
@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
def test_the_kernels_library_unpacks_every_block_as_numpy_does_bit_for_bit(kind):
    raw = wide_blocks(kind, 64, 1024, seed=TYPES.index(kind))
    ours, reference = gguf_weights.unpack(kind.name, raw), gguf_weights.unpack_numpy(kind.name, raw)
    assert kernels.unpack(kind.name, raw) is not None  # the library's, not numpy's again
    assert ours.bits == reference.bits and np.array_equal(ours.q, reference.q)
    for field in ("scale", "offset"):
        mine, theirs = getattr(ours, field), getattr(reference, field)
        assert (mine is None) == (theirs is None)
        if theirs is not None:
            assert np.array_equal(mine.view(np.uint16), theirs.view(np.uint16))  # every bit, subnormals and infinities


@pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))
@pytest.mark.parametrize("shape", [(6, 4, 32), (3, 5, 7)], ids=["even", "odd"])
def test_the_kernels_library_packs_4_bit_values_two_a_byte_as_numpy_does(shape):
    values = np.random.default_rng(7).integers(-8, 8, size=shape, dtype=np.int8)
    packed = kernels.pack_nibbles(values)
    assert packed is not None and np.array_equal(packed, gguf_weights.pack_nibbles_numpy(values))
    assert packed[0] & 0x0F == values.flat[0] & 0x0F and packed[0] >> 4 == values.flat[1] & 0x0F  # low nibble first


def test_where_the_kernels_library_does_not_run_numpy_unpacks(monkeypatch):
    monkeypatch.setattr(kernels, "library", lambda: None)
    raw = random_blocks(T.Q4_K, 4, 256, seed=1)
    assert kernels.unpack("Q4_K", raw) is None and kernels.pack_nibbles(raw) is None
    assert np.array_equal(gguf_weights.unpack("Q4_K", raw).q, gguf_weights.unpack_numpy("Q4_K", raw).q)


def test_a_tensor_of_an_unsupported_type_is_refused_by_name():
    with pytest.raises(ValueError, match="Q2_K is not supported"):
        gguf_weights.unpack("Q2_K", np.zeros((1, 84), dtype=np.uint8))
