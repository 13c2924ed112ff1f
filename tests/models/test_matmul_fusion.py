"""The plugin's nodes a BlockMatMul takes in (specdemo/models/matmul_fusion.py): a bias or a residual added as it writes
gives the same bits as the Add it replaces, an RMS norm taken in as its prologue the norm's products within the 8-bit
activations' rounding, on every ISA and both ways (dot products, gemm); a gguf-native model loads with every layer's
norms, biases and residuals taken in, and scores as before."""

import numpy as np
import openvino as ov
import pytest
from openvino import opset13 as ops

from specdemo.models import export, kernels, matmul_fusion, runtime
from specdemo.models.block_matmul import block_matmul
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.gguf_graph import _rms_norm
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))

ROWS, COLUMNS = 70, 512  # past two panels of 32, a tail of 6


def compiled_pair(build, folder) -> tuple:
    """(the graph `build` makes, the same graph with matmul_fusion's edits), compiled; and how many nodes were taken.
    build(x, r) → the output; x (1, M, COLUMNS) and r (1, M, ROWS) f32, the graph's inputs whether it reads r or not."""
    x = ops.parameter([1, -1, COLUMNS], ov.Type.f32)
    r = ops.parameter([1, -1, ROWS], ov.Type.f32)
    ov.save_model(ov.Model([ops.result(build(x.output(0), r.output(0)))], [x, r]), folder / "graph.xml")
    core = kernels.new_core()
    plain, fused = core.read_model(folder / "graph.xml"), core.read_model(folder / "graph.xml")
    taken = matmul_fusion.fuse_into_matmuls(fused)
    compile = lambda m: core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"})
    return compile(plain), compile(fused), taken


def layer_types(model) -> set[str]:
    return {op.get_rt_info()["layerType"].astype(str) for op in model.get_runtime_model().get_ordered_ops()}


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_a_bias_and_a_residual_taken_in_give_the_same_bits_as_the_adds_on_every_isa_and_way(kind, each_isa, tmp_path):
    rng = np.random.default_rng(5)
    raw = kernels.random_blocks(kind, ROWS, COLUMNS, rng)
    bias = rng.standard_normal(ROWS).astype(np.float32)
    for name, build in {
        "bias": lambda x, r: ops.add(block_matmul(x, raw, kind), ops.constant(bias.reshape(1, 1, -1))),
        "residual": lambda x, r: ops.add(r, block_matmul(x, raw, kind)),
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        plain, fused, taken = compiled_pair(build, folder)
        assert taken == 1 and "Eltwise" not in layer_types(fused) and "Eltwise" in layer_types(plain), name
        x = (rng.standard_normal((1, 40, COLUMNS)) * 4).astype(np.float32)
        res = rng.standard_normal((1, 40, ROWS)).astype(np.float32)
        for isa in each_isa:
            kernels.use(isa)
            for way in ("dots", "gemm"):
                kernels.gemm_from(1 if way == "gemm" else 10**6)
                for m in (1, 5, 40):
                    inputs = [x[:, :m], res[:, :m]]
                    assert np.array_equal(fused(inputs)[0], plain(inputs)[0]), f"{name} {isa} {way} {m}"


def test_an_rms_norm_taken_in_gives_the_norm_s_products_within_the_8_bit_rounding_on_every_isa(each_isa, tmp_path):
    rng = np.random.default_rng(6)
    raw = kernels.random_blocks("Q4_K", ROWS, COLUMNS, rng)
    g = rng.uniform(0.5, 2, COLUMNS).astype(np.float32)
    plain, fused, taken = compiled_pair(lambda x, r: block_matmul(_rms_norm(x, g, 1e-6, "norm").output(0), raw, "Q4_K"),
                                        tmp_path)
    assert taken == 1 and "RMS" not in layer_types(fused) and "RMS" in layer_types(plain)
    x = (rng.standard_normal((1, 40, COLUMNS)) * rng.uniform(0.1, 50, (1, 40, 1))).astype(np.float32)
    for isa in each_isa:
        kernels.use(isa)
        for way in ("dots", "gemm"):
            kernels.gemm_from(1 if way == "gemm" else 10**6)
            want, got = plain([x, x[..., :ROWS]])[0], fused([x, x[..., :ROWS]])[0]
            # the norm's last bit may differ from the plugin's (another order of sums), and an activation then round
            # to the next of its 8-bit steps: a product moves by about one step's share, never more
            assert np.abs(got - want).max() <= 0.02 * np.abs(want).max(), f"{isa} {way}"
            assert np.abs(got - want).mean() <= 1e-3 * np.abs(want).mean(), f"{isa} {way}"


def test_a_norm_read_by_something_else_too_stays_for_it(tmp_path):
    raw = kernels.random_blocks("Q8_0", ROWS, COLUMNS, np.random.default_rng(7))
    g = np.ones(COLUMNS, np.float32)

    def build(x, r):
        normed = _rms_norm(x, g, 1e-6, "norm")
        return ops.concat([block_matmul(normed.output(0), raw, "Q8_0"), ops.multiply(normed, np.float32(2))], -1)

    plain, fused, taken = compiled_pair(build, tmp_path)
    assert taken == 1 and "RMS" in layer_types(fused)
    x = np.random.default_rng(8).standard_normal((1, 3, COLUMNS)).astype(np.float32)
    want, got = plain([x, x[..., :ROWS]])[0], fused([x, x[..., :ROWS]])[0]
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def test_a_native_model_takes_every_layer_s_norms_biases_and_residuals_in_and_scores_as_before(tmp_path, monkeypatch):
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2", up="Q8_0")
    settings = ModelSettings(str(gguf), precision="gguf-native")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    ids = list(range(40, 60))
    fused = OVModel(tmp_path / "ir", settings)
    # a layer: its first norm read by q and v fused (both Q8_0) and by k (Q5_0), its second by gate and up fused; the
    # biases of both projections; the residuals after o and down
    assert fused.taken_in == tiny_gguf.LAYERS * 7
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in fused.compiled.get_runtime_model().get_ordered_ops()]
    assert kinds.count("RMS") == 1  # the last norm's, which the LM head reads through the slice of kept positions
    logits = fused.forward(ids, logits_to_keep=len(ids))
    monkeypatch.setattr(runtime.matmul_fusion, "fuse_into_matmuls", lambda model: 0)
    plain = OVModel(tmp_path / "ir", settings).forward(ids, logits_to_keep=len(ids))
    assert np.abs(logits - plain).mean() <= 0.01 * np.abs(plain).mean()
    assert (logits.argmax(-1) == plain.argmax(-1)).all()


def test_an_op_given_inputs_its_attributes_do_not_ask_for_is_refused_in_a_sentence(tmp_path):
    raw = kernels.random_blocks("Q8_0", ROWS, COLUMNS, np.random.default_rng(9))
    x = ops.parameter([1, -1, COLUMNS], ov.Type.f32)
    ov.save_model(ov.Model([ops.result(block_matmul(x.output(0), raw, "Q8_0"))], [x]), tmp_path / "op.xml")
    model = kernels.new_core().read_model(tmp_path / "op.xml")
    op = next(o for o in model.get_ordered_ops() if o.get_type_name() == "BlockMatMul")
    op.set_arguments([*op.input_values(), ops.constant(np.zeros(ROWS, np.float32)).output(0)])
    with pytest.raises(Exception, match="3 inputs, not 2"):
        op.validate_and_infer_types()
    op.set_attribute("epilogue", "scale")
    with pytest.raises(Exception, match="epilogue scale is not swiglu, bias or residual"):
        op.validate_and_infer_types()
