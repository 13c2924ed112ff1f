"""The GGUF block types specdemo's kernels read (kernels/src/formats.hpp), the name of their op, and each format's one
numpy decoder. A leaf: the op's stand-in (block_matmul.py), the kernels' Python side (kernels.py: the reference the
kernels are held to) and the unpacking into OpenVINO's groups (gguf_weights.py) all read it.

Each decoder reads a tensor's blocks as formats.hpp's `decode` does (ggml's notation, ggml-quants.c):

    w[r, g, i] = d·sc[r, g]·q[r, g, i] − dmin·m[r, g]      groups of G = 32 weights (Q6_K 16)

with sc = 1 and m = 0 where a format has no groups of its own (Q8_0, Q5_0, Q4_0), dmin 0 but for Q4_K, and q as the
formula takes it: Q4_K 0…15, Q6_K −32…31, Q8_0 −128…127, Q5_0 −16…15, Q4_0 −8…7. `Decoded.dequantize` is gguf-py's
dequantization bit for bit (tests/models/test_blocks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TYPE = "BlockMatMul"
KINDS = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34), "Q5_0": (32, 22), "Q4_0": (32, 18)}  # values, bytes
GROUP = {"Q4_K": 32, "Q6_K": 16, "Q8_0": 32, "Q5_0": 32, "Q4_0": 32}  # sharing a scale (formats.hpp: slot_values)


@dataclass(frozen=True)
class Decoded:
    """A tensor's blocks decoded: w[r, g, i] = d[r, g]·sc[r, g]·q[r, g, i] − dmin[r, g]·m[r, g] (module docstring)."""

    q: np.ndarray  # (rows, groups, G) int8, as the formula takes it
    d: np.ndarray  # (rows, groups) float16: the scale of each group's block
    sc: np.ndarray  # (rows, groups) int8: the group's own scale (1 where the format has none)
    dmin: np.ndarray  # (rows, groups) float16: Q4_K's min scale of each group's block (0 for the others)
    m: np.ndarray  # (rows, groups) int8: the group's min (0 but for Q4_K)

    def scales(self) -> np.ndarray:
        """(rows, groups) float32: d·sc, rounded as gguf-py rounds it."""
        return self.d.astype(np.float32) * self.sc.astype(np.float32)

    def mins(self) -> np.ndarray:
        """(rows, groups) float32: dmin·m."""
        return self.dmin.astype(np.float32) * self.m.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """(rows, columns) float32: gguf-py's dequantization, the same f32 products and difference in the same order."""
        w = self.scales()[..., None] * self.q.astype(np.float32) - self.mins()[..., None]
        return w.reshape(self.q.shape[0], -1)


def decode(kind: str, raw: np.ndarray) -> Decoded:
    """`raw`, (rows, bytes per row) uint8 blocks of `kind`, decoded (formats.hpp's decode, the same values)."""
    if kind not in KINDS:
        raise ValueError(f"specdemo's kernels read {', '.join(KINDS)} blocks, not {kind}")
    values, size = KINDS[kind]
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, size)  # (rows, blocks, bytes)
    q, d, sc, dmin, m = _DECODERS[kind](blocks)  # q (rows, blocks, values); d, dmin (rows, blocks); sc, m (…, groups)
    rows, per_block = raw.shape[0], values // GROUP[kind]
    by_group = lambda a: np.repeat(a, per_block, axis=-1)  # noqa: E731 - a block's scale for each of its groups
    return Decoded(q.reshape(rows, -1, GROUP[kind]), by_group(d), sc.reshape(rows, -1), by_group(dmin),
                   m.reshape(rows, -1))


def _half(pair: np.ndarray) -> np.ndarray:
    """(…, 2) uint8 little-endian half floats as (…) float16."""
    return np.ascontiguousarray(pair).view("<f2")[..., 0]


def _none(like: np.ndarray, value: int) -> np.ndarray:
    """A format's missing groups (Q8_0's and Q5_0's sc = 1, m = 0): (rows, blocks, 1) int8 of `value`."""
    return np.full(like.shape[:2] + (1,), value, dtype=np.int8)


def _decode_q4_k(b: np.ndarray):
    """d, dmin (f16), 12 bytes of 8 × (sc, m) 6-bit, 128 bytes of nibbles: bytes 32c… hold weights 64c + i (low nibble)
    and 64c + 32 + i (high nibble)."""
    s = b[..., 4:16]
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | (s[..., 0:4] >> 6) << 4], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], axis=-1)
    nibbles = b[..., 16:144].reshape(*b.shape[:2], 4, 1, 32)
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-2).reshape(*b.shape[:2], 256)
    return q.astype(np.int8), _half(b[..., 0:2]), sc.astype(np.int8), _half(b[..., 2:4]), m.astype(np.int8)


def _decode_q6_k(b: np.ndarray):
    """128 bytes of low nibbles, 64 of 2-bit highs, 16 × sc (i8), d (f16); q = the 6-bit value − 32."""
    low, high = b[..., 0:128], b[..., 128:192]
    halves = []
    for h in range(2):  # each half: 128 weights from 64 bytes of nibbles and 32 of highs (4 a byte)
        nibbles, highs = low[..., 64 * h:64 * h + 64], high[..., 32 * h:32 * h + 32]
        halves += [(nibbles[..., :32] & 0x0F) | (highs & 3) << 4, (nibbles[..., 32:] & 0x0F) | (highs >> 2 & 3) << 4,
                   (nibbles[..., :32] >> 4) | (highs >> 4 & 3) << 4, (nibbles[..., 32:] >> 4) | (highs >> 6) << 4]
    q = np.concatenate(halves, axis=-1).astype(np.int8) - 32
    d = _half(b[..., 208:210])
    return q, d, b[..., 192:208].view(np.int8), np.zeros_like(d), np.zeros(b.shape[:2] + (16,), np.int8)


def _decode_q8_0(b: np.ndarray):
    """d (f16), 32 × q (i8)."""
    d = _half(b[..., 0:2])
    return b[..., 2:34].view(np.int8), d, _none(b, 1), np.zeros_like(d), _none(b, 0)


def _decode_q5_0(b: np.ndarray):
    """d (f16), 32 fifth bits (bit i: weight i's), 16 bytes of nibbles (weight i low, 16 + i high); q = the 5-bit
    value − 16."""
    fifth = np.unpackbits(b[..., 2:6], axis=-1, bitorder="little")
    low = np.concatenate([b[..., 6:22] & 0x0F, b[..., 6:22] >> 4], axis=-1)
    d = _half(b[..., 0:2])
    return (low | fifth << 4).astype(np.int8) - 16, d, _none(b, 1), np.zeros_like(d), _none(b, 0)


def _decode_q4_0(b: np.ndarray):
    """d (f16), 16 bytes of nibbles (weight i low, 16 + i high); q = the nibble − 8."""
    q = np.concatenate([b[..., 2:18] & 0x0F, b[..., 2:18] >> 4], axis=-1).astype(np.int8) - 8
    d = _half(b[..., 0:2])
    return q, d, _none(b, 1), np.zeros_like(d), _none(b, 0)


_DECODERS = {"Q4_K": _decode_q4_k, "Q6_K": _decode_q6_k, "Q8_0": _decode_q8_0, "Q5_0": _decode_q5_0,
             "Q4_0": _decode_q4_0}
