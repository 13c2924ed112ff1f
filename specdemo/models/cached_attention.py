"""The CachedAttention op (kernels/src/attention.hpp says what it computes) as a loaded graph gets it: `own_attention`
puts one in each layer in place of the plugin's stateful SDPA (runtime.OVModel, on a model of specdemo's kernels). The
extension's op can only be made by a Core that reads it, so `_small_ir` writes an IR of stand-ins (this module's class:
the op's type, attributes and shapes, no evaluate) and reads it back with the extension: its ops are the C++ ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.models.graph import through_converts

TYPE = "CachedAttention"


class CachedAttention(ov.Op):
    """The stand-in the small IR is written with: q (1, heads, L, d), k and v (1, kv_heads, L, d), positions (1, L) i64
    → (1, L, heads·d)."""

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


def _small_ir(core: ov.Core, count: int, heads: int, kv_heads: int, head_dim: int, scale: float) -> ov.Model:
    """A model of `count` CachedAttention ops of the extension (the Core must have it added), each on parameters of its
    own (q, k, v, positions) and read by a result of its own."""
    outputs, parameters = [], []
    for _ in range(count):
        q = ops.parameter([1, heads, -1, head_dim], ov.Type.f32)
        k, v = (ops.parameter([1, kv_heads, -1, head_dim], ov.Type.f32) for _ in range(2))
        positions = ops.parameter([1, -1], ov.Type.i64)
        outputs.append(ops.result(CachedAttention([q.output(0), k.output(0), v.output(0), positions.output(0)], scale)))
        parameters += [q, k, v, positions]
    with tempfile.TemporaryDirectory(prefix="specdemo-attention-") as folder:
        ov.save_model(ov.Model(outputs, parameters), Path(folder) / "attention.xml")
        return core.read_model(Path(folder) / "attention.xml")


def _made_by(core: ov.Core, count: int, heads: int, kv_heads: int, head_dim: int, scale: float) -> list[ov.Node]:
    """`count` CachedAttention ops of the extension, their inputs the small IR's parameters until the caller connects
    them."""
    model = _small_ir(core, count, heads, kv_heads, head_dim, scale)
    return [result.input_value(0).get_node() for result in model.get_results()]


def compiled(core: ov.Core, heads: int, kv_heads: int, head_dim: int, threads: int = 2) -> ov.CompiledModel:
    """One CachedAttention alone on the CPU plugin, its inputs the model's (q, k, v, positions) and its scale 1/√head_dim:
    what the tests and the check at load call it through. Its cache lives as long as the compiled model."""
    model = _small_ir(core, 1, heads, kv_heads, head_dim, 1 / head_dim ** 0.5)
    return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})


def own_attention(model: ov.Model, core: ov.Core) -> int:
    """Replace every attention of the graph gguf_graph builds (SDPA over Concat(Gather(ReadValue), new), the key-value
    heads repeated, its output transposed and reshaped to (1, L, heads·d), the Concat stored by an Assign) by a
    CachedAttention of the extension (`core` has it) over the new q, k, v and their positions, and drop the states.
    All or nothing: returns the layers replaced, 0 where any attention is not that pattern (the model is untouched)."""
    found = [_attention_parts(op) for op in model.get_ordered_ops() if op.get_type_name() == "ScaledDotProductAttention"]
    positions = next((p.output(0) for p in model.get_parameters() if "position_ids" in p.output(0).get_names()), None)
    if not found or None in found or positions is None:
        return 0
    q_shape, k_shape = found[0]["q"].get_partial_shape(), found[0]["k"].get_partial_shape()
    made = _made_by(core, len(found), q_shape[1].get_length(), k_shape[1].get_length(),
                                    q_shape[3].get_length(), found[0]["scale"])
    stored = {}  # the Assigns of the caches: node name → variable id
    for parts, op in zip(found, made):
        for i, source in enumerate((parts["q"], parts["k"], parts["v"], positions)):
            op.input(i).replace_source_output(source)
        name = parts["sdpa"].get_friendly_name()
        op.set_friendly_name(name.replace("ScaledDotProductAttention", TYPE))
        op.validate_and_infer_types()
        parts["merged"].output(0).replace(op.output(0))
        stored |= parts["assigns"]
    for sink in [s for s in model.get_sinks() if s.get_name() in stored]:
        model.remove_sink(sink)
    for variable in [v for v in model.get_variables() if v.info.variable_id in stored.values()]:
        model.remove_variable(variable)
    model.validate_nodes_and_infer_types()
    return len(found)


def _attention_parts(sdpa) -> dict | None:
    """An SDPA's new q, k and v, its scale, the Reshape merging its heads and the Assigns of its cache (node name →
    variable id), or None where the graph around it is not gguf_graph's."""
    if sdpa.get_input_size() < 5 or through_converts(sdpa.input_value(4).get_node()).get_type_name() != "Constant":
        return None
    news, assigns = [], {}
    for i in (1, 2):
        concat = _unrepeated(sdpa.input_value(i).get_node())
        if concat.get_type_name() != "Concat" or concat.get_input_size() != 2:
            return None
        past = concat.input_value(0).get_node()
        past = past.input_value(0).get_node() if past.get_type_name() == "Gather" else past
        readers = [r.get_node() for r in concat.output(0).get_target_inputs()]
        stores = [r for r in readers if r.get_type_name() == "Assign"]
        if past.get_type_name() != "ReadValue" or len(stores) != 1 or len(readers) != 2:
            return None
        news.append(concat.input_value(1))
        assigns[stores[0].get_name()] = stores[0].get_variable_id()
    transposes = [r.get_node() for r in sdpa.output(0).get_target_inputs()]
    if len(transposes) != 1 or transposes[0].get_type_name() != "Transpose":
        return None
    merges = [r.get_node() for r in transposes[0].output(0).get_target_inputs()]
    if len(merges) != 1 or merges[0].get_type_name() != "Reshape" or merges[0].get_output_partial_shape(0).rank != 3:
        return None
    scale = float(through_converts(sdpa.input_value(4).get_node()).get_data().reshape(-1)[0])
    return {"sdpa": sdpa, "q": sdpa.input_value(0), "k": news[0], "v": news[1], "scale": scale, "merged": merges[0],
            "assigns": assigns}


def _unrepeated(node):
    """The node whose key-value heads gguf_graph's Unsqueeze, Broadcast, Reshape repeats (`node` where none does)."""
    if node.get_type_name() != "Reshape":
        return node
    broadcast = node.input_value(0).get_node()
    unsqueeze = broadcast.input_value(0).get_node() if broadcast.get_type_name() == "Broadcast" else None
    return unsqueeze.input_value(0).get_node() if unsqueeze and unsqueeze.get_type_name() == "Unsqueeze" else node


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """What CachedAttention computes, in f64: q (heads, L, d) at the last L of keys and values' (kv_heads, T, d)
    positions, each query head on its key-value head, causal → (L, heads·d)."""
    heads, rows, d = q.shape
    group, total = heads // keys.shape[0], keys.shape[1]
    seen = np.arange(total)[None, :] <= np.arange(total - rows, total)[:, None]  # (rows, T): up to the row's own
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
        positions = np.arange(start, end, dtype=np.int64)[None]
        got = op([q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], positions])[0]
        off = float(np.abs(got[0] - reference(q[:, start:end], k[:, :end], v[:, :end])).max())
        if not off <= TOLERANCE:
            return f"for attention ({rows} query row{'s' * (rows > 1)}: off by {off:.3g})"
    return None
