"""The CachedAttention op (kernels/src/attention.hpp says what it computes) as a loaded graph gets it:
`graph.own_attention` puts one in each layer in place of the plugin's stateful SDPA. The extension's op can only be made by a Core that reads
it, so `made_by` writes a small IR of stand-ins (this module's class: the op's type, attributes and shapes, no
evaluate) and reads it back with the extension: the ops it returns are the C++ ones, their inputs still the small
graph's parameters until the caller connects them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

TYPE = "CachedAttention"


class CachedAttention(ov.Op):
    """The stand-in the small IR is written with: q (1, heads, L, d), k and v (1, kv_heads, L, d), mask (1, T) i64 →
    (1, L, heads·d)."""

    class_type_info = ov.DiscreteTypeInfo(TYPE, "specdemo")

    def __init__(self, inputs=None, scale: float = 1.0):
        super().__init__(self, inputs)
        self._scale = scale

    def validate_and_infer_types(self):
        q = self.get_input_partial_shape(0)  # (1, heads, L, d), heads and d static
        self.set_output_type(0, ov.Type.f32, ov.PartialShape([q[0], q[2], q[1].get_length() * q[3].get_length()]))

    def clone_with_new_inputs(self, new_inputs):
        return CachedAttention(new_inputs, self._scale)

    def visit_attributes(self, visitor):
        visitor.on_attributes({"scale": self._scale})
        return True

    def get_type_info(self):
        return CachedAttention.class_type_info


def made_by(core: ov.Core, count: int, heads: int, kv_heads: int, head_dim: int, scale: float) -> list[ov.Node]:
    """`count` CachedAttention ops of the extension (the Core must have it added), each on parameters of its own."""
    outputs, parameters = [], []
    for _ in range(count):
        q = ops.parameter([1, heads, -1, head_dim], ov.Type.f32)
        k, v = (ops.parameter([1, kv_heads, -1, head_dim], ov.Type.f32) for _ in range(2))
        mask = ops.parameter([1, -1], ov.Type.i64)
        outputs.append(ops.result(CachedAttention([q.output(0), k.output(0), v.output(0), mask.output(0)], scale)))
        parameters += [q, k, v, mask]
    with tempfile.TemporaryDirectory(prefix="specdemo-attention-") as folder:
        ov.save_model(ov.Model(outputs, parameters), Path(folder) / "attention.xml")
        model = core.read_model(Path(folder) / "attention.xml")
    return [result.input_value(0).get_node() for result in model.get_results()]


def compiled(core: ov.Core, heads: int, kv_heads: int, head_dim: int, threads: int = 2) -> ov.CompiledModel:
    """One CachedAttention alone on the CPU plugin, its inputs the model's (q, k, v, mask) and its scale 1/√head_dim:
    what the tests and the bench call it through. Its cache lives as long as the compiled model."""
    (op,) = made_by(core, 1, heads, kv_heads, head_dim, 1 / head_dim ** 0.5)
    parameters = [ops.parameter([1, heads, -1, head_dim], ov.Type.f32),
                  *(ops.parameter([1, kv_heads, -1, head_dim], ov.Type.f32) for _ in range(2)),
                  ops.parameter([1, -1], ov.Type.i64)]
    for i, parameter in enumerate(parameters):
        op.input(i).replace_source_output(parameter.output(0))
    op.validate_and_infer_types()
    return core.compile_model(ov.Model([ops.result(op)], parameters), "CPU", {"INFERENCE_NUM_THREADS": threads})


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """What CachedAttention computes, in f64: q (heads, L, d) at the last L of keys and values' (kv_heads, T, d)
    positions, each query head on its key-value head, causal, positions whose keep is 0 never attended → (L, heads·d)."""
    heads, rows, d = q.shape
    group, total = heads // keys.shape[0], keys.shape[1]
    # (rows, T): row r sees the positions up to its own, total − rows + r, that are kept
    seen = (np.arange(total)[None, :] <= np.arange(total - rows, total)[:, None]) & (keep[None, :total] != 0)
    out = np.zeros((rows, heads, d))
    for head in range(heads):
        k, v = keys[head // group].astype(np.float64), values[head // group].astype(np.float64)
        scores = np.where(seen, q[head].astype(np.float64) @ k.T / np.sqrt(d), -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, head] = p @ v / p.sum(axis=1, keepdims=True)
    return out.reshape(rows, heads * d)


CHECKED_CALLS = (30, 1, 7, 17)  # rows of the calls kernels.check makes, one after the other: a prompt, a step, two
# verifications (a block of rows a task and more)
TOLERANCE = 2e-5  # of f32 sums in another order, on values of about 1


def misfit(core: ov.Core) -> str | None:
    """How the running ISA's CachedAttention is not `reference`, as kernels.check's phrase; None where it is: the
    draft's heads (14 over 2 of 64), CHECKED_CALLS rows in turn over the cache they fill, within TOLERANCE."""
    heads, kv_heads, d = 14, 2, 64
    op = compiled(core, heads, kv_heads, d)
    rng = np.random.default_rng(59)
    total = sum(CHECKED_CALLS)
    q = rng.standard_normal((heads, total, d), dtype=np.float32) * 2
    k, v = (rng.standard_normal((kv_heads, total, d), dtype=np.float32) for _ in range(2))
    end = 0
    for rows in CHECKED_CALLS:
        start, end = end, end + rows
        got = op([q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], np.ones((1, end), np.int64)])[0]
        off = float(np.abs(got[0] - reference(q[:, start:end], k[:, :end], v[:, :end], np.ones(end))).max())
        if not off <= TOLERANCE:
            return f"for attention ({rows} query row{'s' * (rows > 1)}: off by {off:.3g})"
    return None
