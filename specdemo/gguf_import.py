"""Putting a GGUF file's own blocks (specdemo/gguf_weights.py) into an exported OpenVINO model, in place of the
weights optimum-intel exported from transformers' dequantization of the same file.

Every replaced weight goes in as the pattern the CPU plugin fuses into its compressed FullyConnected (or Gather): a
low-bit Constant, Convert, [Subtract a zero point,] Multiply by an f16 scale per group, Reshape, Convert to f32. Before
a tensor is replaced, a sample of its rows is checked against the exported weight it replaces: a file whose rows are
in another order than the export's (llama.cpp permutes attn_q / attn_k of Llama-architecture files, undone here as
transformers undoes it) would otherwise compile into a model that is silently wrong, and a fidelity reference built
from the same import could not see it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from specdemo.gguf_weights import SUPPORTED, Blocks, lay_out, unpack, unpermute_rows

# Which GGUF tensor a node of optimum-intel's Qwen2/Llama export reads: its MatMuls and its embedding Gather, by name.
_LAYER = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\b")
_GGUF_NAME = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
              "down": "ffn_down"}
PERMUTED = ("llama",)  # architectures whose attn_q / attn_k rows llama.cpp permutes (and transformers restores)
CHECKED_ROWS = 24  # rows of each tensor compared with the export: a misplaced row differs by the weights' own size
TOLERANCE = 2.0 ** -8  # of the sampled rows' largest weight: f16 rounding of scales (ours) and of the export's weights


class GGUFMismatchError(ValueError):
    """The GGUF's blocks do not match the exported model (another row order, another tensor)."""


def tensor_for(node_name: str, op_type: str, names: set[str]) -> str | None:
    """The GGUF tensor behind an IR node: a layer's projection, the LM head (output.weight, else the tied embedding)
    or the embedding; None for anything else."""
    if op_type == "Gather" and "embed_tokens" in node_name:
        return "token_embd.weight"
    if op_type != "MatMul":
        return None
    if "lm_head" in node_name:
        return "output.weight" if "output.weight" in names else "token_embd.weight"
    match = _LAYER.search(node_name)
    return f"blk.{match.group(1)}.{_GGUF_NAME[match.group(2)]}.weight" if match else None


def weight_node(blocks: Blocks):
    """The decompression subgraph of `blocks` without its offset: (rows, columns) f32."""
    import openvino as ov
    from openvino import opset13 as ops

    rows, groups, size = blocks.q.shape
    signed = blocks.zero_point is None
    element = {(4, True): ov.Type.i4, (4, False): ov.Type.u4, (8, True): ov.Type.i8, (8, False): ov.Type.u8}
    if groups == 1:  # one scale a row: the per-channel pattern, no grouping reshape
        q, scale = blocks.q[:, 0, :], blocks.scale
        zero_point = None if signed else blocks.zero_point
    else:
        q, scale = blocks.q, blocks.scale[..., None]
        zero_point = None if signed else blocks.zero_point[..., None]
    weight = ops.convert(ops.constant(q, dtype=element[blocks.bits, signed]), ov.Type.f16)
    if zero_point is not None:
        weight = ops.subtract(weight, ops.convert(ops.constant(zero_point, dtype=element[blocks.bits, False]), ov.Type.f16))
    scaled = ops.multiply(weight, ops.constant(scale))
    if groups > 1:
        scaled = ops.reshape(scaled, ops.constant(np.array([rows, groups * size], dtype=np.int64)), False)
    return ops.convert(scaled, ov.Type.f32)


def import_blocks(model, gguf_path: Path, layout: str = "exact", log=lambda message: None):
    """Replace the weights of `model` (an ov.Model exported from the GGUF's dequantized weights) with the GGUF's own
    blocks laid out as `layout` says (gguf_weights.LAYOUTS), in place; returns the model. Tensors of other types (F32
    norms and biases) stay as exported. Raises GGUFMismatchError when a tensor's rows do not match the export's."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    heads = _head_counts(reader)
    sums = {}  # activations' group sums, shared by the MatMuls reading the same input (q, k, v; gate, up)
    replaced = 0
    for op in list(model.get_ordered_ops()):
        name = tensor_for(op.get_friendly_name(), op.get_type_name(), set(tensors))
        tensor = tensors.get(name) if name else None
        if tensor is None or tensor.tensor_type.name not in SUPPORTED:
            continue
        kind = tensor.tensor_type.name
        blocks = unpack(kind, np.asarray(tensor.data))
        if heads and name.endswith((".attn_q.weight", ".attn_k.weight")):
            blocks = unpermute_rows(blocks, heads["q" if ".attn_q." in name else "k"])
        _check_against_export(op, name, blocks, gguf_path.name)
        blocks = lay_out(blocks, kind, name, layout)
        if op.get_type_name() == "MatMul":
            _replace_matmul_weight(op, blocks, sums)
        else:
            _replace_embedding(op, blocks)
        replaced += 1
    if not replaced:
        raise ValueError(f"{gguf_path.name}: no quantized tensor of it matched the exported model's layers")
    log(f"{replaced} weights taken block for block from {gguf_path.name} ({layout} layout)")
    model.validate_nodes_and_infer_types()
    return model


def _head_counts(reader) -> dict[str, int]:
    """{"q": heads, "k": key-value heads} for an architecture whose q/k rows llama.cpp permutes, else {}."""
    def field(key: str):
        value = reader.fields.get(key)
        return None if value is None else value.parts[value.data[0]]

    architecture = field("general.architecture")
    architecture = bytes(architecture).decode() if architecture is not None else ""
    if architecture not in PERMUTED:
        return {}
    heads, kv_heads = field(f"{architecture}.attention.head_count"), field(f"{architecture}.attention.head_count_kv")
    if heads is None:
        raise ValueError(f"{architecture} GGUF without {architecture}.attention.head_count: its q/k rows cannot be restored")
    heads = int(heads[0])
    return {"q": heads, "k": int(kv_heads[0]) if kv_heads is not None else heads}


def _check_against_export(op, name: str, blocks: Blocks, file: str) -> None:
    """Raise GGUFMismatchError unless a sample of `blocks`' rows dequantizes to the exported weight `op` reads (skipped
    when the export's weight is not a plain constant of the same shape)."""
    exported = _exported_weight(op)
    rows = blocks.q.shape[0]
    if exported is None or exported.shape != (rows, blocks.q.shape[1] * blocks.q.shape[2]):
        return
    sample = np.unique(np.linspace(0, rows - 1, min(rows, CHECKED_ROWS)).astype(np.int64))
    ours, theirs = blocks.take_rows(sample).dequantize(), np.asarray(exported[sample], dtype=np.float32)
    if np.abs(ours - theirs).max() > TOLERANCE * max(float(np.abs(theirs).max()), 1e-30):
        raise GGUFMismatchError(f"{file}: the blocks of {name} do not match the exported model's weights (another row order "
                           "or tensor); this GGUF's architecture is not one specdemo can take block for block, so "
                           "choose another precision (int8, int4, fp16)")


def _exported_weight(op) -> np.ndarray | None:
    """The exported weight constant `op` reads ((rows, columns): a MatMul's second input, a Gather's first), through
    its Converts; None when something else produces it."""
    node = op.input_value(1 if op.get_type_name() == "MatMul" else 0).get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant" or node.get_element_type().get_type_name() not in ("f32", "f16", "bf16"):
        return None
    return node.get_data()


def _replace_matmul_weight(matmul, blocks: Blocks, sums: dict) -> None:
    """MatMul(x, W, transpose_b) → MatMul(x, W_blocks) [+ group sums of x · offsetᵀ]."""
    import openvino as ov
    from openvino import opset13 as ops

    rows, groups, size = blocks.q.shape
    if not matmul.get_transpose_b() or list(matmul.get_input_partial_shape(1).to_shape()) != [rows, groups * size]:
        raise ValueError(f"{matmul.get_friendly_name()}: its weight is not (rows, columns) = ({rows}, {groups * size})")
    matmul.input(1).replace_source_output(weight_node(blocks).output(0))
    if blocks.offset is None:
        return
    x = matmul.input_value(0)
    key = (x.get_node().get_friendly_name(), x.get_index(), groups)
    if key not in sums:  # (…, columns) → (…, groups, size) → summed over each group: (…, groups)
        grouped = ops.reshape(x, ops.constant(np.array([0, 0, groups, size], dtype=np.int64)), True)
        sums[key] = ops.reduce_sum(grouped, ops.constant(np.array([-1], dtype=np.int64)), False)
    offset = ops.convert(ops.constant(blocks.offset), ov.Type.f32)  # (rows, groups)
    consumers = list(matmul.output(0).get_target_inputs())
    total = ops.add(matmul.output(0), ops.matmul(sums[key], offset, False, True))
    for consumer in consumers:
        consumer.replace_source_output(total.output(0))


def _replace_embedding(gather, blocks: Blocks) -> None:
    """Gather(W, ids) → Gather(W_blocks, ids) [+ Gather(offset, ids) spread over each group]."""
    import openvino as ov
    from openvino import opset13 as ops

    rows, groups, size = blocks.q.shape
    gather.input(0).replace_source_output(weight_node(blocks).output(0))
    if blocks.offset is None:
        return
    ids, axis = gather.input_value(1), gather.input_value(2)
    offsets = ops.gather(ops.convert(ops.constant(blocks.offset), ov.Type.f32), ids, axis)  # (…, groups)
    consumers = list(gather.output(0).get_target_inputs())
    grouped = ops.reshape(gather.output(0), ops.constant(np.array([0, 0, groups, size], dtype=np.int64)), True)
    spread = ops.add(grouped, ops.unsqueeze(offsets, ops.constant(np.array([-1], dtype=np.int64))))
    total = ops.reshape(spread, ops.constant(np.array([0, 0, groups * size], dtype=np.int64)), True)
    for consumer in consumers:
        consumer.replace_source_output(total.output(0))
