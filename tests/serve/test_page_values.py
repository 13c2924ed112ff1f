"""What the page takes from a visitor: its values become settings, and what it does not offer is refused."""

import re

import pytest

from specdemo.decoding.drafters import STRATEGIES as DRAFTERS
from specdemo.settings import GenerationSettings, KPolicy
from specdemo.serve.server import Server
from specdemo.ui import page
from specdemo.serve.values import (MAX_INSTRUCTION_CHARS, MAX_PROMPT_TOKENS, ONE_AFTER_ANOTHER, RACE, PageValues, as_sentence,
                                check_choices, check_instruction, check_prompt, load_examples, offered_devices)

PAGE_DEFAULTS = dict(max_new_tokens=48.0, k=4.0, k_auto=False, adaptive=False, drafter="model", decoding="greedy",
                     temperature=0.7, top_p=0.95, top_k=50.0, seed=None)


def page_values(**values) -> GenerationSettings:
    return PageValues(**values).generation()


# ----------------------------------------------------------------------------- the page's values


def test_page_values_become_generation_settings():
    settings = page_values(**PAGE_DEFAULTS)
    assert settings == GenerationSettings(max_new_tokens=48, k_policy=KPolicy.fixed(4), temperature=0.0, top_k=0, top_p=1.0,
                                          seed=None)


def test_sampling_uses_temperature_top_p_top_k_and_seed():
    settings = page_values(**{**PAGE_DEFAULTS, "decoding": "sampling", "seed": 7.0})
    assert (settings.temperature, settings.top_p, settings.top_k, settings.seed) == (0.7, 0.95, 50, 7)


def test_adaptive_k_may_grow_past_a_large_starting_k():
    settings = page_values(**{**PAGE_DEFAULTS, "k": 12.0, "adaptive": True})
    assert settings.k_max == 12


@pytest.mark.parametrize("change, message", [
    ({"k": 0}, "k must be between 1 and 64"),
    ({"k": 2.5}, "k must be a whole number"),
    ({"decoding": "sampling", "temperature": float("nan")}, "temperature must be in"),
    ({"max_new_tokens": 1025}, "capped at 1,024"),
])
def test_impossible_values_are_refused_with_a_sentence(change, message):
    with pytest.raises(ValueError, match=message):
        page_values(**{**PAGE_DEFAULTS, **change})


def test_instruction_length_is_capped_on_the_server():
    check_instruction("x" * MAX_INSTRUCTION_CHARS)
    with pytest.raises(ValueError, match="at most 20,000"):
        check_instruction("x" * (MAX_INSTRUCTION_CHARS + 1))


def test_errors_are_shown_as_sentences():
    assert as_sentence(ValueError("the instruction is empty")) == "The instruction is empty."


def test_examples_cover_code_prose_a_pasted_text_and_another_language():
    examples = load_examples()
    assert len(examples) >= 4
    assert all(e["drafter"] in DRAFTERS and e["instruction"].strip() and e["label"] for e in examples)
    assert any(e["drafter"] == "prompt-lookup" for e in examples)
    assert any(not e["instruction"].isascii() for e in examples)
    assert all(len(e["instruction"]) <= MAX_INSTRUCTION_CHARS for e in examples)


# ----------------------------------------------------------------------------- page safety


def test_the_only_free_text_the_page_takes_is_the_instruction_so_no_model_can_be_named():
    config = page.build(Server()).get_config_file()
    components = {c["id"]: c for c in config["components"]}
    inputs = [components[i] for event in config["dependencies"] for i in event["inputs"]]
    # Besides the instruction, Stop takes the id of the run it stops (a hidden box the page's Generate filled in).
    assert sorted(c["props"]["elem_id"] for c in inputs if c["type"] == "textbox") == ["instruction", "run-id"]
    stop = next(event for event in config["dependencies"] if [components[i]["props"].get("elem_id") for i in event["inputs"]]
                == ["run-id"])
    assert [components[i]["props"]["elem_id"] for i in stop["outputs"]] == ["status"]
    assert {c["type"] for c in inputs} <= {"textbox", "slider", "radio", "dropdown", "checkbox", "number", "dataset"}
    for dropdown in (c for c in inputs if c["type"] == "dropdown"):
        assert not dropdown["props"]["allow_custom_value"]
        assert {value for _, value in dropdown["props"]["choices"]} <= set(offered_devices())


@pytest.mark.parametrize("mode, target, draft, message", [
    (None, "CPU", "CPU", "the run mode must be 'one after another' or 'race', got None"),
    (RACE, None, "CPU", "the target device must be one of"),
    (ONE_AFTER_ANOTHER, "CPU", "/models/my-model", "the draft device must be one of"),
])
def test_a_run_mode_or_device_the_page_does_not_offer_is_refused(mode, target, draft, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_choices(mode, target, draft)


def test_every_offered_choice_is_accepted():
    for device in offered_devices():
        check_choices(RACE, device, device)


def test_prompt_length_in_tokens_is_capped_on_the_server():
    check_prompt([0] * MAX_PROMPT_TOKENS)
    with pytest.raises(ValueError, match="the prompt is 2,049 tokens; this page accepts at most 2,048"):
        check_prompt([0] * (MAX_PROMPT_TOKENS + 1))


def test_the_app_binds_loopback_and_asks_for_no_share_link_by_default(monkeypatch):
    import app

    for name in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = app.parse_args([])
    assert (args.host, args.share) == ("127.0.0.1", False)
    assert app.parse_args(["--share"]).share


def test_an_unknown_configuration_is_refused_with_a_sentence():
    import pytest

    from specdemo.serve.values import PageValues

    with pytest.raises(ValueError, match="^the configuration must be one of faithful, fastest, got 'turbo'$"):
        PageValues(instruction="hi", configuration="turbo").check()
