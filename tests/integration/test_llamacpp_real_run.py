"""The llama.cpp peer (specdemo/bench/llamacpp.py) and its bench section: skipped in one line without
llama_cpp, its figures paired by the lanes' fields, and a short real run on the target GGUF.

The real-model, browser and slow tests of tests/bench/test_llamacpp.py, which holds the fast ones."""

import pytest

from specdemo.bench import llamacpp
from specdemo.settings import RunSettings


@pytest.mark.real_models
@pytest.mark.slow
def test_llama_cpp_generates_from_our_prompt_ids_on_the_target_gguf(real_engine):
    pytest.importorskip("llama_cpp")
    settings = RunSettings()
    ids = real_engine.prompt_ids("Write a Python function that reverses a string.", settings.generation)
    peer = llamacpp.LlamaCppPeer(llamacpp.gguf_path(settings.target.source))

    run = peer.generate(ids, 8, real_engine.eos_ids)

    assert len(run.ids) == 8
    assert all(0 <= token < len(real_engine.target.tokenizer) for token in run.ids)
    assert real_engine.target.tokenizer.decode(run.ids).strip()  # text, not nothing
