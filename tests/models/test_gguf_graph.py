"""A GGUF file straight to an IR folder, without torch (specdemo/models/gguf_file.py, gguf_graph.py, gguf_metadata.py,
export.from_gguf): on tiny Qwen2 and Llama files written here, the metadata reads as gguf-py reads it; the built graph
computes transformers' logits for the same file (a Llama file's permuted q/k rows restored, which an unrestored one
would not); every precision converts in a process where torch cannot be imported, into a folder the runtime, the
tokenizer and OpenVINO GenAI's pipeline (with a draft too) load; a file of another architecture is refused the gguf
precisions with a sentence."""

from pathlib import Path

import numpy as np
import pytest

from specdemo.models import export, gguf_import, sources
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf

TEXT = "def the test of the thing"


def _quiet(fraction, message):
    pass


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny_file(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    return tiny_gguf.write(folder / "tiny.gguf", request.param)


def exact(folder: Path) -> OVModel:
    return OVModel(folder, ModelSettings(str(folder), precision="gguf", inference_precision="f32", kv_cache_precision="f32",
                                         dynamic_quantization_group_size=0))


def transformers_logits(gguf: Path, ids: list[int]) -> np.ndarray:
    """(len(ids), V): transformers' own model of the GGUF (its loading restores a Llama file's q/k rows), in f32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_the_metadata_and_tensors_read_as_gguf_py_reads_them(tiny_file):
    import gguf

    ours, theirs = GGUFFile(tiny_file), gguf.GGUFReader(tiny_file)
    assert ours.fields == {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    for tensor in theirs.tensors:
        mine = ours.tensors[tensor.name]
        assert mine.kind == tensor.tensor_type.name and np.array_equal(mine.data, tensor.data)


def test_the_built_graph_computes_transformers_logits(tiny_file, tmp_path):
    from transformers import AutoTokenizer

    export.from_gguf(GGUFFile(tiny_file), "gguf", tmp_path / "ir", _quiet)
    ids = AutoTokenizer.from_pretrained(tmp_path / "ir").encode(TEXT)
    ours, theirs = exact(tmp_path / "ir").forward(ids, logits_to_keep=len(ids)), transformers_logits(tiny_file, ids)
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()


def constants(folder: Path) -> list[tuple[str, tuple, bytes]]:
    """Every Constant of the folder's IR as (element type, shape, values as bytes), sorted: the weights, whatever the
    node names (4-bit values unpacked: an odd count's last byte holds a nibble that is no value)."""
    import openvino as ov

    def values(node) -> bytes:
        data = node.get_tensor_view().data
        if node.get_output_element_type(0) not in (ov.Type.u4, ov.Type.i4):
            return data.tobytes()
        nibbles = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(-1)
        return nibbles[:int(np.prod(node.get_output_shape(0)))].tobytes()

    model = ov.Core().read_model(folder / "openvino_model.xml")
    return sorted((str(node.get_output_element_type(0)), tuple(node.get_output_shape(0)), values(node))
                  for node in model.get_ordered_ops() if node.get_type_name() == "Constant")


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_tensor_compressed_in_parts_of_rows_gets_the_weights_it_gets_whole(tiny_file, tmp_path, monkeypatch, precision):
    export.from_gguf(GGUFFile(tiny_file), precision, tmp_path / "whole", _quiet)
    calls = []
    compress = export.compress_weights
    monkeypatch.setattr(export, "compress_weights", lambda model, p: calls.append(p) or compress(model, p))
    monkeypatch.setattr(gguf_import, "PART_ROWS", 16)
    monkeypatch.setattr(gguf_import, "BATCH_BYTES", 4 * tiny_gguf.HIDDEN * 96)  # the embedding's 265 rows in 3 parts
    export.from_gguf(GGUFFile(tiny_file), precision, tmp_path / "parts", _quiet)
    assert len(calls) > 3  # the embedding went in parts
    assert constants(tmp_path / "parts") == constants(tmp_path / "whole")


def test_a_llama_file_read_in_its_own_row_order_would_compute_other_logits(tmp_path, monkeypatch):
    """What the check and the restoring stand between: the permutation changes the logits beyond any rounding."""
    gguf = tiny_gguf.write(tmp_path / "llama.gguf", "llama")
    monkeypatch.setattr(gguf_import, "hf_row_order", lambda rows, heads: np.arange(rows))
    monkeypatch.setattr(gguf_import._FileWeights, "check", lambda self, name, ours, rows: None)
    export.from_gguf(GGUFFile(gguf), "gguf", tmp_path / "ir", _quiet)
    ids = list(range(3, 20))
    ours, theirs = exact(tmp_path / "ir").forward(ids, logits_to_keep=len(ids)), transformers_logits(gguf, ids)
    assert np.abs(ours - theirs).max() > 0.1 * np.abs(theirs).max()


def test_the_gguf_precisions_of_an_architecture_not_built_here_are_refused_with_a_sentence(home, tmp_path):
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "phi3")  # transformers' torch path may take it; the graph here does not
    settings = ModelSettings(str(gguf), precision="gguf-mixed")
    folder = sources.cached_folder(settings)
    folder.parent.mkdir(parents=True)
    with pytest.raises(sources.ModelSourceError, match=r"its architecture is phi3; the graph is built for qwen2, llama; "
                                                       r"choose fp16, int8, int4"):
        export.convert(settings, folder, _quiet)
    assert not folder.exists()


def test_the_folder_holds_what_specdemo_reads(tmp_path):
    import json

    from specdemo.models.loading import _count_parameters

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-mixed", tmp_path / "ir", _quiet)
    config = json.loads((tmp_path / "ir" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"], config["max_position_embeddings"]) == \
        (tiny_gguf.LAYERS, tiny_gguf.HIDDEN, len(tiny_gguf.vocabulary()[0]), 256)
    assert _count_parameters(config) > 0
    assert {"tokenizer.json", "tokenizer_config.json", "openvino_tokenizer.xml", "openvino_detokenizer.xml"} <= \
        {f.name for f in (tmp_path / "ir").iterdir()}
    tokens = tiny_gguf.vocabulary()[0]
    assert json.loads((tmp_path / "ir" / "generation_config.json").read_text())["eos_token_id"] == tokens.index("<|im_end|>")


def test_a_folder_for_specdemos_kernels_alone_has_no_openvino_tokenizer_as_genai_never_loads_it(tmp_path):
    """gguf-native runs on specdemo's kernels only (GenAI's lane takes a plugin layout): its conversion, on a first
    start's 2 cores beside the draft's, leaves out the OpenVINO tokenizer's 3.5 CPU-s."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", _quiet)
    written = {f.name for f in (tmp_path / "ir").iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "openvino_model.xml"} <= written
    assert not {"openvino_tokenizer.xml", "openvino_detokenizer.xml"} & written


def test_the_runtime_rolls_back_on_the_built_graph_exactly(tiny_file, tmp_path):
    export.from_gguf(GGUFFile(tiny_file), "gguf-mixed", tmp_path / "ir", _quiet)
    model = exact(tmp_path / "ir")

    def greedy(feed, steps):
        out = []
        for _ in range(steps):
            out.append(int(model.forward(feed)[0].argmax()))
            feed = [out[-1]]
        return out

    prompt = list(range(3, 12))
    plain = greedy(prompt, 12)
    model.reset()
    greedy(prompt, 10)
    model.rollback(len(prompt) + 5)
    assert greedy([plain[5]], 6) == plain[6:12]


def test_openvino_genai_runs_the_built_folder_as_our_runtime_does_with_a_draft_too(tmp_path):
    import openvino as ov
    import openvino_genai

    from specdemo.run import genai

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "int8", tmp_path / "ir", _quiet)
    prompt = list(range(3, 12))
    model = exact(tmp_path / "ir")
    ours, feed = [], prompt
    for _ in range(8):
        ours.append(int(model.forward(feed)[0].argmax()))
        feed = [ours[-1]]
    exact_compile = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    for draft in (None, tmp_path / "ir"):  # plain, and speculative with the model as its own draft
        pipeline = genai.make_pipeline(tmp_path / "ir", "CPU", exact_compile, draft=draft)
        config = openvino_genai.GenerationConfig(max_new_tokens=8)
        config.apply_chat_template, config.ignore_eos = False, True
        if draft is not None:
            config.num_assistant_tokens = 3
        result = pipeline.generate(ov.Tensor(np.asarray([prompt], dtype=np.int64)), config)
        assert list(result.tokens[0]) == ours
