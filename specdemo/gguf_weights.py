"""A GGUF file's own quantized blocks as OpenVINO compressed weights (precision "gguf").

The INT8 and INT4 precisions re-quantize weights that were already 4- and 6-bit in the GGUF we ship: a bigger copy
of the file, not a more faithful one. Here every quantized tensor goes into the IR block for block, in the pattern the
CPU plugin fuses into its FullyConnected kernels (a low-bit Constant, Convert, Multiply by a per-group f16 scale,
Reshape, Convert to f32), so the weights the kernels see are gguf's own dequantization up to f16 rounding of the
scales. Notation of ggml's block formats (ggml-quants.c): d the block's scale, sc / m a sub-block's 6-bit scale and
min, q the quantized values.

    Q8_0   32 weights: d, q (8-bit signed)                  w = d·q              i8, group 32
    Q5_0   32 weights: d, q (5-bit, offset 16)              w = d·(q − 16)       i8, group 32
    Q6_K  256 weights: d, 16 × sc (8-bit), q (6-bit, −32)   w = d·sc·(q − 32)    i8, group 16
    Q4_K  256 weights: d, dmin, 8 × (sc, m), q (4-bit)      w = d·sc·q − dmin·m  i4, group 32, + an offset

Q4_K's offset per group is not a multiple of its scale, so it cannot be an integer zero point, and a fractional (f16)
zero point leaves the plugin's int8 kernels for a float path ~5× slower (measured on a Zen 5). So the weight is split:
w = s·(q − 8) + b with s = d·sc and b = 8·s − dmin·m, the first part an i4 weight with no zero point (the fast
symmetric kernel), the second added after the MatMul as Σ_g b[n, g]·(Σ_{j in g} x_j): a group-sum of the activations
times a small (rows, groups) matrix. llama.cpp's OpenVINO backend and OpenVINO GenAI's gguf_utils taught the layouts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SUPPORTED = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")


@dataclass
class Blocks:
    """One tensor's blocks, unpacked: w[r, g·G + j] = scale[r, g]·q[r, g, j] + offset[r, g]."""

    q: np.ndarray  # (rows, groups, G) int8: signed values, within [-8, 7] where bits == 4
    scale: np.ndarray  # (rows, groups) float16
    offset: np.ndarray | None  # (rows, groups) float16 (Q4_K's b), or None: symmetric blocks
    bits: int  # 4 or 8: the element type the IR stores q in

    def dequantize(self) -> np.ndarray:
        """(rows, columns) float32, as the kernels decompress it."""
        w = self.q.astype(np.float32) * self.scale.astype(np.float32)[..., None]
        if self.offset is not None:
            w += self.offset.astype(np.float32)[..., None]
        return w.reshape(self.q.shape[0], -1)


def unpack(kind: str, raw: np.ndarray) -> Blocks:
    """The blocks of one tensor of quantization type `kind` from its raw bytes, (rows, bytes per row) uint8."""
    rows = raw.shape[0]
    if kind == "Q8_0":
        b = raw.reshape(rows, -1, 34)
        return Blocks(b[..., 2:].view(np.int8).copy(), _f16(b[..., 0:2]), None, 8)
    if kind == "Q5_0":
        b = raw.reshape(rows, -1, 22)
        high = b[..., 2:6].copy().view("<u4")  # (rows, blocks, 1): bit j is the 5th bit of weight j
        bit = (high >> np.arange(32, dtype=np.uint32)) & 1  # (rows, blocks, 32)
        low = np.concatenate([b[..., 6:22] & 0x0F, b[..., 6:22] >> 4], axis=-1)  # weights 0-15 low nibbles, 16-31 high
        q = (low | (bit.astype(np.uint8) << 4)).astype(np.int8) - 16
        return Blocks(q, _f16(b[..., 0:2]), None, 8)
    if kind == "Q6_K":
        b = raw.reshape(rows, -1, 210)
        ql, qh, sc, d = b[..., 0:128], b[..., 128:192], b[..., 192:208].view(np.int8), b[..., 208:210]
        halves = []
        for h in range(2):  # each half: 128 weights from 64 bytes of low nibbles and 32 bytes of high bits
            low, high = ql[..., 64 * h:64 * h + 64], qh[..., 32 * h:32 * h + 32]
            halves += [(low[..., :32] & 0x0F) | ((high & 3) << 4), (low[..., 32:] & 0x0F) | (((high >> 2) & 3) << 4),
                       (low[..., :32] >> 4) | (((high >> 4) & 3) << 4), (low[..., 32:] >> 4) | (((high >> 6) & 3) << 4)]
        q = (np.concatenate(halves, axis=-1).astype(np.int8) - 32).reshape(rows, -1, 16)  # groups of 16
        scale = (_f16(d).astype(np.float32)[..., None] * sc.astype(np.float32)).astype(np.float16)  # (rows, blocks, 16)
        return Blocks(q, scale.reshape(rows, -1), None, 8)
    if kind == "Q4_K":
        b = raw.reshape(rows, -1, 144)
        d, dmin = _f16(b[..., 0:2]).astype(np.float32), _f16(b[..., 2:4]).astype(np.float32)
        s = b[..., 4:16]
        sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
        m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
        qs = b[..., 16:144].reshape(rows, -1, 4, 1, 32)  # 4 chunks of 32 bytes: low nibbles then high nibbles
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1, 32)  # (rows, groups, 32), 0..15
        scale = (d[..., None] * sc).reshape(rows, -1)  # (rows, groups) float32
        offset = 8 * scale - (dmin[..., None] * m).reshape(rows, -1)
        return Blocks(q.astype(np.int8) - 8, scale.astype(np.float16), offset.astype(np.float16), 4)
    raise ValueError(f"GGUF quantization type {kind} is not supported (supported: {', '.join(SUPPORTED)})")


def _f16(pair: np.ndarray) -> np.ndarray:
    """(…, 2) uint8 little-endian half floats as (…) float16."""
    return np.ascontiguousarray(pair).view("<f2")[..., 0]


# ---- the IR


# Which GGUF tensor a node of optimum-intel's Qwen2/Llama export reads: its MatMuls and its embedding Gather, by name.
_LAYER = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\b")
_GGUF_NAME = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
              "down": "ffn_down"}


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
    q = ops.constant(blocks.q, dtype=ov.Type.i4 if blocks.bits == 4 else ov.Type.i8)
    scaled = ops.multiply(ops.convert(q, ov.Type.f16), ops.constant(blocks.scale[..., None]))
    flat = ops.reshape(scaled, ops.constant(np.array([rows, groups * size], dtype=np.int64)), False)
    return ops.convert(flat, ov.Type.f32)


def import_blocks(model, gguf_path: Path, log=lambda message: None):
    """Replace the weights of `model` (an ov.Model exported from the GGUF's dequantized weights) with the GGUF's own
    blocks, in place; returns the model. Tensors of other types (F32 norms and biases) stay as exported."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    sums = {}  # activations' group sums, shared by the MatMuls reading the same input (q, k, v; gate, up)
    replaced = 0
    for op in list(model.get_ordered_ops()):
        name = tensor_for(op.get_friendly_name(), op.get_type_name(), set(tensors))
        tensor = tensors.get(name) if name else None
        if tensor is None or tensor.tensor_type.name not in SUPPORTED:
            continue
        blocks = unpack(tensor.tensor_type.name, np.asarray(tensor.data))
        if op.get_type_name() == "MatMul":
            _replace_matmul_weight(op, blocks, sums)
        else:
            _replace_embedding(op, blocks)
        replaced += 1
    if not replaced:
        raise ValueError(f"{gguf_path.name}: no quantized tensor of it matched the exported model's layers")
    log(f"{replaced} weights taken block for block from {gguf_path.name}")
    model.validate_nodes_and_infer_types()
    return model


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
