"""A GGUF's blocks re-quantized to 4 bits (specdemo/models/requantize.py, precision gguf-q4): blocks gguf-py reads as
ours do, no further from the file's weights than the plain max-abs (min-max) rule, at 4.5 bits a weight; a model of
them runs on every ISA path and scores near the file's own blocks."""

import gguf
import numpy as np
import pytest

from specdemo.models import blocks, export, kernels, requantize
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf


def relative_error(raw: np.ndarray, kind: str, new: np.ndarray, new_kind: str) -> float:
    w = blocks.decode(kind, raw).dequantize()
    return float(np.sqrt(((blocks.decode(new_kind, new).dequantize() - w) ** 2).mean() / (w ** 2).mean()))


@pytest.mark.parametrize("kind, columns, becomes", [("Q5_0", 896, "Q4_0"), ("Q8_0", 896, "Q4_0"), ("Q6_K", 512, "Q4_K"),
                                                    ("Q8_0", 512, "Q4_K")])
def test_each_type_becomes_4_bit_blocks_gguf_py_reads_as_we_do_at_4_5_bits_a_weight(kind, columns, becomes):
    raw = kernels.random_blocks(kind, 40, columns, np.random.default_rng(3))
    new, new_kind = requantize.to_4_bits(raw, kind)
    assert new_kind == becomes and new.dtype == np.uint8
    assert new.shape == (40, columns // 32 * 18) if becomes == "Q4_0" else new.shape == (40, columns // 256 * 144)
    ours = blocks.decode(new_kind, new).dequantize()
    theirs = gguf.quants.dequantize(new, gguf.GGMLQuantizationType[new_kind]).reshape(ours.shape)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert relative_error(raw, kind, new, new_kind) < 0.08  # 4 bits of uniform values: ~6 %


def test_4_bit_blocks_are_kept_as_they_are():
    for kind, columns in (("Q4_K", 512), ("Q4_0", 96)):
        raw = kernels.random_blocks(kind, 8, columns, np.random.default_rng(1))
        new, new_kind = requantize.to_4_bits(raw, kind)
        assert new_kind == kind and new is raw


def test_the_searched_scales_are_no_further_from_the_file_than_the_plain_rule_on_a_model_s_weights():
    """Weights as a model's are (heavy tailed: a Laplace, as the 0.5B's Q5_0 layers), encoded as Q8_0: the searched
    Q4_0 scale is within a rounding of the plain max-abs rule (d = max / −8) or better, on average clearly better."""
    rng = np.random.default_rng(2)
    w = rng.laplace(0, 0.02, (64, 896)).astype(np.float32)
    searched = blocks.decode("Q4_0", requantize._q4_0_blocks(w).reshape(64, -1)).dequantize()
    x = w.reshape(-1, 32)
    largest = np.take_along_axis(x, np.abs(x).argmax(1)[:, None], 1)
    d = (largest / -8).astype(np.float16).astype(np.float32)
    plain = (d * np.clip(np.rint(x / d), -8, 7)).reshape(w.shape)
    error = lambda v: ((v - w) ** 2).reshape(-1, 32).sum(1)  # noqa: E731 - per block
    assert (error(searched) <= error(plain) * 1.01 + 1e-12).all()
    assert error(searched).sum() < 0.95 * error(plain).sum()  # 7 % less


def test_a_4_bit_model_is_the_file_re_quantized_on_our_kernels_bit_for_bit_on_every_isa(tmp_path, each_isa):
    """gguf-q4 of a file computes what gguf-native computes of the same file with its matrices re-quantized (each
    kernel is held to gguf-py's dequantization in test_kernels.py), at fewer bytes."""
    original = tiny_gguf.write(tmp_path / "tiny.gguf", "llama")  # Q8_0 and Q5_0, rows of 64 or 128: Q4_0
    recoded = tiny_gguf.write(tmp_path / "recoded.gguf", "llama", recode=requantize.to_4_bits)
    export.from_gguf(GGUFFile(original), "gguf-q4", tmp_path / "q4", lambda *_: None)
    export.from_gguf(GGUFFile(original), "gguf-native", tmp_path / "native", lambda *_: None)
    export.from_gguf(GGUFFile(recoded), "gguf-native", tmp_path / "recoded", lambda *_: None)
    ir = kernels.new_core().read_model(tmp_path / "q4" / "openvino_model.xml")
    assert {op.get_attributes()["kind"] for op in ir.get_ops() if op.get_type_name() == "BlockMatMul"} == {"Q4_0"}
    size = lambda name: (tmp_path / name / "openvino_model.bin").stat().st_size  # noqa: E731
    assert size("q4") < 0.85 * size("native")
    ids = list(range(40, 60))
    for isa in each_isa:
        kernels.use(isa)
        q4 = OVModel(tmp_path / "q4", ModelSettings(str(original), precision="gguf-q4"))
        native = OVModel(tmp_path / "recoded", ModelSettings(str(recoded), precision="gguf-native"))
        assert np.array_equal(q4.forward(ids, logits_to_keep=len(ids)), native.forward(ids, logits_to_keep=len(ids)))
