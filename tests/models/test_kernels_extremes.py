"""The kernels' integer sums at the edges of what the formats hold: every weight at its format's smallest or largest
value, the largest scales, times activations that all quantize to ±127, on every ISA path this CPU runs, by the dot
products and by the gemm. The AVX2 gemm sums a block's products in 16-bit lanes (Q4_K: a slot's 16 products a lane;
Q6_K: 8 from −32·Σq; Q5_0: 16 from −16·Σq; Q4_0: 16 from −8·Σq) on bounds that hold only because the activations
stop at ±127: random blocks never come near them, these do."""

import itertools

import numpy as np
import pytest

from specdemo.models import kernels
from specdemo.models.block_matmul import compiled

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))

# Per block type: byte ranges set to the fill (the weights' values), and byte ranges of sub-block scales with the
# value that makes them largest in magnitude; the f16 scales stay random_blocks' own.
VALUES = {"Q4_K": [(16, 144)], "Q6_K": [(0, 192)], "Q5_0": [(2, 22)], "Q8_0": [(2, 34)], "Q4_0": [(2, 18)]}
SCALES = {"Q4_K": [(4, 16, 0xFF)], "Q6_K": [(192, 208, 0x80)], "Q5_0": [], "Q8_0": [], "Q4_0": []}


def extreme_blocks(kind: str, fill: int, rows: int, columns: int) -> np.ndarray:
    """(rows, bytes per row) u8: random_blocks of `kind` with every value byte `fill` and the largest scales."""
    raw = kernels.random_blocks(kind, rows, columns, np.random.default_rng(3))
    values, size = kernels.KINDS[kind]
    blocks = raw.reshape(rows, columns // values, size)
    for begin, end in VALUES[kind]:
        blocks[..., begin:end] = fill
    for begin, end, largest in SCALES[kind]:
        blocks[..., begin:end] = largest
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind, fill", itertools.product(list(kernels.KINDS), (0x00, 0xFF, 0x80)))
def test_weights_at_their_extremes_times_activations_at_127_sum_exactly_on_every_isa(kind, fill, each_isa, tmp_path):
    columns = 512
    raw = extreme_blocks(kind, fill, 32, columns)
    model = compiled({kind: raw}, kernels.new_core(), tmp_path)
    signs = np.where(np.arange(9) % 2, -1.0, 1.0).astype(np.float32)[:, None]
    for m in (1, 5, 9):  # a step, a verification's tile, two tiles
        x = np.repeat(signs[:m], columns, axis=1)  # every activation ±1: each quantizes to ±127 with its scale
        for isa, way in itertools.product(each_isa, ("dots", "gemm")):
            kernels.use(isa)
            kernels.gemm_from(1 if way == "gemm" else 10**6)
            ran = way if kind in kernels.gemm_kinds() else "dots"
            got = model(x)[0]
            assert kernels.mismatch(got, x, raw, kind, ran) <= 1, (kind, hex(fill), isa, ran, m)
