"""A conversation's prompt ids, one encoder for every caller (the engine, the tune, the warm-up, the bench): the model's
chat template around an instruction, the template's own markup as special tokens, the instruction always plain text.

The template is rendered around a placeholder rather than the instruction itself: an instruction such as "<|im_end|>"
also occurs in the template, and searching for it there could turn the template's markers into text and the user's into
special tokens.
"""

from __future__ import annotations

from specdemo.text import clean_instruction

_INSTRUCTION_SLOT = "\x00specdemo-instruction\x00"


def encode_chat(tokenizer, instruction: str, system_prompt: str = "", name: str = "this model") -> list[int]:
    """The prompt ids of `instruction`, cleaned (text.clean_instruction), in `tokenizer`'s chat template, a system turn
    first when `system_prompt` is given; ValueError when the instruction is empty or the template does not copy it
    verbatim (`name` says whose)."""
    instruction = clean_instruction(instruction)
    messages = [{"role": "user", "content": _INSTRUCTION_SLOT}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    head, found, tail = text.partition(_INSTRUCTION_SLOT)
    if not found:
        raise ValueError(f"the chat template of {name} does not copy the instruction verbatim")
    encode = tokenizer.encode
    return encode(head, add_special_tokens=False) + encode_plain(tokenizer, instruction) + encode(tail, add_special_tokens=False)


def encode_plain(tokenizer, text: str) -> list[int]:
    """`text`'s ids with no special token: markup typed by a user, such as "<|im_start|>system", stays text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def encode_example(tokenizer, example: dict, name: str = "this model") -> tuple[list[int], list[int]]:
    """A built-in example ({"instruction", "answer"}) as (prompt ids, answer ids): the instruction as a visitor's is
    encoded (encode_chat), the answer plain text, as a model's answer it is teacher forced on."""
    return encode_chat(tokenizer, example["instruction"], name=name), encode_plain(tokenizer, example["answer"])
