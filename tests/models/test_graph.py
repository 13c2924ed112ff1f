"""Graph edits before compiling (specdemo/models/graph.py): fusing the projections that read the same activations computes
exactly what the separate ones did, on an exported model and on compressed weights of every layout specdemo makes."""

import numpy as np
import openvino as ov
import pytest
from openvino import opset13 as ops

from specdemo.models import graph

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "KV_CACHE_PRECISION": "f32"}


def matmuls(model) -> int:
    return sum(op.get_type_name() == "MatMul" for op in model.get_ops())


def stateful_logits(model, ids: list[int]) -> np.ndarray:
    request = ov.Core().compile_model(model, "CPU", EXACT).create_infer_request()
    n = len(ids)
    request.infer({"input_ids": np.array([ids]), "attention_mask": np.ones((1, n), dtype=np.int64),
                   "position_ids": np.arange(n)[None], "beam_idx": np.zeros(1, dtype=np.int32)})
    return request.get_tensor("logits").data[0].copy()


def test_fused_projections_give_the_exported_models_logits_with_fewer_matmuls(tiny_target):
    core = ov.Core()
    plain, fused = (core.read_model(tiny_target / "openvino_model.xml") for _ in range(2))
    removed = graph.fuse_projections(fused)
    layers = 2  # the tiny Qwen2: per layer q, k, v → 1 and gate, up → 1
    assert removed == 3 * layers and matmuls(fused) == matmuls(plain) - removed
    ids = [5, 17, 99, 3, 250, 42, 7, 300, 11]
    np.testing.assert_allclose(stateful_logits(fused, ids), stateful_logits(plain, ids), rtol=1e-5, atol=1e-5)


def compressed(rows: int, columns: int, layout: str, seed: int):
    """A weight's decompression subgraph as specdemo's IRs hold it: per channel u8 with a zero point (NNCF int8), u4
    with a zero point in groups of 32 (NNCF int4), or i8 per channel (gguf-mixed's Q6_K)."""
    rng = np.random.default_rng(seed)
    if layout == "u8 per channel":
        q = ops.convert(ops.constant(rng.integers(0, 256, (rows, columns)).astype(np.uint8), dtype=ov.Type.u8), ov.Type.f16)
        zp = ops.convert(ops.constant(rng.integers(100, 156, (rows, 1)).astype(np.uint8), dtype=ov.Type.u8), ov.Type.f16)
        scaled = ops.multiply(ops.subtract(q, zp), ops.constant(rng.uniform(1e-3, 1e-2, (rows, 1)).astype(np.float16)))
    elif layout == "u4 groups of 32":
        groups = columns // 32
        q = ops.convert(ops.constant(rng.integers(0, 16, (rows, groups, 32)).astype(np.uint8), dtype=ov.Type.u4),
                        ov.Type.f16)
        zp = ops.convert(ops.constant(rng.integers(0, 16, (rows, groups, 1)).astype(np.uint8), dtype=ov.Type.u4),
                         ov.Type.f16)
        grouped = ops.multiply(ops.subtract(q, zp), ops.constant(rng.uniform(1e-3, 1e-2, (rows, groups, 1))
                                                                  .astype(np.float16)))
        scaled = ops.reshape(grouped, ops.constant(np.array([rows, columns], dtype=np.int64)), False)
    else:
        q = ops.convert(ops.constant(rng.integers(-127, 128, (rows, columns)).astype(np.int8), dtype=ov.Type.i8),
                        ov.Type.f16)
        scaled = ops.multiply(q, ops.constant(rng.uniform(1e-3, 1e-2, (rows, 1)).astype(np.float16)))
    return ops.convert(scaled, ov.Type.f32)


@pytest.mark.parametrize("layout", ["u8 per channel", "u4 groups of 32", "i8 per channel"])
def test_fusing_compressed_weights_with_biases_changes_nothing_but_the_node_count(layout):
    columns, rows = 64, (48, 16, 16)  # q, k, v of a tiny layer
    x = ops.parameter([1, -1, columns], np.float32, name="x")
    rng = np.random.default_rng(9)
    outputs = []
    for i, r in enumerate(rows):
        y = ops.matmul(x, compressed(r, columns, layout, seed=i), False, True)
        outputs.append(ops.add(y, ops.constant(rng.normal(size=r).astype(np.float32))))
    outputs.append(ops.matmul(x, compressed(24, columns, "i8 per channel" if layout != "i8 per channel" else
                                            "u8 per channel", seed=7), False, True))  # another layout: left alone
    plain, fused = ov.Model(outputs, [x]), ov.Model(outputs, [x]).clone()
    assert graph.fuse_projections(fused) == 2
    inputs = rng.normal(size=(1, 5, columns)).astype(np.float32)
    ours, theirs = (ov.Core().compile_model(m, "CPU", EXACT)(inputs) for m in (fused, plain))
    for i in range(len(outputs)):
        np.testing.assert_allclose(ours[i], theirs[i], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["int8", "gguf"])
def test_every_edit_finds_its_nodes_on_a_graph_built_from_a_gguf(tmp_path, precision):
    from specdemo.models import export
    from specdemo.models.gguf_file import GGUFFile
    from tests import tiny_gguf

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "llama")  # an LM head of its own
    export.from_gguf(GGUFFile(gguf), precision, tmp_path / "ir", lambda fraction, message: None)
    core = ov.Core()
    plain, edited = (core.read_model(tmp_path / "ir" / "openvino_model.xml") for _ in range(2))
    kept = np.array([3, 17, 99, 250])
    assert graph.trim_lm_head(edited, kept)
    assert graph.keep_only_last_logits(edited)
    assert graph.fuse_projections(edited) == 3 * tiny_gguf.LAYERS  # per layer q, k, v → 1 and gate, up → 1
    ids = [5, 17, 99, 3, 250, 42, 7]
    request = core.compile_model(edited, "CPU", EXACT).create_infer_request()
    request.infer({"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
                   "position_ids": np.arange(len(ids))[None], "beam_idx": np.zeros(1, dtype=np.int32),
                   "logits_to_keep": np.array([1])})
    np.testing.assert_allclose(request.get_tensor("logits").data[0, -1], stateful_logits(plain, ids)[-1, kept],
                               rtol=1e-5, atol=1e-5)
