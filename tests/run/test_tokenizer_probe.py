"""The tokenizer probe: a draft can draft for a target only if both tokenizers map text to the same ids.
The engine refuses any other pair with a sentence, before a model runs."""

import re
from dataclasses import replace

import pytest

from specdemo.run.engine import Engine, IncompatibleModelsError, check_same_tokenizer


def word_tokenizer(words: list[str]):
    """A word-level tokenizer whose ids are the positions of `words` (the first is the unknown word)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0]))
    vocabulary.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=vocabulary, unk_token=words[0])


def test_the_same_tokenizer_passes_the_probe(tiny_target):
    from transformers import AutoTokenizer

    check_same_tokenizer(AutoTokenizer.from_pretrained(tiny_target), AutoTokenizer.from_pretrained(tiny_target))
    check_same_tokenizer(word_tokenizer(["?", "def", "Hello"]), word_tokenizer(["?", "def", "Hello"]))


def test_a_tokenizer_of_another_size_is_refused_with_a_sentence(tiny_pair):
    message = ("the draft model's tokenizer has 3 tokens and the target's 512: draft tokens would not be target "
               "tokens; pick a draft from the same model family")
    with pytest.raises(IncompatibleModelsError, match=f"^{re.escape(message)}$"):
        check_same_tokenizer(tiny_pair[0].tokenizer, word_tokenizer(["?", "def", "Hello"]))


def test_a_tokenizer_of_the_same_size_that_encodes_differently_is_refused_with_a_sentence():
    message = ("the draft model's tokenizer encodes 'def fibonacci(n):\\n    return n' differently from the "
               "target's; pick a draft from the same model family")
    with pytest.raises(IncompatibleModelsError, match=f"^{re.escape(message)}$"):
        check_same_tokenizer(word_tokenizer(["?", "def", "Hello"]), word_tokenizer(["?", "Hello", "def"]))


def test_the_engine_refuses_a_pair_whose_tokenizers_differ(tiny_pair):
    target, draft = tiny_pair
    Engine(target, draft)  # the tiny pair shares one tokenizer
    with pytest.raises(IncompatibleModelsError, match="^the draft model's tokenizer has 3 tokens"):
        Engine(target, replace(draft, tokenizer=word_tokenizer(["?", "def", "Hello"])))
