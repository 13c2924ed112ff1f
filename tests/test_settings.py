"""Settings refuse impossible values with a sentence, before any model runs."""

import math

import pytest

from specdemo import settings as settings_module
from specdemo.decoding import drafters
from specdemo.settings import KPolicy, GenerationSettings, ModelSettings, PageSettings


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("max_new_tokens", -1, "max_new_tokens must be between"),
        ("temperature", math.nan, "temperature must be in"),
        ("temperature", -0.5, "temperature must be in"),
        ("top_p", 0.0, "top_p must be in"),
        ("top_p", 1.5, "top_p must be in"),
        ("top_k", -3, "top_k must be between"),
        ("seed", -1, "seed must be between"),
        ("k_policy", 4, "k_policy must be a KPolicy"),
    ],
)
def test_bad_generation_settings_are_refused_with_a_message(field, value, words):
    with pytest.raises(ValueError, match=words):
        GenerationSettings(**{field: value})


def test_an_unknown_drafter_is_refused_at_the_edge_with_the_names_there_are():
    # Settings know no registry (they import nothing of specdemo); the edges check a user's drafter by drafters.checked.
    with pytest.raises(ValueError, match="drafter must be one of model, prompt-lookup"):
        drafters.checked(GenerationSettings(drafter="telepathy"))


def test_the_default_drafter_of_the_settings_is_the_registrys_first():
    assert settings_module.DRAFTER == drafters.DEFAULT == GenerationSettings().drafter


@pytest.mark.parametrize("change, words", [
    ({"k": 0}, "k must be between 1 and 64"), ({"k": 65}, "k must be between 1 and 64"),
    ({"k": 2.5}, "k must be a whole number"), ({"rule": "eager"}, "the K rule must be one of fixed, adaptive, auto"),
    ({"k_min": 0}, "k_min must be between"), ({"rule": "adaptive", "k_max": 2}, "between k_min"),
])
def test_a_bad_k_policy_is_refused_with_a_message(change, words):
    with pytest.raises(ValueError, match=words):
        KPolicy(**change)


def test_one_type_holds_the_k_rule_and_its_bounds():
    assert KPolicy.fixed(20).k_max == 20  # a fixed K lifts the ceiling: warm-up measures every shape it uses
    assert KPolicy.auto().k_max == 12 and KPolicy.auto().is_auto and not KPolicy.auto().is_adaptive
    assert KPolicy.adaptive(3, 2, 6) == KPolicy("adaptive", 3, 2, 6) and GenerationSettings(
        k_policy=KPolicy.adaptive(3, 2, 6)).k_max == 6


def test_adaptive_k_must_start_inside_its_bounds():
    with pytest.raises(ValueError, match="between k_min"):
        GenerationSettings(k_policy=KPolicy("adaptive", k=9, k_max=8))


def test_defaults_are_greedy_with_four_draft_tokens():
    settings = GenerationSettings()
    assert settings.greedy and settings.k_policy == KPolicy.fixed(4) and settings.drafter == "model"


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp16, int8, int4"):
        ModelSettings("x", precision="int3")


def test_named_configurations_say_which_models_ran():
    from dataclasses import replace

    from specdemo.cli.commands import build_parser, settings_from
    from specdemo.settings import CONFIGURATIONS, RunSettings

    assert RunSettings().configuration == "faithful"
    fastest = settings_from(build_parser().parse_args(["generate", "hi", "--configuration", "fastest"]))
    assert fastest.target.precision == "int4" and fastest.configuration == "fastest"
    assert (fastest.target, fastest.draft) == CONFIGURATIONS["fastest"]
    overridden = settings_from(build_parser().parse_args(["generate", "hi", "--configuration", "fastest",
                                                          "--target-precision", "int8"]))
    assert overridden.configuration == "faithful"  # an explicit precision wins, and the name follows the models
    assert RunSettings(replace(RunSettings().target, precision="fp16")).configuration == "custom"


def test_the_page_believes_forwarded_addresses_only_from_the_proxies_the_environment_names():
    assert PageSettings.from_environment({}).proxies == ()
    named = PageSettings.from_environment({"SPECDEMO_PROXIES": "10.0.0.0/8, 127.0.0.1 ::1"}).proxies
    assert [str(network) for network in named] == ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]


def test_a_proxy_that_is_no_address_or_network_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="SPECDEMO_PROXIES names proxies by address or network.*'hf-proxy' is neither"):
        PageSettings.from_environment({"SPECDEMO_PROXIES": "10.0.0.0/8,hf-proxy"})
