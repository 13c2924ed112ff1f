"""specdemo's kernels (kernels/, specdemo/models/kernels.py): BlockMatMul over a GGUF tensor's own blocks equals
gguf-py's dequantization of those blocks times the 8-bit-quantized activations, on every block type and on every ISA
path this CPU runs (each one forced in turn); the graph built on them computes the exact layout's logits; a machine
where they were not built still runs, and says why once."""

import numpy as np
import pytest

from specdemo.bench.schema import Sections
from specdemo.models import export, graph, kernels
from specdemo.models.block_matmul import compiled
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


def test_this_cpu_runs_the_scalar_path_and_its_widest_by_default():
    assert "scalar" in kernels.supported_isas()
    assert kernels.isa() == kernels.supported_isas()[-1]


# The tails the kernels have (kernels/src): weight rows past the last whole panel (16 on AVX2, 32 on AVX-512) and fewer
# rows than a panel; columns past the last whole chunk of 1024 a gemm multiplies at once (panel.hpp), and a single
# K-quant block; activation rows 1…70: each remainder of every tile (on AVX2 6 rows for Q4_K, 5 for Q6_K, Q5_0 and
# Q4_0; 6 on AVX-512) and of the 4 rows a dot product decodes a block once for, and past the 64 a pass of the dot
# products holds (block_matmul.cpp).
SHAPES = {"past whole panels and chunks": (37, 1280), "less than a panel, one K-quant block": (5, 256)}
ROW_COUNTS = range(1, 71)


@pytest.mark.parametrize("rows, columns", SHAPES.values(), ids=SHAPES)
def test_every_path_is_the_reference_on_every_block_type_tail_and_row_count_on_every_isa(rows, columns, each_isa,
                                                                                       tmp_path):
    """Each ISA path this CPU runs, forced in turn, each way (its dot products, its gemm), equals the dequantized blocks
    (models/blocks.py's decoders, gguf-py's bit for bit) times the activations as that way quantizes them."""
    rng = np.random.default_rng(rows)
    raw = {kind: kernels.random_blocks(kind, rows, columns, rng) for kind in kernels.KINDS}
    model = compiled(raw, kernels.new_core(), tmp_path)  # an output per block type
    most = max(ROW_COUNTS)
    x = (rng.standard_normal((most, columns)) * rng.uniform(0.1, 10, (most, 1))).astype(np.float32)  # rows of any size
    for isa in each_isa:
        kernels.use(isa)
        for way in ("dots", "gemm") if kernels.gemm_kinds() else ("dots",):
            kernels.gemm_from(1 if way == "gemm" else 10**6)
            ran = {kind: way if kind in kernels.gemm_kinds() else "dots" for kind in raw}  # no gemm: the dot products
            # each activation row is quantized alone, so the first m rows' reference is the whole one's first m rows
            expected = {kind: kernels.reference(x, raw[kind], kind, ran[kind]) for kind in raw}
            for m in ROW_COUNTS:
                model(-x[:m])  # a call that left its output in place would read as −expected, not pass
                got = model(x[:m])
                for i, kind in enumerate(raw):
                    want, allowed = expected[kind]
                    assert got[i].shape == (m, rows)
                    assert kernels.distance(got[i], want[:m], allowed[:m]) <= 1, (kind, isa, ran[kind], m)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q4_0"])
def test_a_row_s_result_is_the_same_bits_whatever_the_rows_beside_it_in_its_call(kind, each_isa, tmp_path):
    """A verification of K drafts scores each exactly as a single step would: the gemm quantizes and sums a row alike in
    a call of 1 row, of 9 or of 20 (from 16 rows on AVX-512, 5 on AVX2, Q6_K's values are decoded once a call)."""
    rng = np.random.default_rng(7)
    raw = kernels.random_blocks(kind, 64, 512, rng)
    model = compiled({kind: raw}, kernels.new_core(), tmp_path)
    x = rng.standard_normal((20, 512)).astype(np.float32)
    for isa in each_isa[1:]:  # the SIMD paths, each on its own way for any number of rows
        kernels.use(isa)
        nine, twenty = model(x[:9])[0].copy(), model(x)[0].copy()
        for m in range(9):
            alone = model(x[m:m + 1])[0][0]
            assert np.array_equal(alone, nine[m]) and np.array_equal(alone, twenty[m]), (isa, m)


def test_every_simd_isa_has_a_gemm_for_the_k_quants_and_scalar_has_none(each_isa):
    for isa in each_isa:
        kernels.use(isa)
        assert {"Q4_K", "Q6_K"} <= set(kernels.gemm_kinds()) if isa != "scalar" else kernels.gemm_kinds() == []


def test_the_isa_a_test_forces_is_the_one_that_runs(each_isa):
    for isa in each_isa:
        assert kernels.use(isa) and kernels.isa() == isa
    assert not kernels.use("avx1024")
    assert kernels.isa() == each_isa[-1]  # a refused name changes nothing


def test_activations_of_zeros_give_zeros_not_nan(tmp_path):
    raw = kernels.random_blocks("Q4_K", 8, 256, np.random.default_rng(1))
    model = compiled({"Q4_K": raw}, kernels.new_core(), tmp_path)
    assert np.array_equal(model(np.zeros((2, 256), np.float32))[0], np.zeros((2, 8)))


def glu_models(raw: np.ndarray, kind: str, folder) -> tuple:
    """(the BlockMatMul alone, its gated MLP fused by graph.fuse_glu), compiled: x (M, columns) → (M, rows) and
    (M, rows / 2) = silu(y[:, :rows/2])·y[:, rows/2:]; and how many fuse_glu fused."""
    from openvino import opset13 as ops
    import openvino as ov
    from specdemo.models.block_matmul import block_matmul

    x = ops.parameter([-1, raw.shape[1] // kernels.KINDS[kind][1] * kernels.KINDS[kind][0]], ov.Type.f32)
    y = block_matmul(x.output(0), raw, kind)
    gate, up = ops.variadic_split(y, ops.constant(np.int64(-1)), ops.constant(np.array([len(raw) // 2] * 2))).outputs()
    ov.save_model(ov.Model([ops.result(y)], [x]), folder / "alone.xml")
    ov.save_model(ov.Model([ops.result(ops.multiply(ops.swish(gate), up))], [x]), folder / "glu.xml")
    core = kernels.new_core()
    model = core.read_model(folder / "glu.xml")
    fused = graph.fuse_glu(model)
    compile = lambda m: core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 2})
    return compile(core.read_model(folder / "alone.xml")), compile(model), fused


def test_the_swiglu_epilogue_is_silu_gate_times_up_of_the_same_products_on_every_isa(each_isa, tmp_path):
    """A fused gate-and-up BlockMatMul that applies silu(gate)·up as it writes (graph.fuse_glu) gives the gated MLP of
    its own products within f32 rounding: gates from −300 to 300 (e^x clamped where it would overflow), each way."""
    rng = np.random.default_rng(3)
    raw = kernels.random_blocks("Q4_K", 2 * 37, 512, rng)  # gate rows then up rows: 37 each, past a panel of 16 or 32
    alone, fused, count = glu_models(raw, "Q4_K", tmp_path)
    assert count == 1
    assert not {"Swish", "VariadicSplit"} & {op.get_rt_info()["layerType"].astype(str)
                                             for op in fused.get_runtime_model().get_ordered_ops()}
    x = (rng.standard_normal((40, 512)) * rng.uniform(0.01, 30, (40, 1))).astype(np.float32)
    for isa in each_isa:
        kernels.use(isa)
        for way in ("dots", "gemm"):
            kernels.gemm_from(1 if way == "gemm" else 10**6)
            for m in (1, 3, 7, 40):
                y = alone(x[:m])[0].astype(np.float64)
                gate, up = y[:, :37], y[:, 37:]
                want = gate * up / (1 + np.exp(np.minimum(-gate, 700)))
                got = fused(x[:m])[0]
                assert got.shape == (m, 37)
                assert np.abs(gate).max() > 80 or m < 40  # the clamped range is reached
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * np.abs(want).max(), err_msg=f"{isa} {way} {m}")


def test_a_native_graph_whose_gate_and_up_fuse_applies_its_gated_mlp_in_them_and_scores_as_before(tmp_path,
                                                                                                     monkeypatch):
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2", up="Q8_0")  # gate and up of one block type: fused
    settings = ModelSettings(str(gguf), precision="gguf-native")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    ids = list(range(40, 60))
    with_glu = OVModel(tmp_path / "ir", settings)
    assert with_glu.glu_fused == tiny_gguf.LAYERS
    logits = with_glu.forward(ids, logits_to_keep=len(ids))
    monkeypatch.setattr(graph, "fuse_glu", lambda model: 0)
    without = OVModel(tmp_path / "ir", settings).forward(ids, logits_to_keep=len(ids))
    # the same products, silu by another exp: the next layer's 8-bit activations may round a value the other way
    assert np.abs(logits - without).mean() <= 0.01 * np.abs(without).mean()
    assert (logits.argmax(-1) == without.argmax(-1)).all()


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_the_native_graph_computes_the_exact_layouts_logits_up_to_its_8_bit_activations(architecture, tmp_path, each_isa):
    """The tiny GGUFs hold Q8_0 and Q5_0 blocks (a Llama file's q/k rows permuted): the native graph reads the same
    rows, so its logits are the exact layout's but for the activations' 8-bit rounding (each MatMul exactly is held
    above; a row out of place or a wrong block type would put them tens of percent apart)."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", architecture)
    settings = {p: ModelSettings(str(gguf), precision=p, inference_precision="f32", kv_cache_precision="f32",
                                 dynamic_quantization_group_size=0) for p in ("gguf", "gguf-native")}
    for precision in settings:
        export.from_gguf(GGUFFile(gguf), precision, tmp_path / precision, lambda *_: None)
    ir = kernels.new_core().read_model(tmp_path / "gguf-native" / "openvino_model.xml")
    assert any(op.get_friendly_name().endswith("/fused") for op in ir.get_ops())  # q and v (both Q8_0), gate and up
    ids = list(range(40, 60))
    exact = OVModel(tmp_path / "gguf", settings["gguf"]).forward(ids, logits_to_keep=len(ids))
    for isa in each_isa:
        kernels.use(isa)
        native = OVModel(tmp_path / "gguf-native", settings["gguf-native"])
        assert native.fused == 0  # fused once, when converted (below), not at each load
        logits = native.forward(ids, logits_to_keep=len(ids))
        assert np.abs(logits - exact).mean() <= 0.05 * np.abs(exact).mean(), isa  # 2.8 % on this random model
        assert (logits.argmax(-1) == exact.argmax(-1)).mean() >= 0.9, isa


def test_a_trimmed_native_head_scores_the_kept_tokens_as_the_whole_head_does(tmp_path):
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "llama")  # an LM head of its own
    settings = ModelSettings(str(gguf), precision="gguf-native")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    kept = np.array([3, 17, 40, 41, 200])
    whole = OVModel(tmp_path / "ir", settings).forward([40, 41, 42])
    trimmed = OVModel(tmp_path / "ir", settings, head_ids=kept)
    assert trimmed.head_tokens == len(kept)
    assert np.allclose(trimmed.forward([40, 41, 42]), whole[:, kept], rtol=1e-5, atol=1e-5)


def whole_and_a_third(tmp_path, arch: str = "llama") -> tuple[OVModel, OVModel]:
    """A tiny GGUF's model on our kernels, with its whole LM head and with a head of every third row (many of the whole
    head's choices fall outside it)."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", arch)
    settings = ModelSettings(str(gguf), precision="gguf-native")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    whole = OVModel(tmp_path / "ir", settings)
    return whole, OVModel(tmp_path / "ir", settings, head_ids=np.arange(0, whole.vocab_size, 3))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # an LM head of its own; the embedding's, tied
def test_a_trimmed_native_head_takes_its_other_rows_where_unsure_and_chooses_as_the_whole_head(tmp_path, monkeypatch,
                                                                                                arch):
    from specdemo.models import split_head
    from specdemo.results.counterfactual import greedy_choices

    whole, trimmed = whole_and_a_third(tmp_path, arch)
    kept, prompt, text = trimmed.head_ids, [5, 6, 7], list(range(40, 80))
    expected = greedy_choices(whole, prompt, text)
    assert list(trimmed.other_rows.ids) == sorted(set(range(whole.vocab_size)) - set(kept.tolist()))
    monkeypatch.setattr(split_head, "REST_BELOW", 0.0)  # never unsure, never foreign: the kept rows alone
    monkeypatch.setattr(split_head, "FOREIGN_SHARE", 1.01)
    alone = greedy_choices(trimmed, prompt, text)
    assert set(alone.tolist()) <= set(kept.tolist()) and (alone != expected).any()
    monkeypatch.setattr(split_head, "REST_BELOW", 1.01)  # always unsure: every row, the other rows' logits the head's
    rows_before = trimmed.rest_rows
    assert (greedy_choices(trimmed, prompt, text) == expected).all()
    assert trimmed.rest_rows - rows_before == len(text) - 1
    confidence = greedy_choices(trimmed, prompt, text, with_confidence=True)[1]  # over every row, as the whole head's
    assert np.allclose(confidence, greedy_choices(whole, prompt, text, with_confidence=True)[1], atol=1e-5)
    trimmed.forward(prompt, logits_to_keep=2)
    others = whole.forward(prompt, logits_to_keep=2)[:, trimmed.other_rows.ids]  # the whole head's, on the other rows
    assert np.allclose(trimmed.other_rows.logits(np.array([2, 1]), trimmed._hidden()), others, rtol=1e-5, atol=1e-5)


def test_a_trimmed_native_head_takes_its_other_rows_wherever_the_recent_text_is_off_its_kept_rows(tmp_path,
                                                                                                   monkeypatch):
    from specdemo.models import split_head
    from specdemo.results.counterfactual import greedy_choices

    whole, trimmed = whole_and_a_third(tmp_path)
    kept = trimmed.head_ids
    monkeypatch.setattr(split_head, "REST_BELOW", 0.0)  # never unsure: only the text decides
    foreign = [1, 2, 4, 5, 7, 8, 10, 11, 13, 14] * 3  # no token of it on the kept rows
    native = list(range(0, 90, 3))  # every token on them
    assert (greedy_choices(trimmed, [3], foreign) == greedy_choices(whole, [3], foreign)).all()
    assert trimmed.rest_rows == len(foreign) - 1  # each choice took the other rows
    assert set(greedy_choices(trimmed, [3], native).tolist()) <= set(kept.tolist())
    assert trimmed.rest_rows == len(foreign) - 1  # none did
    # Over the last FOREIGN_WINDOW tokens of the cache, as it stands after a rollback
    trimmed.forward(native + foreign[:split_head.FOREIGN_WINDOW])
    trimmed.rollback(len(native))
    before = trimmed.rest_rows
    trimmed.greedy_ids(trimmed.forward([0]))
    assert trimmed.rest_rows == before  # the foreign tokens rolled back count no more


def test_a_draft_with_a_trimmed_native_head_drafts_the_whole_head_s_choice_where_unsure(tmp_path, monkeypatch):
    from specdemo.decoding.drafters.model import ModelDrafter
    from specdemo.models import split_head
    from specdemo.settings import GenerationSettings

    whole, trimmed = whole_and_a_third(tmp_path)
    def draft(model):  # 8 greedy drafts after [5, 6, 7]
        return ModelDrafter(model, GenerationSettings(), np.random.default_rng(0)).propose([5, 6, 7], 8)

    expected = draft(whole).tokens
    monkeypatch.setattr(split_head, "REST_BELOW", 1.01)  # unsure everywhere: the other rows at every step
    proposal = draft(trimmed)
    assert proposal.tokens == expected and any(t % 3 for t in expected)  # choices off the kept rows among them
    assert all(seconds > 0 for _, seconds in proposal.calls)  # each step's seconds count its other rows' call
    trimmed.reset()
    monkeypatch.setattr(split_head, "REST_BELOW", 0.0)
    monkeypatch.setattr(split_head, "FOREIGN_SHARE", 1.01)
    assert all(t % 3 == 0 for t in draft(trimmed).tokens)  # never unsure, never foreign: the kept rows alone


def test_a_sampled_draft_with_a_trimmed_native_head_draws_from_the_whole_head_where_its_other_rows_are_wanted(
        tmp_path, monkeypatch):
    from specdemo.decoding.drafters.model import ModelDrafter
    from specdemo.models import split_head
    from specdemo.settings import GenerationSettings

    whole, trimmed = whole_and_a_third(tmp_path)
    def draft(model):  # 8 sampled drafts after [3, 6, 9], the same draws
        sampled = GenerationSettings(temperature=1.5, top_k=0, top_p=1.0)
        return ModelDrafter(model, sampled, np.random.default_rng(0)).propose([3, 6, 9], 8)

    expected = draft(whole)
    monkeypatch.setattr(split_head, "REST_BELOW", 1.01)  # wanted everywhere: q over every row, the whole head's
    proposal = draft(trimmed)
    assert proposal.tokens == expected.tokens and any(t % 3 for t in expected.tokens)
    assert np.allclose(proposal.q, expected.q, atol=1e-5)
    trimmed.reset()
    monkeypatch.setattr(split_head, "REST_BELOW", 0.0)
    monkeypatch.setattr(split_head, "FOREIGN_SHARE", 1.01)
    rows = draft(trimmed).q  # never wanted: q over the kept rows alone, zero off them
    assert np.allclose(rows.sum(axis=1), 1.0) and not rows[:, trimmed.other_rows.ids].any()


def test_a_native_model_on_a_machine_without_the_kernels_is_refused_in_a_sentence(tmp_path, monkeypatch):
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    monkeypatch.setattr(kernels, "unavailable", lambda: "specdemo's kernels are not installed (…)")
    with pytest.raises(RuntimeError, match=r"at gguf-native runs on specdemo's kernels: specdemo's kernels are not"):
        OVModel(tmp_path / "ir", ModelSettings(str(gguf), precision="gguf-native"))


def test_the_bench_measures_a_layer_on_every_isa_beside_the_plugin_and_reports_it(tmp_path):
    from specdemo.bench.kernels import Kernels, kernels_section, measure_layer

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    layer = measure_layer(gguf, "ffn_up", rows_per_call=(1, 3), repeats=2, log=lambda line: None)
    simd = [isa for isa in kernels.supported_isas() if isa != "scalar"]  # the tiny file's ffn_up is Q8_0
    assert set(layer.ways) >= {"gguf-mixed", "blocks/scalar", *(f"blocks/{isa}" for isa in simd)}
    assert "blocks/avx512/dots" in layer.ways or "avx512" not in simd  # the gemm beside the dot products
    assert layer.layers == tiny_gguf.LAYERS and layer.bandwidth_gbs > 0
    assert all(r[m].ms > 0 and r[m].bytes > 0 for r in layer.ways.values() for m in (1, 3))
    report = kernels_section(Sections(kernels=Kernels(kernels.supported_isas(), [layer])), {})
    assert "| blocks/scalar |" in report and "M = 3" in report


def test_genai_s_lane_on_a_native_model_is_refused_in_a_sentence(tmp_path):
    from specdemo import errors
    from specdemo.run import genai

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    with pytest.raises(errors.GenAIError, match=r"^OpenVINO GenAI cannot run ir: its weights are laid out for specdemo's "
                                                 r"own kernels \(gguf-native or gguf-q4\)"):
        genai.make_pipeline(tmp_path / "ir", "CPU", {})
