"""Bad input at the engine, in the settings and from the page's values: refused with a sentence, or run
to a well-formed end. Tiny random models for what decodes (fast and exact). Figures: docs/reliability.md.
"""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from specdemo.decoding.drafters import STRATEGIES as DRAFTERS
from specdemo.decoding.drafters import checked
from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy
from specdemo.text import clean_instruction
from specdemo.serve.values import MAX_NEW_TOKENS_CAP, PageValues
from tests.hostile_text import ANY_TEXT, FAST

PROMPT = "w5 w17 w99 w3 w250 w42 w7"
SHORT = GenerationSettings(max_new_tokens=16)
SETTINGS_FIELDS = ["max_new_tokens", "temperature", "top_k", "top_p", "seed", "drafter", "lookup_ngram"]
K_FIELDS = ["rule", "k", "k_min", "k_max"]


def _whole_in(value, low, high) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def assert_well_formed(settings: GenerationSettings) -> None:
    """Every field of accepted settings is of its type and inside its range."""
    assert _whole_in(settings.max_new_tokens, 1, 100_000)
    assert not isinstance(settings.temperature, bool) and 0.0 <= settings.temperature <= 100.0  # also: not NaN
    assert _whole_in(settings.top_k, 0, 10_000_000)
    assert not isinstance(settings.top_p, bool) and 0.0 < settings.top_p <= 1.0
    assert settings.seed is None or _whole_in(settings.seed, 0, 2**63 - 1)
    assert settings.drafter in DRAFTERS and _whole_in(settings.lookup_ngram, 1, 16)
    assert_well_formed_k(settings.k_policy)


def assert_well_formed_k(policy: KPolicy) -> None:
    assert policy.rule in ("fixed", "adaptive", "auto")
    assert _whole_in(policy.k, 1, 64) and _whole_in(policy.k_min, 1, 64)
    assert _whole_in(policy.k_max, policy.k_min, 64) and (policy.k <= policy.k_max or policy.rule == "auto")


@pytest.mark.parametrize("instruction", ["", " ", "\n\t \r\n", "\u3000\u2003", None])
def test_an_empty_or_blank_instruction_is_refused(tiny_engine, instruction):
    with pytest.raises(ValueError, match="^the instruction is empty$"):
        tiny_engine.prompt_ids(instruction, SHORT)


def test_lone_surrogates_become_replacement_characters_and_pairs_their_character():
    assert clean_instruction("a\ud800b\udcff") == "a\ufffdb\ufffd"  # \udcff: an invalid byte from a command line
    assert clean_instruction("\ud83d\ude42") == "🙂"


def test_control_characters_emoji_and_cjk_are_kept_as_typed():
    text = "tab\there\x00nul\x1b[31mred\x7f\u202e 🙂 你好"
    assert clean_instruction(text) == text


@FAST
@given(instruction=ANY_TEXT)
def test_any_text_gives_prompt_ids_or_the_empty_instruction_sentence(tiny_engine, instruction):
    try:
        ids = tiny_engine.prompt_ids(instruction, SHORT)
    except ValueError as error:
        assert str(error) == "the instruction is empty" and not instruction.strip()
        return
    assert ids and all(0 <= i < len(tiny_engine.tokenizer) for i in ids)


@examples(max_examples=15, deadline=None)
@given(instruction=ANY_TEXT.filter(str.strip), k=st.integers(1, 64), max_new_tokens=st.integers(1, 24))
def test_any_instruction_and_k_run_to_the_end_and_speculation_stays_exact(tiny_engine, instruction, k, max_new_tokens):
    settings = GenerationSettings(max_new_tokens=max_new_tokens, k_policy=KPolicy.fixed(k))
    spec = drain(tiny_engine.speculative(instruction, settings))
    ar = drain(tiny_engine.autoregressive(instruction, settings))
    assert spec.ids == ar.ids
    for run in (spec, ar):
        assert 0 < run.summary.tokens == len(run.ids) <= max_new_tokens
        assert run.summary.stop_reason == ("eos" if run.ids[-1] in tiny_engine.eos_ids else "max_new_tokens")
        assert run.summary.stop_reason == "eos" or len(run.ids) == max_new_tokens


@FAST
@given(field=st.sampled_from(SETTINGS_FIELDS),
       value=st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                       st.booleans(), st.text(max_size=5)))
def test_any_setting_is_accepted_or_refused_with_a_sentence(field, value):
    try:
        settings = checked(GenerationSettings(**{field: value}))  # as the edges take a user's settings
    except ValueError as error:
        assert str(error).split()[0] in SETTINGS_FIELDS and " must " in str(error)
        return
    assert_well_formed(settings)
    assert getattr(settings, field) == value


@FAST
@given(field=st.sampled_from(K_FIELDS),
       value=st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                       st.booleans(), st.text(max_size=5), st.sampled_from(["fixed", "adaptive", "auto"])))
def test_any_k_policy_is_accepted_or_refused_with_a_sentence(field, value):
    try:
        policy = KPolicy(**{field: value})
    except ValueError as error:
        assert str(error).split()[0] in K_FIELDS + ["the"] and " must " in str(error)
        return
    assert_well_formed_k(policy)
    if field != "k_max":  # a k_max of None is derived from k
        assert getattr(policy, field) == value


@FAST
@given(max_new_tokens=st.one_of(st.floats(allow_nan=True), st.integers(-5, 5000), st.none(), st.text(max_size=3)),
       k=st.one_of(st.floats(allow_nan=True), st.integers(-5, 100), st.none()),
       temperature=st.one_of(st.floats(allow_nan=True), st.none(), st.text(max_size=3)),
       top_p=st.one_of(st.floats(allow_nan=True), st.none()),
       seed=st.one_of(st.floats(allow_nan=True), st.integers(-5, 2**70), st.none(), st.just("")))
def test_any_page_values_become_settings_or_a_sentence(max_new_tokens, k, temperature, top_p, seed):
    values = PageValues(max_new_tokens=max_new_tokens, k=k, k_auto=False, adaptive=False, drafter="model",
                        decoding="sampling", temperature=temperature, top_p=top_p, top_k=50.0, seed=seed)
    try:
        settings = values.generation()
    except ValueError as error:
        assert str(error).split()[0] in {"max_new_tokens", "max", "k", "k_max", "temperature", "top_p", "seed"}
        return
    assert_well_formed(settings)
    # What the page sent is what runs: sliders' 48.0 becomes 48, nothing is clamped or replaced.
    assert settings.max_new_tokens == max_new_tokens <= MAX_NEW_TOKENS_CAP and settings.k_policy.k == k
    assert (settings.temperature, settings.top_p, settings.top_k) == (temperature, top_p, 50)
    assert settings.seed == (None if seed in (None, "") else seed)


def test_a_chat_template_that_rewrites_the_instruction_is_refused(tiny_engine, tiny_target):
    from transformers import AutoTokenizer

    shouting = AutoTokenizer.from_pretrained(tiny_target)
    shouting.chat_template = "{% for m in messages %}{{ m['content'] | upper }} {% endfor %}"
    with pytest.raises(ValueError, match="does not copy the instruction verbatim"):
        Engine(replace(tiny_engine.target, tokenizer=shouting), None).prompt_ids(PROMPT, SHORT)
