"""The context limit: a prompt plus max_new_tokens must fit the model's context, exactly; a run that fills
it completes; and no K, however large, feeds a model past it. Tiny random models (fast, exact)."""

from dataclasses import replace

import pytest

from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy
from tests.conftest import watch_forward

PROMPT = "w5 w17 w99 w3 w250 w42 w7"


def _with_context(engine: Engine, tokens: int) -> Engine:
    """The same compiled models, claiming a context of `tokens`."""
    def shrink(model):
        return replace(model, config={**model.config, "max_position_embeddings": tokens})
    return Engine(shrink(engine.target), shrink(engine.draft))


def test_the_context_limit_is_exact_and_a_run_that_fills_it_completes(tiny_engine):
    small = _with_context(tiny_engine, 48)
    room = 48 - len(small.prompt_ids(PROMPT, GenerationSettings(max_new_tokens=1)))
    with pytest.raises(ValueError, match="exceeds the model's context of 48 tokens"):
        small.prompt_ids(PROMPT, GenerationSettings(max_new_tokens=room + 1))
    settings = GenerationSettings(max_new_tokens=room, k_policy=KPolicy.fixed(5))
    spec = drain(small.speculative(PROMPT, settings))
    assert spec.ids == drain(small.autoregressive(PROMPT, settings)).ids
    assert spec.summary.tokens == room and spec.summary.stop_reason in ("max_new_tokens", "eos")


def test_k_larger_than_the_context_never_feeds_a_model_past_it(tiny_engine, monkeypatch):
    small = _with_context(tiny_engine, 40)
    room = 40 - len(small.prompt_ids(PROMPT, GenerationSettings(max_new_tokens=1)))
    lengths = []  # every model's cache length after each call
    for model in (small.target.runtime, small.draft.runtime):
        watch_forward(monkeypatch, model, lambda ids, model=model: lengths.append(model.length + len(ids)))
    settings = GenerationSettings(max_new_tokens=room, k_policy=KPolicy.fixed(64))
    # Not inside the assert: pytest keeps an assert's intermediate values, and a run's generator kept past its
    # summary still holds the engine's lock, so the autoregressive run would wait for it forever.
    spec = drain(small.speculative(PROMPT, settings))
    assert spec.ids == drain(small.autoregressive(PROMPT, settings)).ids
    assert max(lengths) <= 40
