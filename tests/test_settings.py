"""Settings refuse impossible values with a sentence, before any model runs."""

import math

import pytest

from specdemo.settings import GenerationSettings, ModelSettings


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("k", 0, "k must be between 1 and 64"),
        ("k", 65, "k must be between 1 and 64"),
        ("max_new_tokens", -1, "max_new_tokens must be between"),
        ("temperature", math.nan, "temperature must be in"),
        ("temperature", -0.5, "temperature must be in"),
        ("top_p", 0.0, "top_p must be in"),
        ("top_p", 1.5, "top_p must be in"),
        ("top_k", -3, "top_k must be between"),
        ("seed", -1, "seed must be between"),
        ("drafter", "telepathy", "drafter must be one of"),
        ("k", 2.5, "k must be a whole number"),
    ],
)
def test_bad_generation_settings_are_refused_with_a_message(field, value, words):
    with pytest.raises(ValueError, match=words):
        GenerationSettings(**{field: value})


def test_adaptive_k_must_start_inside_its_bounds():
    with pytest.raises(ValueError, match="between k_min"):
        GenerationSettings(k=9, adaptive=True, k_max=8)


def test_defaults_are_greedy_with_four_draft_tokens():
    settings = GenerationSettings()
    assert settings.greedy and settings.k == 4 and settings.drafter == "model"


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp16, int8, int4"):
        ModelSettings("x", precision="int3")


def test_named_configurations_say_which_models_ran():
    from dataclasses import replace

    from specdemo.cli import build_parser, settings_from
    from specdemo.settings import CONFIGURATIONS, RunSettings

    assert RunSettings().configuration == "faithful"
    fastest = settings_from(build_parser().parse_args(["generate", "hi", "--configuration", "fastest"]))
    assert fastest.target.precision == "int4" and fastest.configuration == "fastest"
    assert (fastest.target, fastest.draft) == CONFIGURATIONS["fastest"]
    overridden = settings_from(build_parser().parse_args(["generate", "hi", "--configuration", "fastest",
                                                          "--target-precision", "int8"]))
    assert overridden.configuration == "faithful"  # an explicit precision wins, and the name follows the models
    assert RunSettings(replace(RunSettings().target, precision="fp16")).configuration == "custom"
