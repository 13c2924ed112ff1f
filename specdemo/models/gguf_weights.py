"""A GGUF file's quantized blocks, unpacked, the two ways specdemo lays them out (precisions "gguf" and "gguf-mixed"),
and the OpenVINO decompression subgraph that holds them (weight_node); specdemo/models/gguf_import.py puts them into
the graph built from the file.

Notation of ggml's block formats (ggml-quants.c): d the block's scale, sc / m a sub-block's 6-bit scale and min, q the
quantized values.

    Q8_0   32 weights: d, q (8-bit signed)                  w = d·q              i8, group 32
    Q5_0   32 weights: d, q (5-bit, offset 16)              w = d·(q − 16)       i8, group 32
    Q6_K  256 weights: d, 16 × sc (8-bit), q (6-bit, −32)   w = d·sc·(q − 32)    i8, group 16
    Q4_K  256 weights: d, dmin, 8 × (sc, m), q (4-bit)      w = d·sc·q − dmin·m  i4, group 32, + an offset

**Exact** (precision gguf): the weights the kernels see are gguf's own dequantization up to f16 rounding of the scales.
Q4_K's min per group is not a multiple of its scale, so it cannot be an integer zero point, and a fractional (f16)
zero point leaves the plugin's int8 kernels for a float path ~5× slower (measured on a Zen 5). So the weight is split:
w = s·(q − 8) + b with s = d·sc and b = 8·s − dmin·m, the first part an i4 weight with no zero point (the fast
symmetric kernel), the second added after the MatMul as a group-sum of the activations times a small (rows, groups)
matrix. Q6_K stays i8 in groups of 16: 9 bits a weight, as OpenVINO's CPU plugin has no 6-bit type.

**Mixed** (precision gguf-mixed): Q4_K as the exact layout keeps it; Q6_K, the LM head and the embedding re-quantized
per output channel to i8 (8 bits instead of 9 where the file has 6.56, one scale a row: the kernel's fastest path, and
every weight then divides a dynamic-quantization group of 32).

Not kept: Q4_K as u4 with its min rounded to a u4 zero point per group, as OpenVINO GenAI's GGUF reader and llama.cpp's
OpenVINO backend lay it (no extra MatMul, an error of up to half a step per weight). Measured as precision
"gguf-fused" (docs/amd-epyc-zen4/fidelity/): top-1 98.2 % at a mean |logit error| of 0.24 on the 1.5B target, against
INT8's 99.6 % / 0.06, the zero point's rounding all of it. Its step (65.9 ms there) was neither faithful's (the
faithful race is INT8 against gguf-mixed) nor fastest's (NNCF's INT4, 32.8 ms): no configuration ran it, so it was
retired (issue 42).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.models import kernels
from specdemo.models.blocks import decode

SUPPORTED = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
LAYOUTS = ("exact", "mixed")
PER_CHANNEL = ("output.weight", "token_embd.weight")  # re-quantized per channel in the mixed layout, whatever their type
CHUNK_BYTES = 16 << 20  # f32 weights re-quantized per channel in one step


@dataclass
class Blocks:
    """One tensor's weights as groups: w[r, g·G + j] = scale[r, g]·q[r, g, j] + offset[r, g]."""

    q: np.ndarray  # (rows, groups, G) int8, signed (symmetric, no zero point); 4-bit values fit [-8, 7]
    scale: np.ndarray  # (rows, groups) float16
    offset: np.ndarray | None  # (rows, groups) float16 (exact Q4_K's b), or None
    bits: int  # 4 or 8: the element type the IR stores q in

    def dequantize(self) -> np.ndarray:
        """(rows, columns) float32, as the kernels decompress it."""
        w = self.q.astype(np.float32)
        w *= self.scale.astype(np.float32)[..., None]
        if self.offset is not None:
            w += self.offset.astype(np.float32)[..., None]
        return w.reshape(self.q.shape[0], -1)

    def take_rows(self, rows: np.ndarray) -> "Blocks":
        """These rows (output channels) only, in this order."""
        pick = lambda a: None if a is None else np.ascontiguousarray(a[rows])  # noqa: E731
        return Blocks(pick(self.q), pick(self.scale), pick(self.offset), self.bits)


def unpack(kind: str, raw: np.ndarray) -> Blocks:
    """The exact blocks of one tensor of quantization type `kind` from its raw bytes, (rows, bytes per row) uint8: by
    specdemo's kernels' library where it runs (20x quicker), else by numpy (unpack_numpy), the same bits."""
    if kind not in SUPPORTED:
        raise ValueError(f"GGUF quantization type {kind} is not supported (supported: {', '.join(SUPPORTED)})")
    unpacked = kernels.unpack(kind, raw)
    if unpacked is None:
        return unpack_numpy(kind, raw)
    q, scale, offset = unpacked
    return Blocks(q, scale, offset, 4 if kind == "Q4_K" else 8)


def unpack_numpy(kind: str, raw: np.ndarray) -> Blocks:
    """unpack, by numpy alone: the blocks as blocks.decode reads them, scale = d·sc (d itself for Q8_0 and Q5_0) and Q4_K's
    q less 8 (an i4) with offset b = 8·scale − dmin·m, each rounded to f16 from f32."""
    decoded = decode(kind, raw)
    scale = decoded.scales()
    if kind == "Q4_K":
        return Blocks(decoded.q - 8, scale.astype(np.float16), (8 * scale - decoded.mins()).astype(np.float16), 4)
    return Blocks(decoded.q, scale.astype(np.float16), None, 8)


# ---- the mixed layout


def lay_out(blocks: Blocks, kind: str, name: str, layout: str) -> Blocks:
    """`blocks` (exact, from unpack) as `layout` lays tensor `name` of type `kind` (see the module's docstring)."""
    if layout == "exact":
        return blocks
    if layout not in LAYOUTS:
        raise ValueError(f"GGUF layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if kind == "Q6_K" or name in PER_CHANNEL:
        return _per_channel(blocks)
    return blocks  # Q4_K exact; Q8_0, Q5_0: symmetric i8 in groups of 32 is already the fast path


def per_channel_int8(w: np.ndarray) -> Blocks:
    """(rows, columns) float32 as symmetric i8 with one f16 scale a row: a single group per row. `w` is overwritten."""
    scale = (np.maximum(w.max(axis=1), -w.min(axis=1)) / 127.0).astype(np.float16)  # (rows,)
    safe = np.where(scale > 0, scale.astype(np.float32), np.float32(1.0))
    np.divide(w, safe[:, None], out=w)
    np.clip(np.rint(w, out=w), -127, 127, out=w)
    return Blocks(w.astype(np.int8)[:, None, :], scale[:, None], None, 8)


def _per_channel(blocks: Blocks) -> Blocks:
    """per_channel_int8 of the blocks' weights, CHUNK_BYTES of f32 at a time (a 151,936-row LM head is 0.9 GB of f32,
    and each whole-tensor step of the re-quantization held another)."""
    rows, columns = blocks.q.shape[0], blocks.q.shape[1] * blocks.q.shape[2]
    step = max(1, CHUNK_BYTES // (4 * columns))
    parts = [per_channel_int8(blocks.take_rows(np.arange(begin, min(begin + step, rows))).dequantize())
             for begin in range(0, rows, step)]
    return Blocks(np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]), None, 8)


# ---- as the graph holds them


def weight_node(blocks: Blocks):
    """The decompression subgraph of `blocks` without its offset: (rows, columns) f32."""
    rows, groups, size = blocks.q.shape
    if groups == 1:  # one scale a row: the per-channel pattern, no grouping reshape
        q, scale = blocks.q[:, 0, :], blocks.scale
    else:
        q, scale = blocks.q, blocks.scale[..., None]
    weight = ops.convert(_constant(q, {4: ov.Type.i4, 8: ov.Type.i8}[blocks.bits]), ov.Type.f16)
    scaled = ops.multiply(weight, ops.constant(scale))
    if groups > 1:
        scaled = ops.reshape(scaled, ops.constant(np.array([rows, groups * size], dtype=np.int64)), False)
    return ops.convert(scaled, ov.Type.f32)


def _constant(values: np.ndarray, element: ov.Type) -> ov.Node:
    """A Constant of `element` holding `values` (integers in its range). 4-bit values are packed here, two a byte, low
    nibble first as OpenVINO stores them: its own conversion goes through a Python list (16 s for the target's
    embedding alone)."""
    if element != ov.Type.i4:
        return ops.constant(values, dtype=element)
    tensor = ov.Tensor(element, ov.Shape(list(values.shape)))
    packed = kernels.pack_nibbles(values)  # by specdemo's kernels' library where it runs (10x quicker), else by numpy
    tensor.data[:] = packed if packed is not None else pack_nibbles_numpy(values)
    return ov.op.Constant(tensor)


def pack_nibbles_numpy(values: np.ndarray) -> np.ndarray:
    """kernels.pack_nibbles, by numpy alone."""
    flat = values.reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return flat[0::2] | (flat[1::2] << 4)


# ---- llama.cpp's row order of attention projections


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """For each row in transformers' order, the row of a Llama GGUF's attn_q / attn_k holding it: llama.cpp's converter
    interleaves each head's two rotary halves, which transformers undoes when it loads such a file, and the graph
    specdemo builds rotates halves as transformers does. hf row (h, j, i) = gguf row (h, i, j), heads × 2 halves ×
    rows/heads/2."""
    if rows % (2 * heads):
        raise ValueError(f"a {rows}-row attention projection cannot hold {heads} heads of two rotary halves")
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)
