"""OpenVINO GenAI's speculative pipeline as a lane (specdemo/run/genai.py), on the real default pair."""

import threading
from dataclasses import replace

import pytest

from specdemo.decoding.events import TARGET
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.results.lane import drain
from specdemo.run import genai
from specdemo.run.engine import Engine
from specdemo.settings import KPolicy, GenerationSettings, RunSettings

pytestmark = [pytest.mark.real_models, pytest.mark.slow]

INSTRUCTION = "Write a Python function that reverses a string."


def plugin_pair() -> RunSettings:
    """The default pair as GenAI's pipelines can load it (Profile.for_plugin: never specdemo's kernels' layout)."""
    settings, profile = RunSettings(), machine_profile()
    return replace(settings, target=profile.for_plugin(settings.target), draft=profile.for_plugin(settings.draft))


@pytest.fixture(scope="module")
def pipeline():
    settings = plugin_pair()
    return genai.make_pipeline(sources.prepare(machine_profile().resolve_precision(settings.target)), "CPU",
                               genai.compile_properties(settings.target),
                               sources.prepare(machine_profile().resolve_precision(settings.draft)))


@pytest.fixture(scope="module")
def plugin_engine() -> Engine:
    """Our lanes on the IRs GenAI's pipeline loads (the default pair's where they are the plugin's own)."""
    return Engine.load(plugin_pair())


def test_genai_streams_the_tokens_our_speculative_lane_emits_with_the_same_k(plugin_engine, pipeline):
    settings = GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(4))
    ids = plugin_engine.prompt_ids(INSTRUCTION, settings)
    theirs = drain(genai.stream(pipeline, plugin_engine.tokenizer, ids, settings, plugin_engine.eos_ids, 4))
    ours = drain(plugin_engine.speculative(INSTRUCTION, settings))
    assert theirs.ids == ours.ids  # greedy on the same IRs, prompt ids and K (near-ties aside, which these avoid)
    assert theirs.text == ours.text and all(t.source == TARGET for t in theirs.tokens)
    assert [t.step for t in theirs.tokens] == sorted(t.step for t in theirs.tokens)  # one step per streamer call
    assert theirs.tokens[-1].step < len(theirs.tokens)  # some calls brought several tokens: it speculated
    summary = theirs.summary
    assert summary.tokens == 24 and 0 < summary.accepted <= summary.proposed
    assert summary.wall_s >= theirs.tokens[-1].t > 0 and summary.mean_k == 4 and summary.drafter == "model"


def test_genai_stops_at_the_next_streamer_call_when_cancelled(plugin_engine, pipeline):
    settings = GenerationSettings(max_new_tokens=64, k_policy=KPolicy.fixed(4))
    ids = plugin_engine.prompt_ids(INSTRUCTION, settings)
    cancel = threading.Event()
    events = []
    for event in genai.stream(pipeline, plugin_engine.tokenizer, ids, settings, plugin_engine.eos_ids, 4, cancel):
        events.append(event)
        cancel.set()
    assert events[-1].stop_reason == "cancelled" and events[-1].tokens < 64
