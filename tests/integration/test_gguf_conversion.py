"""A GGUF file straight to an IR folder, without torch (specdemo/models/gguf_file.py, gguf_graph.py, gguf_metadata.py,
export.from_gguf): on tiny Qwen2 and Llama files written here, the metadata reads as gguf-py reads it; the built graph
computes transformers' logits for the same file (a Llama file's permuted q/k rows restored, which an unrestored one
would not); every precision converts in a process where torch cannot be imported, into a folder the runtime, the
tokenizer and OpenVINO GenAI's pipeline (with a draft too) load; a file of another architecture is refused the gguf
precisions with a sentence.

The real-model, browser and slow tests of tests/models/test_gguf_graph.py, which holds the fast ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.models import kernels, sources
from specdemo.models.runtime import OVModel
from specdemo.settings import PRECISIONS, ModelSettings
from tests import tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
TEXT = "def the test of the thing"


def exact(folder: Path) -> OVModel:
    return OVModel(folder, ModelSettings(str(folder), precision="gguf", inference_precision="f32", kv_cache_precision="f32",
                                         dynamic_quantization_group_size=0))


# Started with torch made unimportable in every Python process it starts (the conversion child included).
_NO_TORCH = "import sys\nsys.modules['torch'] = None  # a GGUF's conversion must not need torch\n"
_PREPARE_EACH = """
import sys
from specdemo.models import sources
from specdemo.settings import ModelSettings
for precision in sys.argv[2:]:
    sources.prepare(ModelSettings(sys.argv[1], precision=precision), lambda fraction, message: None)
"""
WEIGHT_TYPES = {"fp16": {"f16"}, "int8": {"u8"}, "int4": {"u4"}, "gguf": {"i8"}, "gguf-mixed": {"i8"},
                "gguf-native": {"u8"}, "gguf-q4": {"u8"}}  # the file's raw blocks, or them in 4 bits
REQUANTIZED = ("gguf-q4",)  # a draft's precision: the file's blocks in 4 bits, scored as that file in tests/models


@pytest.mark.slow  # NNCF and transformers' tokenizer conversion imported in a fresh child for each of seven precisions
def test_every_precision_of_a_gguf_converts_in_processes_without_torch(home, tmp_path):
    from transformers import AutoTokenizer

    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    (tmp_path / "no_torch").mkdir()
    (tmp_path / "no_torch" / "sitecustomize.py").write_text(_NO_TORCH)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'no_torch'}{os.pathsep}{ROOT}"}
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert "ModuleNotFoundError" in check.stderr or "ImportError" in check.stderr  # the block holds
    result = subprocess.run([sys.executable, "-c", _PREPARE_EACH, str(gguf), *PRECISIONS], env=env, capture_output=True,
                            text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(sources.cached_folder(ModelSettings(str(gguf), precision="int8")))
    ids = tokenizer.encode(TEXT)
    reference = exact(sources.cached_folder(ModelSettings(str(gguf), precision="gguf"))).forward(ids)
    for precision in PRECISIONS:
        folder = sources.cached_folder(ModelSettings(str(gguf), precision=precision))
        assert (folder / sources.COMPLETE_MARKER).is_file()
        model = kernels.new_core().read_model(folder / "openvino_model.xml")
        weights = {op.get_element_type().get_type_name() for op in model.get_ops()
                   if op.get_type_name() == "Constant" and len(op.get_output_shape(0)) >= 2}
        assert WEIGHT_TYPES[precision] <= weights, (precision, weights)
        assert AutoTokenizer.from_pretrained(folder).encode(TEXT) == ids
        if precision in REQUANTIZED:
            continue  # random weights in 4 bits: its choice is the re-quantized file's (models/test_requantize.py)
        logits = exact(folder).forward(ids)
        assert logits.argmax() == reference.argmax(), precision  # the tiny model's choice survives every other one


@pytest.mark.real_models
@pytest.mark.slow  # converts the 1.5B target twice (about a minute each on 2 cores) and scores 285 positions twice
def test_the_default_target_converts_without_torch_and_keeps_the_ggufs_choices(home, tmp_path):
    from specdemo.learning import builtin, tune
    from specdemo.models.chat import encode_example
    from specdemo.results import fidelity
    from specdemo.models.loading import load_model

    (tmp_path / "no_torch").mkdir()
    (tmp_path / "no_torch" / "sitecustomize.py").write_text(_NO_TORCH)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'no_torch'}{os.pathsep}{ROOT}"}
    result = subprocess.run([sys.executable, "-c", _PREPARE_EACH, "qwen2.5-coder-1.5b", "gguf", "gguf-mixed"], env=env,
                            capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    target = ModelSettings("qwen2.5-coder-1.5b", precision="gguf-mixed")
    reference = load_model(fidelity.reference_settings(target))
    examples = [encode_example(reference.tokenizer, e) for e in builtin.code_answers()]
    logits = fidelity.reference_logits(reference.runtime, examples, 16)
    del reference
    positions, agreement, error = fidelity.compare(logits, tune.compile_model(target), examples, 16)
    assert positions > 200 and agreement >= 0.98 and error < 0.1  # the torch path's gguf-mixed: 100 %, 0.044
