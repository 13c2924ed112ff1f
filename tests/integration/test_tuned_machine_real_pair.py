"""A tuned machine keeps every feature working: under each compile setting tune can choose on this CPU (every pair of
inference precision and KV cache precision), our lanes and OpenVINO GenAI's pipelines (with a draft model and with
prompt lookup) compile and run on the real pair. Each case writes the tune file into a home of its own.

The real-model, browser and slow tests of tests/learning/test_tuned_machine.py, which holds the fast ones."""

import pytest

from conftest import TEST_HOME, link_converted_models
from specdemo.learning import candidates, tune
from specdemo.learning.profile import Profile, choices, machine_profile
from specdemo.models import sources
from specdemo.results.lane import drain
from specdemo.run import genai
from specdemo.run.engine import Engine
from specdemo.settings import KPolicy, DEFAULT_DRAFT, DEFAULT_TARGET, GenerationSettings, RunSettings

_ANY_WEIGHTS = candidates.Layout(True, frozenset(), frozenset(), 0.0)  # inference precisions do not depend on the weights
INFERENCE = [choices.DEFAULT.inference_precision] + [
    s.inference_precision
    for s in candidates.challengers(choices.DEFAULT, "inference_precision", candidates.CPU.here(), _ANY_WEIGHTS)]
CHOICES = [(inference, kv) for inference in INFERENCE for kv in candidates.KV_PRECISIONS]
INSTRUCTION = "Write a Python function that reverses a string."


def force_tune(home, inference: str, kv: str) -> None:
    """A tune file in `home` that chose `inference` and `kv` for both models (the target at group 256, as the Zen 5's
    tune did)."""
    trials = [tune.Trial("target", choices.Setting(256, inference, kv), chosen=True),
              tune.Trial("draft", choices.Setting(32, inference, kv), chosen=True)]
    Profile(home).keep_tune(trials, {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT})


def plugin_models() -> list:
    """The default pair as GenAI's pipelines load it: the plugin's layouts, never our kernels' (Profile.for_plugin)."""
    profile = machine_profile()
    return [profile.resolve_precision(profile.for_plugin(m)) for m in (DEFAULT_TARGET, DEFAULT_DRAFT)]


@pytest.fixture
def tuned(tmp_path, monkeypatch, request):
    """A home holding the real pair (linked from the tests' home) and a tune file forcing `request.param`."""
    inference, kv = request.param
    home = tmp_path / "home"
    for model in [machine_profile().resolve_precision(m) for m in (DEFAULT_TARGET, DEFAULT_DRAFT)] + plugin_models():
        sources.prepare(model)  # in the tests' home
    link_converted_models(TEST_HOME, home)
    monkeypatch.setenv("SPECDEMO_HOME", str(home))
    force_tune(home, inference, kv)
    assert machine_profile().resolve(DEFAULT_TARGET).kv_cache_precision == kv  # the profile is what every compile reads
    return inference, kv


@pytest.mark.real_models
@pytest.mark.slow
@pytest.mark.parametrize("tuned", CHOICES, ids=[f"{i}-kv-{k}" for i, k in CHOICES], indirect=True)
def test_every_consumer_compiles_and_runs_under_the_tune_s_choice(tuned):
    inference, kv = tuned
    settings = GenerationSettings(max_new_tokens=6, k_policy=KPolicy.fixed(3))
    engine = Engine.load(RunSettings(generation=settings))
    assert (engine.target.settings.inference_precision, engine.target.settings.kv_cache_precision) == (inference, kv)
    ar, spec = (drain(run(INSTRUCTION, settings)) for run in (engine.autoregressive, engine.speculative))
    assert len(ar.ids) == len(spec.ids) == 6
    ids, tokenizer, eos_ids = engine.prompt_ids(INSTRUCTION, settings), engine.tokenizer, engine.eos_ids
    del engine
    target, draft = (sources.prepare(m) for m in plugin_models())
    for drafter, draft_folder in (("model", draft), ("prompt-lookup", None)):
        pipeline = genai.make_pipeline(target, "CPU", genai.compile_properties(DEFAULT_TARGET), draft_folder,
                                       prompt_lookup=draft_folder is None,
                                       draft_properties=genai.compile_properties(DEFAULT_DRAFT))
        result = drain(genai.stream(pipeline, tokenizer, ids, settings, eos_ids, 3, drafter=drafter,
                                    compiled_as=genai.fitted(DEFAULT_TARGET, DEFAULT_DRAFT)))
        assert result.summary.tokens == 6
        assert bool(result.summary.compiled_as) == (inference not in ("", kv) and kv in ("f32", "bf16"))  # "": the plugin's own
        del pipeline
