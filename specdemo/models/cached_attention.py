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
    """The stand-in the small IR is written with: q (1, L, heads, d), k and v (1, L, kv_heads, d), positions (1, L) i64
    → (1, L, heads·d); frequencies: the rotary embedding's, d/2 f32 as "f,f,…" where the op applies it ("": q and k come
    rotated)."""

    class_type_info = ov.DiscreteTypeInfo(TYPE, "specdemo")

    def __init__(self, inputs=None, scale: float = 1.0, frequencies: str = ""):
        super().__init__(self, inputs)
        self._scale = scale
        self._frequencies = frequencies

    def validate_and_infer_types(self):
        q = self.get_input_partial_shape(0)  # (1, L, heads, d), heads and d static
        self.set_output_type(0, ov.Type.f32, ov.PartialShape([q[0], q[1], q[2].get_length() * q[3].get_length()]))

    def clone_with_new_inputs(self, new_inputs):
        return CachedAttention(new_inputs, self._scale, self._frequencies)

    def visit_attributes(self, visitor):
        visitor.on_attributes({"scale": self._scale, "frequencies": self._frequencies})
        return True

    def get_type_info(self):
        return CachedAttention.class_type_info


def _small_ir(core: ov.Core, count: int, heads: int, kv_heads: int, head_dim: int, scale: float,
              frequencies: np.ndarray | None) -> ov.Model:
    """A model of `count` CachedAttention ops of the extension (the Core must have it added), each on parameters of its
    own (q, k, v, positions) and read by a result of its own; `frequencies`: the rotary embedding's, which they apply."""
    # each f32 as its shortest decimal, which gives it back (the IR writes a list of floats to 6 digits)
    rotary = "" if frequencies is None else ",".join(str(f) for f in np.asarray(frequencies, dtype=np.float32))
    outputs, parameters = [], []
    for _ in range(count):
        q = ops.parameter([1, -1, heads, head_dim], ov.Type.f32)
        k, v = (ops.parameter([1, -1, kv_heads, head_dim], ov.Type.f32) for _ in range(2))
        positions = ops.parameter([1, -1], ov.Type.i64)
        outputs.append(ops.result(CachedAttention([q.output(0), k.output(0), v.output(0), positions.output(0)], scale, rotary)))
        parameters += [q, k, v, positions]
    with tempfile.TemporaryDirectory(prefix="specdemo-attention-") as folder:
        ov.save_model(ov.Model(outputs, parameters), Path(folder) / "attention.xml")
        return core.read_model(Path(folder) / "attention.xml")


def _made_by(core: ov.Core, count: int, heads: int, kv_heads: int, head_dim: int, scale: float,
             frequencies: np.ndarray | None) -> list[ov.Node]:
    """`count` CachedAttention ops of the extension, their inputs the small IR's parameters until the caller connects
    them."""
    model = _small_ir(core, count, heads, kv_heads, head_dim, scale, frequencies)
    return [result.input_value(0).get_node() for result in model.get_results()]


def compiled(core: ov.Core, heads: int, kv_heads: int, head_dim: int, threads: int = 2,
             frequencies: np.ndarray | None = None) -> ov.CompiledModel:
    """One CachedAttention alone on the CPU plugin, its inputs the model's (q, k, v, positions) and its scale 1/√head_dim
    (`frequencies`: the rotary embedding's, applied by the op): what the tests and the check at load call it through.
    Its cache lives as long as the compiled model."""
    model = _small_ir(core, 1, heads, kv_heads, head_dim, 1 / head_dim ** 0.5, frequencies)
    return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})


def own_attention(model: ov.Model, core: ov.Core) -> int:
    """Replace every attention of the graph gguf_graph builds (SDPA over Concat(Gather(ReadValue), new), the key-value
    heads repeated, its output transposed and reshaped to (1, L, heads·d), the Concat stored by an Assign) by a
    CachedAttention of the extension (`core` has it) over the new q, k, v before their Transposes (and before the
    rotary embedding, which it then applies) and their positions, and drop the states.
    All or nothing: returns the layers replaced, 0 where any attention is not that pattern (the model is untouched)."""
    found = [_attention_parts(op) for op in model.get_ordered_ops() if op.get_type_name() == "ScaledDotProductAttention"]
    positions = next((p.output(0) for p in model.get_parameters() if "position_ids" in p.output(0).get_names()), None)
    if not found or None in found or positions is None:
        return 0
    q_shape, k_shape = found[0]["q"].get_partial_shape(), found[0]["k"].get_partial_shape()
    # every layer's q and k are gguf_graph's rotate-half at the same angles, which the op applies itself
    unrotated = [(_unrotated(parts["q"]), _unrotated(parts["k"])) for parts in found]
    if not all(q and k for q, k in unrotated):
        return 0
    frequencies = unrotated[0][0][1]
    if not all(np.array_equal(q[1], frequencies) and np.array_equal(k[1], frequencies) for q, k in unrotated):
        return 0
    # the op reads q, k and v as the projections lay them out, (1, L, heads, d): the inputs of their Transposes
    sources = [[_untransposed(q[0]), _untransposed(k[0]), _untransposed(parts["v"])]
               for parts, (q, k) in zip(found, unrotated)]
    if any(None in inputs for inputs in sources):
        return 0
    made = _made_by(core, len(found), q_shape[1].get_length(), k_shape[1].get_length(), q_shape[3].get_length(),
                    found[0]["scale"], frequencies)
    stored = {}  # the Assigns of the caches: node name → variable id
    for parts, op, inputs in zip(found, made, sources):
        for i, source in enumerate(inputs + [positions]):
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


def _unrotated(output: ov.Output) -> tuple[ov.Output, np.ndarray] | None:
    """(x, the angles' frequencies (d/2) f32) where `output` is gguf_graph._rotate(x, cos, sin) of its _rotary angles:
    x·cos + concat(−x₂, x₁)·sin, cos and sin of concat(a, a), a = the frequencies (1, d/2, 1) times the positions by a
    MatMul; None where it is not."""
    add = output.get_node()
    if add.get_type_name() != "Add":
        return None
    straight, turned = (add.input_value(i).get_node() for i in (0, 1))
    if straight.get_type_name() != "Multiply" or turned.get_type_name() != "Multiply":
        return None
    x, cos = straight.input_value(0), straight.input_value(1).get_node()
    halves = turned.input_value(0).get_node()
    if halves.get_type_name() != "Concat" or halves.get_input_size() != 2 or cos.get_type_name() != "Unsqueeze":
        return None
    negated, first = (halves.input_value(i).get_node() for i in (0, 1))
    if negated.get_type_name() != "Multiply" or _sliced(negated) != x or _sliced(first) != x:
        return None
    node = cos.input_value(0).get_node()  # Cos(Concat(a, a)), a = Transpose(MatMul(frequencies, positions))
    for kind in ("Cos", "Concat", "Transpose"):
        if node.get_type_name() != kind:
            return None
        node = node.input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        return None
    constant = through_converts(node.input_value(0).get_node())
    if constant.get_type_name() != "Constant":
        return None
    frequencies = constant.get_data().astype(np.float32).reshape(-1)
    return (x, frequencies) if 2 * frequencies.size == x.get_partial_shape()[3].get_length() else None


def _untransposed(output: ov.Output) -> ov.Output | None:
    """The (1, L, heads, d) whose Transpose to (1, heads, L, d) `output` is; None where it is not one."""
    node = output.get_node()
    if node.get_type_name() != "Transpose":
        return None
    order = through_converts(node.input_value(1).get_node())
    if order.get_type_name() != "Constant" or order.get_data().tolist() != [0, 2, 1, 3]:
        return None
    return node.input_value(0)


def _sliced(node) -> ov.Output | None:
    """What the Slice `node` (or the Slice a Multiply of it by a constant multiplies) slices."""
    node = node.input_value(0).get_node() if node.get_type_name() == "Multiply" else node
    return node.input_value(0) if node.get_type_name() == "Slice" else None


def by_position(x: np.ndarray) -> np.ndarray:
    """x (heads, L, d) as the op takes it, (1, L, heads, d)."""
    return np.ascontiguousarray(x.transpose(1, 0, 2))[None]


def rotated(x: np.ndarray, past: int, frequencies: np.ndarray) -> np.ndarray:
    """x (heads, L, d) at positions past … past + L − 1 with the rotary embedding applied as the graph applies it
    (gguf_graph._rotate, its angles in f32), in f32."""
    angles = np.arange(past, past + x.shape[1], dtype=np.float32)[:, None] * frequencies.astype(np.float32)  # (L, d/2)
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = np.split(x, 2, axis=-1)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


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
    draft's heads (14 over 2 of 64) and rotary embedding, CHECKED_CALLS rows in turn over the cache they fill, within
    TOLERANCE."""
    heads, kv_heads, d = 14, 2, 64
    frequencies = (1.0 / 1e6 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    op = compiled(core, heads, kv_heads, d, frequencies=frequencies)
    rng = np.random.default_rng(59)
    total = sum(CHECKED_CALLS)
    q = rng.standard_normal((heads, total, d), dtype=np.float32) * 2
    k, v = (rng.standard_normal((kv_heads, total, d), dtype=np.float32) for _ in range(2))
    end = 0
    for rows in CHECKED_CALLS:
        start, end = end, end + rows
        positions = np.arange(start, end, dtype=np.int64)[None]
        got = op([by_position(x[:, start:end]) for x in (q, k, v)] + [positions])[0]
        want = reference(rotated(q[:, start:end], start, frequencies), rotated(k[:, :end], 0, frequencies), v[:, :end])
        off = float(np.abs(got[0] - want).max())
        if not off <= TOLERANCE:
            return f"for attention ({rows} query row{'s' * (rows > 1)}: off by {off:.3g})"
    return None
