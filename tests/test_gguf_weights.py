"""A GGUF's own blocks as OpenVINO compressed weights (specdemo/gguf_weights.py): on a tiny GGUF written here, for
every quantization type the default pair's files hold, the weights OpenVINO decompresses equal gguf's own
dequantization to f16 rounding, in a MatMul and in the embedding's Gather."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from specdemo import gguf_weights

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


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A GGUF file holding one (ROWS, COLUMNS) tensor of every type, named as a layer's projections are."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "qwen2")
    for i, kind in enumerate(TYPES):
        writer.add_tensor(f"blk.{i}.ffn_up.weight", random_blocks(kind, ROWS, COLUMNS, seed=i), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def close_to_f16(ours: np.ndarray, reference: np.ndarray) -> bool:
    """Equal up to f16 rounding of the block scales: within 2⁻¹⁰ of the tensor's largest weight."""
    return np.abs(ours - reference).max() <= 2.0 ** -10 * np.abs(reference).max()


@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
def test_unpacked_blocks_equal_gguf_dequantization(tiny_gguf, kind):
    tensor = tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"]
    reference = gguf.quants.dequantize(np.asarray(tensor.data), kind).reshape(ROWS, COLUMNS)
    blocks = gguf_weights.unpack(kind.name, np.asarray(tensor.data))
    assert blocks.q.min() >= (-8 if blocks.bits == 4 else -128) and blocks.q.max() <= (7 if blocks.bits == 4 else 127)
    assert close_to_f16(blocks.dequantize(), reference)
    assert not close_to_f16(np.roll(blocks.dequantize(), 1, axis=1), reference)  # the check sees a misplaced weight


def one_layer(op: str):
    """An ov.Model as optimum-intel exports a layer: a MatMul on an f32 weight (transpose_b), or the embedding's
    Gather; named so that gguf_weights maps it to blk.0.ffn_up.weight (or token_embd.weight)."""
    import openvino as ov
    from openvino import opset13 as ops

    weight = ops.constant(np.zeros((ROWS, COLUMNS), dtype=np.float32))
    if op == "MatMul":
        x = ops.parameter([1, -1, COLUMNS], np.float32, name="x")
        node = ops.matmul(x, weight, False, True)
        node.set_friendly_name("__module.model.layers.0.mlp.up_proj/aten::linear/MatMul")
    else:
        x = ops.parameter([1, -1], np.int64, name="ids")
        node = ops.gather(weight, x, ops.constant(np.array(0, dtype=np.int64)))
        node.set_friendly_name("__module.model.embed_tokens/aten::embedding/Gather")
    return ov.Model([node], [x])


@pytest.mark.parametrize("kind", TYPES, ids=[k.name for k in TYPES])
@pytest.mark.parametrize("op", ["MatMul", "Gather"])
def test_openvino_decompresses_the_imported_blocks_to_gguf_dequantization(tiny_gguf, tmp_path, kind, op):
    import openvino as ov

    source = tensors(tiny_gguf)[f"blk.{TYPES.index(kind)}.ffn_up.weight"]
    path = tmp_path / "one.gguf"  # this type alone, under the name the layer maps to
    writer = gguf.GGUFWriter(path, "qwen2")
    name = "blk.0.ffn_up.weight" if op == "MatMul" else "token_embd.weight"
    writer.add_tensor(name, np.asarray(source.data), raw_dtype=kind)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    model = gguf_weights.import_blocks(one_layer(op), path)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    if op == "MatMul":  # the identity's rows pick out the weight's columns: x·Wᵀ = Wᵀ
        ours = compiled(np.eye(COLUMNS, dtype=np.float32)[None])[0][0].T
    else:
        ours = compiled(np.arange(ROWS, dtype=np.int64)[None])[0][0]
    reference = gguf.quants.dequantize(np.asarray(source.data), kind).reshape(ROWS, COLUMNS)
    assert close_to_f16(ours, reference)
    weights = [n for n in model.get_ordered_ops() if n.get_type_name() == "Constant"  # (rows, groups, group size):
               and len(n.get_shape()) == 3 and n.get_shape()[0] == ROWS and n.get_shape()[2] > 1]  # the blocks alone
    assert [w.get_element_type().get_type_name() for w in weights] == ["i4" if kind == T.Q4_K else "i8"]


def test_a_tensor_of_an_unsupported_type_is_refused_by_name():
    with pytest.raises(ValueError, match="Q2_K is not supported"):
        gguf_weights.unpack("Q2_K", np.zeros((1, 84), dtype=np.uint8))
