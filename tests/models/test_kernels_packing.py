"""A BlockMatMul packs its blocks into the gemm's panels at its first call (kernels/src/block_matmul.cpp), and OVModel
makes that call while it loads a gguf-native model (issue 61): no prompt, a visitor's first above all, pays for it."""

import numpy as np
import pytest

from specdemo.models import export, kernels
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings
from tests import tiny_gguf

pytestmark = pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable()))


@pytest.fixture
def native(tmp_path):
    """A tiny GGUF converted to gguf-native: its folder and settings."""
    gguf = tiny_gguf.write(tmp_path / "tiny.gguf", "qwen2")
    export.from_gguf(GGUFFile(gguf), "gguf-native", tmp_path / "ir", lambda *_: None)
    return tmp_path / "ir", ModelSettings(str(gguf), precision="gguf-native")


def test_a_native_model_packs_its_weights_while_it_loads_and_never_at_a_prompt(native):
    if not kernels.gemm_kinds():
        pytest.skip(f"the {kernels.isa()} path has no gemm, so nothing is packed")
    before = kernels.packings()
    model = OVModel(*native)
    loaded = kernels.packings()
    assert loaded > before
    model.forward(list(range(40, 60)))  # a prompt's prefill, then a step
    model.forward([7])
    assert kernels.packings() == loaded


def test_a_loaded_native_model_starts_with_an_empty_cache_and_no_calls(native):
    model = OVModel(*native)
    assert (model.length, model.calls) == (0, 0)


def test_a_native_model_packed_at_load_scores_a_prompt_as_one_packed_at_the_prompt(native, monkeypatch):
    """The packing call leaves nothing behind in the cache: the first prompt's logits are those of a model whose first
    call is that prompt."""
    ids = list(range(40, 60))
    packed = OVModel(*native).forward(ids, logits_to_keep=len(ids))
    monkeypatch.setattr(OVModel, "_pack", lambda self: None)
    lazy = OVModel(*native).forward(ids, logits_to_keep=len(ids))
    assert np.array_equal(packed, lazy)
