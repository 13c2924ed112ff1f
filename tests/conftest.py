"""Shared fixtures: tiny random-weight models exported with optimum-intel, made inside the tests."""

import os
from pathlib import Path

import pytest

from specdemo import compat, sources

TINY_VOCAB = 512

compat.hide_broken_torchvision()  # before anything here imports transformers or optimum

# Test runs (tiny random models, short answers, odd instructions) must not teach the planner's α prior
# what to expect of the user's runs; subprocesses inherit this too.
os.environ["SPECDEMO_LEARN_ALPHA"] = "0"


def make_tiny_hf_model(folder: Path, seed: int) -> Path:
    """A 2-layer Qwen2 with random weights and a word-level tokenizer, saved as a Hugging Face folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.4,  # large weights spread the logits: fewer accidental near-ties
        eos_token_id=1,
    )
    Qwen2ForCausalLM(config).eval().save_pretrained(folder)
    vocab = {"<unk>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, TINY_VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    return folder


def export_tiny_model(folder: Path, seed: int) -> Path:
    """The tiny model exported to a stateful OpenVINO IR folder (about 10 s)."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    hf = make_tiny_hf_model(folder / "hf", seed)
    main_export(str(hf), folder / "ov", task="text-generation-with-past", ov_config=OVConfig())
    return folder / "ov"


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return export_tiny_model(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    return export_tiny_model(tmp_path_factory.mktemp("tiny-draft"), seed=1)


def pytest_configure(config):
    # torch.jit tracing during optimum-intel export warns about every traced shape check.
    config.addinivalue_line("filterwarnings", "ignore::torch.jit.TracerWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
