"""Each block format's one numpy decoder (specdemo/models/blocks.py): the reference specdemo's kernels are held to and
numpy's unpacking of the GGUF's blocks both read blocks through it, so it is held to gguf-py's own dequantization, bit
for bit, on random blocks."""

import gguf
import numpy as np
import pytest

from specdemo.models import blocks, kernels

RANGES = {"Q4_K": (0, 15), "Q6_K": (-32, 31), "Q8_0": (-128, 127), "Q5_0": (-16, 15), "Q4_0": (-8, 7)}  # q as taken


@pytest.mark.parametrize("kind", list(blocks.KINDS))
def test_each_format_s_decoder_dequantizes_random_blocks_as_gguf_py_does_bit_for_bit(kind):
    raw = kernels.random_blocks(kind, 16, 1024, np.random.default_rng(ord(kind[1])))  # every byte but the scales random
    ours = blocks.decode(kind, raw).dequantize()
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(16, 1024)
    assert ours.dtype == np.float32 and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("kind", list(blocks.KINDS))
def test_each_format_s_values_span_the_range_its_formula_takes_in_groups_of_its_scales(kind):
    decoded = blocks.decode(kind, kernels.random_blocks(kind, 8, 512, np.random.default_rng(3)))
    group = 16 if kind == "Q6_K" else 32
    assert decoded.q.shape == (8, 512 // group, group) and decoded.sc.shape == decoded.d.shape == (8, 512 // group)
    assert (decoded.q.min(), decoded.q.max()) == RANGES[kind]
    if kind in ("Q8_0", "Q5_0", "Q4_0"):  # no groups of their own: w = d·q
        assert (decoded.sc == 1).all() and (decoded.m == 0).all() and (decoded.dmin == 0).all()


def test_a_block_type_the_kernels_do_not_read_is_refused_by_name():
    with pytest.raises(ValueError, match="not Q2_K"):
        blocks.decode("Q2_K", np.zeros((1, 84), dtype=np.uint8))
