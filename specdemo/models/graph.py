"""Edits to an exported model's graph before it is compiled (specdemo/models/runtime.py makes them on every load):

- trim_lm_head: keep only some rows of the LM head (a cheaper draft: specdemo/models/vocab.py); for a head of blocks,
  the rows left out as a model of their own (head_over_rows), fed the head's input (expose_head_input);
- keep_only_last_logits: an input `logits_to_keep`, so a prefill runs the LM head on its last position alone;
- fuse_projections: MatMuls reading the same activations (a layer's q, k and v; its gate and up) become one, their
  compressed weights concatenated row-wise and the output split again; BlockMatMuls of one block type likewise
  (specdemo/models/kernels.py: a GGUF tensor's own blocks, rows of bytes);
- fuse_glu: a fused gate-and-up BlockMatMul whose split feeds Multiply(Swish(gate), up) computes silu(gate)·up itself
  (its epilogue): three nodes a layer fewer.
(cached_attention.own_attention makes one more: each layer's stateful SDPA, its rotary embedding and its Transposes
become specdemo's CachedAttention; and matmul_fusion takes the norms, biases and residuals around each BlockMatMul into
it.)

Why fuse: a decode step of a 1.5B model is ~850 nodes on the CPU plugin, and the calls' wall time exceeds the sum of
the nodes' own times by 4-6 ms (thread hand-offs between nodes on 2 cores; bench --only nodes). The plugin fuses q/k/v
and gate/up itself only on AMX machines; concatenated weights stream the same bytes in fewer, larger kernels.

Every edit works on the decompression subgraphs as exported (a u4/u8/i4/i8 Constant, Convert, [Subtract a zero
point,] Multiply by a scale, [Reshape,] Convert), so the plugin's compressed kernels are kept.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import openvino as ov
from openvino import opset13 as ops

_LOW_BIT = (ov.Type.u4, ov.Type.i4)


BLOCK_MATMUL = "BlockMatMul"  # specdemo's op over a GGUF tensor's own blocks (kernels.py): a row of bytes per output


def lm_head(model: ov.Model):
    """The LM head's MatMul or BlockMatMul (hidden states x vocabulary), or None when the graph hides it."""
    node = model.output("logits").get_node().input_value(0).get_node()  # skip the Result
    while node.get_type_name() not in ("MatMul", BLOCK_MATMUL):
        if node.get_input_size() == 0 or node.get_type_name() not in ("Convert", "Multiply", "Add", "Tanh", "Divide"):
            return None
        node = node.input_value(0).get_node()
    return node


def trim_lm_head(model: ov.Model, ids: np.ndarray) -> bool:
    """Keep only rows `ids` (sorted token ids) of the LM head's weight, so logits score just those tokens.

    The weight reaches the MatMul through its decompression ops (u4/u8 constants, zero points, scales,
    a reshape); the row cut is made on the constants themselves, so the compressed kernels stay and a
    draft step reads only the kept rows. With tied embeddings the embedding lookup keeps the full
    matrix: the cut applies to a copy on the LM head's path only. Returns False, changing nothing,
    when the head or its weight layout (vocabulary rows first, transposed MatMul) is not recognised.
    """
    head = lm_head(model)
    if head is not None and head.get_type_name() == BLOCK_MATMUL:  # its blocks are rows of bytes: take the rows kept
        blocks = head.input_value(1).get_node()
        head.input(1).replace_source_output(_with_rows(blocks, [_rows(blocks)[ids]]).output(0))
        model.validate_nodes_and_infer_types()
        return True
    if head is None or not head.get_attributes().get("transpose_b", False):
        return False
    vocab = head.get_output_partial_shape(0)[-1].get_length()
    try:
        rows = _rebuild(head.input_value(1), lambda node, shape: _with_rows(node, [_rows(node)[ids]])
                        if shape[0] == vocab else None, lambda shape: np.where(shape == vocab, len(ids), shape))
    except ValueError:
        return False
    head.input(1).replace_source_output(rows)
    model.validate_nodes_and_infer_types()
    return True


def lm_head_rows(model: ov.Model) -> np.ndarray | None:
    """A BlockMatMul LM head's rows, (vocabulary, bytes per row) u8, the file's blocks; None for any other head."""
    head = lm_head(model)
    return _rows(head.input_value(1).get_node()) if head is not None and head.get_type_name() == BLOCK_MATMUL else None


def head_over_rows(model: ov.Model, rows: np.ndarray) -> ov.Model:
    """The BlockMatMul LM head of `model` alone over `rows` (from lm_head_rows), reading one position's input (1, 1,
    hidden) from a parameter "hidden": the rows a trimmed head left out, run only when they are wanted
    (split_head.OtherRows). Made from a copy of `model` as it will be compiled, so that it computes what the head
    computes (a norm taken into the head by matmul_fusion included). One position a call, as the drafter asks, its
    shapes fixed so that the plugin has no shape work on our op per call (runtime.OVModel._compile_fixed)."""
    copy = model.clone()
    head = lm_head(copy)
    source = head.input_value(0)
    width = source.get_partial_shape()[-1].get_length()
    hidden = ops.parameter([1, 1, width], source.get_element_type(), name="hidden")
    head.input(0).replace_source_output(hidden.output(0))
    head.input(1).replace_source_output(_with_rows(head.input_value(1).get_node(), [rows]).output(0))
    alone = ov.Model([ops.result(head.output(0))], [hidden], "rest_of_lm_head")
    alone.validate_nodes_and_infer_types()
    return alone


def expose_head_input(model: ov.Model) -> None:
    """A second output "hidden": what the LM head reads, (1, kept positions, hidden), for head_over_rows's model."""
    source = lm_head(model).input_value(0)
    source.get_tensor().add_names({"hidden"})
    model.add_results([ops.result(source)])
    model.validate_nodes_and_infer_types()


def keep_only_last_logits(model: ov.Model) -> bool:
    """Add an input `logits_to_keep` so the LM head runs only on the last positions.

    Why: a 200-token prefill would otherwise multiply 200 hidden states by a 151,936-wide vocabulary
    matrix and copy 120 MB of logits, when decoding needs one row. Returns False, leaving the model
    as it is, when the LM head's MatMul cannot be found.
    """
    node = lm_head(model)
    if node is None:
        return False
    keep = ops.parameter([1], ov.Type.i64, name="logits_to_keep")
    keep.output(0).get_tensor().set_names({"logits_to_keep"})
    hidden = node.input_value(0)  # (1, n, hidden)
    start = ops.negative(keep)
    stop = ops.constant(np.array([np.iinfo(np.int64).max], dtype=np.int64))
    step = ops.constant(np.array([1], dtype=np.int64))
    axes = ops.constant(np.array([1], dtype=np.int64))
    node.input(0).replace_source_output(ops.slice(hidden, start, stop, step, axes).output(0))
    model.add_parameters([keep])
    model.validate_nodes_and_infer_types()
    return True


# ---- fusing projections that read the same activations


def fuse_projections(model: ov.Model) -> int:
    """Fuse every set of transposed MatMuls that read the same activations through weights of the same layout into
    one MatMul on the concatenated weights, followed by a split; a constant bias Add on each is concatenated too.
    Returns how many MatMuls were removed (0: nothing to fuse, the model unchanged)."""
    groups = defaultdict(list)  # (activations, weight layout) -> MatMuls
    for op in model.get_ordered_ops():
        if op.get_type_name() == BLOCK_MATMUL and op.input_value(1).get_node().get_type_name() == "Constant":
            x = op.input_value(0)
            attributes = op.get_attributes()
            key = (x.get_node().get_friendly_name(), x.get_index(), attributes["kind"], attributes["columns"])
            groups[key].append(op)
        elif op.get_type_name() == "MatMul" and op.get_attributes().get("transpose_b") and \
                not op.get_attributes().get("transpose_a"):
            layout = _layout(op.input_value(1))
            if layout is not None:
                x = op.input_value(0)
                groups[(x.get_node().get_friendly_name(), x.get_index(), layout)].append(op)
    removed = 0
    for matmuls in groups.values():
        if len(matmuls) > 1:
            _fuse(matmuls)
            removed += len(matmuls) - 1
    if removed:
        model.validate_nodes_and_infer_types()
    return removed


def fuse_glu(model: ov.Model) -> int:
    """Give every BlockMatMul of a layer's gate and up rows (fuse_projections) the epilogue "swiglu" where its split's
    first part feeds only a Swish, and that Swish and the second part only one Multiply: the Multiply's readers then
    read the BlockMatMul, which computes silu(gate)·up as it writes (kernels/src/block_matmul.cpp). Why: the split, the
    Swish and the Multiply were 3 of a layer's ~22 nodes, each a hand-off between the plugin's threads; at 5 rows they
    took 3-4 % of a step of the 1.5B target on the Zen 3 (PERF_COUNT). Returns how many were fused."""
    fused = 0
    for split in [op for op in model.get_ordered_ops() if op.get_type_name() == "VariadicSplit"]:
        matmul, multiply = split.input_value(0).get_node(), _swiglu_of(split)
        if matmul.get_type_name() != BLOCK_MATMUL or multiply is None or matmul.get_attributes().get("epilogue"):
            continue
        if len(matmul.output(0).get_target_inputs()) != 1:
            continue
        matmul.set_attribute("epilogue", "swiglu")
        matmul.validate_and_infer_types()
        for reader in list(multiply.output(0).get_target_inputs()):
            reader.replace_source_output(matmul.output(0))
        fused += 1
    if fused:
        model.validate_nodes_and_infer_types()
    return fused


def _swiglu_of(split):
    """The Multiply(Swish(first part), second part) a two-way split of equal parts on its last axis feeds alone, or
    None."""
    axis = split.input_value(1).get_node()
    rank = split.get_input_partial_shape(0).rank
    if split.get_output_size() != 2 or axis.get_type_name() != "Constant" or rank.is_dynamic:
        return None
    if int(axis.get_data().reshape(-1)[0]) % rank.get_length() != rank.get_length() - 1:
        return None
    if split.get_output_partial_shape(0)[-1].is_dynamic or \
            split.get_output_partial_shape(0)[-1] != split.get_output_partial_shape(1)[-1]:
        return None
    gate, up = ([r.get_node() for r in split.output(i).get_target_inputs()] for i in (0, 1))
    if len(gate) != 1 or len(up) != 1 or gate[0].get_type_name() != "Swish" or not _beta_is_one(gate[0]):
        return None
    readers = [r.get_node() for r in gate[0].output(0).get_target_inputs()]
    if len(readers) != 1 or readers[0].get_type_name() != "Multiply" or up[0].get_name() != readers[0].get_name():
        return None
    return readers[0]


def _beta_is_one(swish) -> bool:
    """Whether a Swish is x·sigmoid(x): no β input, or a constant β of 1 (what the exports write for SiLU)."""
    if swish.get_input_size() == 1:
        return True
    beta = through_converts(swish.input_value(1).get_node())  # a β saved in f16
    return beta.get_type_name() == "Constant" and bool(np.all(beta.get_data() == 1))


def through_converts(node):
    """The node a chain of Converts starts from (`node` itself when it is none)."""
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node


def _layout(output: ov.Output):
    """A weight's decompression subgraph as a hashable description (node types, element types, every shape but the
    rows), or None when it is not one fuse_projections can concatenate (an f32 weight, a computed shape)."""
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        shape = list(node.get_output_shape(0))
        if len(shape) < 2 or node.get_element_type() not in (*_LOW_BIT, ov.Type.u8, ov.Type.i8, ov.Type.f16,
                                                               ov.Type.bf16, ov.Type.f32):
            return None
        return (kind, node.get_element_type().get_type_name(), tuple(shape[1:]))
    if kind not in ("Convert", "Subtract", "Multiply", "Reshape"):
        return None
    if kind == "Reshape" and node.input_value(1).get_node().get_type_name() != "Constant":
        return None
    inputs = [_layout(node.input_value(0))] + [_layout(node.input_value(i)) if kind != "Reshape" else
                                               ("shape", len(node.get_output_shape(0)))
                                               for i in range(1, node.get_input_size())]
    if any(i is None for i in inputs):
        return None
    return (kind, node.get_output_element_type(0).get_type_name(), tuple(inputs))


def _fuse(matmuls: list) -> None:
    """MatMul(x, W_i) for each i → Split(MatMul(x, concat_i W_i)), bias Adds likewise concatenated. BlockMatMuls: the
    first one takes every row (an op of the extension cannot be made here, only rewired), the others are left unread."""
    rows = [m.get_input_partial_shape(1).to_shape()[0] for m in matmuls]
    weight = _concat_rows([m.input_value(1) for m in matmuls], rows)
    biases = [_bias_of(m) for m in matmuls]
    ends = [add for _, add in biases] if all(b is not None for b in biases) else list(matmuls)
    readers = [list(end.output(0).get_target_inputs()) for end in ends]  # before the fused node gains its own
    # Named after the first projection, so a profile of the compiled model (bench/nodes.py) finds them again.
    name = matmuls[0].get_friendly_name() + "/fused"
    if matmuls[0].get_type_name() == BLOCK_MATMUL:
        fused = matmuls[0]
        fused.input(1).replace_source_output(weight)
        fused.validate_and_infer_types()
    else:
        fused = ops.matmul(matmuls[0].input_value(0), weight, False, True)
    fused.set_friendly_name(name)
    if all(b is not None for b in biases):
        fused = ops.add(fused, ops.constant(np.concatenate([b.get_data().reshape(-1) for b, _ in biases])
                                            .astype(biases[0][0].get_data().dtype)))
        fused.set_friendly_name(name + "/bias")
    parts = ops.variadic_split(fused, ops.constant(np.array(-1, dtype=np.int64)),
                               ops.constant(np.array(rows, dtype=np.int64)))
    parts.set_friendly_name(name + "/split")
    for i, consumers in enumerate(readers):
        for consumer in consumers:
            consumer.replace_source_output(parts.output(i))


def _bias_of(matmul):
    """(the bias Constant, its Add) when the MatMul's only consumer adds a constant vector, else None."""
    consumers = list(matmul.output(0).get_target_inputs())
    if len(consumers) != 1 or consumers[0].get_node().get_type_name() != "Add":
        return None
    add = consumers[0].get_node()
    other = through_converts(add.input_value(1 - consumers[0].get_index()).get_node())
    if other.get_type_name() != "Constant" or other.get_element_type() != ov.Type.f32:
        return None
    if int(np.prod(other.get_output_shape(0))) != matmul.get_output_partial_shape(0)[-1].get_length():
        return None
    return other, add


def _concat_rows(outputs: list, rows: list[int]) -> ov.Output:
    """One copy of the (identically laid out) weight subgraphs `outputs`, their rows (axis 0: `rows` each)
    concatenated."""
    return _rebuild_many(outputs, rows, sum(rows))


def _rebuild_many(outputs: list, rows: list[int], total: int) -> ov.Output:
    nodes = [o.get_node() for o in outputs]
    kind = nodes[0].get_type_name()
    if kind == "Constant":
        shapes = [list(n.get_output_shape(0)) for n in nodes]
        if all(s[0] == r for s, r in zip(shapes, rows)):
            return _with_rows(nodes[0], [_rows(n) for n in nodes]).output(0)
        values = [_values(n) for n in nodes]
        if all(s[0] == 1 for s in shapes) and all(np.array_equal(v, values[0]) for v in values):
            return outputs[0]  # broadcast along the rows, the same in every branch: shared as it is
        values = [v if s[0] == r else np.broadcast_to(v, (r, *s[1:])) for v, s, r in zip(values, shapes, rows)]
        return ops.constant(np.concatenate(values, axis=0), dtype=nodes[0].get_element_type()).output(0)
    if kind == "Reshape":
        shape = nodes[0].input_value(1).get_node().get_data().copy()
        shape[0] = total
        return ops.reshape(_rebuild_many([n.input_value(0) for n in nodes], rows, total), ops.constant(shape),
                           False).output(0)
    inputs = [_rebuild_many([n.input_value(i) for n in nodes], rows, total) for i in range(nodes[0].get_input_size())]
    return _same_op(nodes[0], inputs)


def _rebuild(output: ov.Output, constant_rows, reshape_shape) -> ov.Output:
    """A copy of the subgraph producing `output`: each Constant replaced by constant_rows(node, shape) (None: shared
    as it is), each Reshape's target by reshape_shape(shape)."""
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        shape = list(node.get_output_shape(0))
        rebuilt = constant_rows(node, shape) if shape else None
        return output if rebuilt is None else rebuilt.output(0)
    if kind == "Reshape":
        target = node.input_value(1).get_node()
        if target.get_type_name() != "Constant":
            raise ValueError("a reshape with a computed shape")
        shape = reshape_shape(target.get_data().copy())
        return ops.reshape(_rebuild(node.input_value(0), constant_rows, reshape_shape), ops.constant(shape),
                           False).output(0)
    return _same_op(node, [_rebuild(node.input_value(i), constant_rows, reshape_shape)
                           for i in range(node.get_input_size())])


def _same_op(node, inputs: list) -> ov.Output:
    """A new node of `node`'s kind (Convert, Subtract or Multiply) on `inputs`."""
    kind = node.get_type_name()
    if kind == "Convert":
        return ops.convert(inputs[0], node.get_output_element_type(0)).output(0)
    if kind == "Subtract":
        return ops.subtract(*inputs).output(0)
    if kind == "Multiply":
        return ops.multiply(*inputs).output(0)
    raise ValueError(f"an unexpected {kind} on a weight's decompression path")


def _rows(node) -> np.ndarray:
    """A Constant's data as (rows, per row): values, or for 4-bit types the packed bytes of each row where every row
    fills whole bytes (which is why rows can be picked and joined without unpacking; else the unpacked values)."""
    shape = list(node.get_output_shape(0))
    per_row = int(np.prod(shape[1:]))
    if node.get_element_type() in _LOW_BIT and per_row % 2 == 0:
        return node.get_data().view(np.uint8).reshape(shape[0], per_row // 2)
    return _values(node).reshape(shape[0], per_row)


def _with_rows(node, parts: list[np.ndarray]):
    """A Constant of `node`'s element type and shape but for its rows: `parts` (from _rows) stacked."""
    data = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    shape = [data.shape[0], *node.get_output_shape(0)[1:]]
    element = node.get_element_type()
    if element in _LOW_BIT and data.dtype == np.uint8 and data.shape[1] * 2 == int(np.prod(shape[1:])):
        tensor = ov.Tensor(element, ov.Shape(shape))  # packed bytes copied as they are: no repacking
        tensor.data[:] = data.reshape(-1)
        return ov.op.Constant(tensor)
    return ops.constant(np.ascontiguousarray(data).reshape(shape), dtype=element)


def _values(node) -> np.ndarray:
    """A Constant's values in its own shape, 4-bit ones unpacked (OpenVINO packs two a byte, low nibble first; i4
    values come back signed)."""
    element = node.get_element_type()
    shape = list(node.get_output_shape(0))
    data = node.get_data()
    if element not in _LOW_BIT:
        return data
    packed = data.reshape(-1)
    values = np.empty(packed.size * 2, dtype=np.uint8)
    values[0::2], values[1::2] = packed & 0x0F, packed >> 4
    values = values[: int(np.prod(shape))].reshape(shape)
    if element == ov.Type.i4:
        values = values.astype(np.int8)
        values[values > 7] -= 16
    return values
