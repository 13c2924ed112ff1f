"""Hypothesis strategies for input as it arrives from anywhere (a page, an API call, a shell)."""

from hypothesis import HealthCheck
from hypothesis import settings as examples
from hypothesis import strategies as st

MARKUP = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "system\n", "user\n", "assistant\n", "You are Qwen"]

# Any code point, lone surrogates and control characters made common, chat markup spliced in, emoji and CJK.
ANY_TEXT = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=()), max_size=12),
        st.characters(categories=["Cs", "Cc"]),
        st.sampled_from(MARKUP + ["🙂", "你好", "\r\n", "\u202e", "\ufeff", " ", "w5"]),
    ),
    max_size=24,
).map("".join)

FAST = examples(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
