"""A GGUF tensor's blocks re-quantized to 4 bits for specdemo's kernels (precision gguf-q4, a draft's weights).

A draft's step is bound by the bytes it streams: the 0.5B draft's Q5_0 and Q8_0 layers and its Q8_0 head are 5.5 and
8.5 bits a weight. Its weights only decide which tokens it proposes; the target checks every one, so fewer bits cost
acceptance, never correctness (tune's draft plan weighs the two). Each tensor becomes

    Q4_K  where a row holds whole blocks of 256 (Q6_K's and Q4_K's tensors; Q4_K's kept as they are),
    Q4_0  elsewhere (blocks of 32: the 0.5B's rows of 896 weights), w = d·L, L in −8…7,

both 4.5 bits a weight. Each block's scales are searched for the least squared error of the file's own weights (as
blocks.decode dequantizes them), a few candidates around the plain max-abs (min-max) scale, as llama.cpp's
make_qx_quants / make_qkx2_quants do without an importance matrix: on the 0.5B draft, 13.2 % relative error for a
Q5_0 layer against 15.3 % by the plain rule, 9.1 % against 9.5 % for a Q8_0 one.
"""

from __future__ import annotations

import numpy as np

from specdemo.models.blocks import KINDS, decode

ROWS_A_PASS = 4096  # rows re-quantized at once: ~16 MiB of f32 weights for rows of 896, a few times that in temporaries
STEPS = 3  # candidate scales each side of the plain one (2 gave 0.1317 relative error, 9 gave 0.1313)


def to_4_bits(raw: np.ndarray, kind: str) -> tuple[np.ndarray, str]:
    """`raw` (rows, bytes per row) u8 blocks of `kind` as 4-bit blocks: (raw', kind'), Q4_K where a row holds whole
    blocks of 256, else Q4_0 (the module's docstring). Q4_K and Q4_0 blocks are returned as they are."""
    if kind in ("Q4_K", "Q4_0"):
        return raw, kind
    values, size = KINDS[kind]
    columns = raw.shape[1] // size * values
    out_kind = "Q4_K" if columns % 256 == 0 else "Q4_0"
    encode = _q4_k_blocks if out_kind == "Q4_K" else _q4_0_blocks
    parts = [encode(decode(kind, raw[r:r + ROWS_A_PASS]).dequantize()) for r in range(0, raw.shape[0], ROWS_A_PASS)]
    return np.concatenate(parts).reshape(raw.shape[0], -1), out_kind


def _q4_0_blocks(w: np.ndarray) -> np.ndarray:
    """(rows, columns) f32 → (rows · columns / 32, 18) u8 Q4_0 blocks: d (f16), 16 bytes of nibbles (weight i low,
    16 + i high), w ≈ d·(nibble − 8)."""
    x = w.reshape(-1, 32)
    d, levels = _symmetric_fit(x)
    q = (levels + 8).astype(np.uint8)
    out = np.empty((x.shape[0], 18), np.uint8)
    out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:18] = q[:, :16] | q[:, 16:] << 4
    return out


def _symmetric_fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 32) f32 → d (n,) f16 and levels (n, 32) in −8…7 with x ≈ d·levels: of the candidate scales that put the
    largest |x| near level −8 (at 8 + 0.1·i, |i| ≤ STEPS), each refit by least squares, the one of least error."""
    largest = np.take_along_axis(x, np.abs(x).argmax(1)[:, None], 1)[:, 0]
    largest = np.where(largest == 0, 1, largest)
    best_d, best_levels = np.zeros(len(x), np.float16), np.zeros(x.shape, np.int8)
    best_error = np.full(len(x), np.inf, np.float32)
    for i in range(-STEPS, STEPS + 1):
        levels = np.clip(np.rint(x * (-(8 + 0.1 * i) / largest)[:, None]), -8, 7)
        norm = (levels * levels).sum(1)
        d = np.where(norm > 0, (x * levels).sum(1) / np.maximum(norm, 1), 0).astype(np.float16)
        scale = d.astype(np.float32)
        levels = np.clip(np.rint(x / np.where(scale == 0, 1, scale)[:, None]), -8, 7)  # again, with d as stored
        error = ((scale[:, None] * levels - x) ** 2).sum(1)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best_d = np.where(better, d, best_d)
        best_levels = np.where(better[:, None], levels, best_levels).astype(np.int8)
    return best_d, best_levels


def _q4_k_blocks(w: np.ndarray) -> np.ndarray:
    """(rows, columns) f32 → (rows · columns / 256, 144) u8 Q4_K blocks (blocks.py: _decode_q4_k reads them): each
    sub-block of 32 fitted as scale·L − min (L in 0…15), the 8 scales and mins then quantized to 6 bits under the
    block's d and dmin, and the levels fitted again to what is stored."""
    x = w.reshape(-1, 8, 32)
    scale, low = _affine_fit(x.reshape(-1, 32))
    scale, low = scale.reshape(-1, 8), low.reshape(-1, 8)  # low ≥ 0: w ≈ scale·L − low
    d, dmin = (scale.max(1) / 63).astype(np.float16), (low.max(1) / 63).astype(np.float16)
    sc = _six_bits(scale, d.astype(np.float32))
    m = _six_bits(low, dmin.astype(np.float32))
    step, offset = d.astype(np.float32)[:, None] * sc, dmin.astype(np.float32)[:, None] * m  # as the kernels read them
    levels = np.clip(np.rint((x + offset[..., None]) / np.where(step > 0, step, 1)[..., None]), 0, 15)
    levels = np.where(step[..., None] > 0, levels, 0).astype(np.uint8).reshape(-1, 4, 2, 32)
    out = np.empty((x.shape[0], 144), np.uint8)
    out[:, 0:2], out[:, 2:4] = d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8)
    # 12 bytes of scales: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (sc) and 4-7 (m), 4-7 in bytes 8-11's nibbles
    # and the 2 bits left of bytes 0-7
    out[:, 4:8] = sc[:, :4] | (sc[:, 4:] >> 4) << 6
    out[:, 8:12] = m[:, :4] | (m[:, 4:] >> 4) << 6
    out[:, 12:16] = (sc[:, 4:] & 0x0F) | (m[:, 4:] & 0x0F) << 4
    out[:, 16:144] = (levels[:, :, 0] | levels[:, :, 1] << 4).reshape(-1, 128)  # bytes 32c + i: 64c + i, 64c + 32 + i
    return out


def _affine_fit(x: np.ndarray, steps: int = 2 * STEPS + 2) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 32) f32 → scale (n,), low (n,) ≥ 0 with x ≈ scale·L − low, L in 0…15: of the plain scale (min(x, 0)…max(x)
    in 15 steps) and the candidates spreading that span over 14…16 levels (`steps` + 1 of them), each refit by least
    squares (low held at 0 where the fit would make it negative), the one of least error."""
    lowest, highest = np.minimum(x.min(1), 0), x.max(1)
    span = np.maximum(highest - lowest, 1e-30)
    best_scale, best_low = span / 15, -lowest
    levels = np.clip(np.rint((x - lowest[:, None]) / best_scale[:, None]), 0, 15)
    best_error = (((best_scale[:, None] * levels - best_low[:, None]) - x) ** 2).sum(1)
    for i in range(steps + 1):
        levels = np.clip(np.rint((x - lowest[:, None]) * ((14 + 2 * i / steps) / span)[:, None]), 0, 15)
        n, sum_l, sum_ll = x.shape[1], levels.sum(1), (levels * levels).sum(1)
        sum_x, sum_xl = x.sum(1), (levels * x).sum(1)
        det = n * sum_ll - sum_l * sum_l
        solvable = det > 0
        scale = np.where(solvable, (n * sum_xl - sum_x * sum_l) / np.where(solvable, det, 1), best_scale)
        offset = np.where(solvable, (sum_ll * sum_x - sum_l * sum_xl) / np.where(solvable, det, 1), -best_low)
        positive = offset > 0  # a positive offset is no min: fit the scale alone
        scale = np.where(positive, sum_xl / np.maximum(sum_ll, 1e-30), scale)
        offset = np.where(positive, 0, offset)
        error = (((scale[:, None] * levels + offset[:, None]) - x) ** 2).sum(1)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best_scale, best_low = np.where(better, scale, best_scale), np.where(better, -offset, best_low)
    return np.maximum(best_scale, 0), np.maximum(best_low, 0)


def _six_bits(values: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """values (n, 8) ≥ 0 in steps of unit (n,): rounded to 0…63, u8."""
    return np.clip(np.rint(values / np.where(unit > 0, unit, 1)[:, None]), 0, 63).astype(np.uint8)
