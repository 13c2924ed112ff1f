"""Drafters as objects: each strategy is one module of specdemo/decoding/drafters carrying its name, how its round is priced
and the prior it starts from; the package finds them, and a new one runs through the planner, the loop and the
profile without a change anywhere else."""

import pytest

from specdemo.decoding.drafters import STRATEGIES, Proposal, Strategy, checked, make_drafter, strategy
from specdemo.decoding.drafters.base import Planning
from specdemo.decoding.pricing import Acceptance, predicted_speedup, round_seconds
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.decoding.test_planner import machine


def test_the_package_finds_every_strategy_module_by_its_name_in_the_order_of_their_choices():
    from pathlib import Path

    modules = {p.stem for p in (Path(__file__).parents[2] / "specdemo" / "decoding" / "drafters").glob("*.py")} - {"__init__", "base"}
    assert len(STRATEGIES) == len(modules)  # every module of the package is a strategy, found by the package
    assert list(STRATEGIES)[:3] == ["model", "prompt-lookup", "hybrid"]  # the built-in ones first (Strategy.order)
    assert {name: STRATEGIES[name].needs_model for name in ("model", "prompt-lookup", "hybrid")} == \
        {"model": True, "hybrid": True, "prompt-lookup": False}
    assert make_drafter(strategy("prompt-lookup"), None, GenerationSettings(), None).kind == "prompt-lookup"
    with pytest.raises(ValueError, match="no draft model is loaded"):
        make_drafter(strategy("model"), None, GenerationSettings(), None)
    with pytest.raises(ValueError, match="drafter must be one of model, prompt-lookup, hybrid.*, got 'eagle'"):
        checked(GenerationSettings(drafter="eagle"))  # the edges' check (settings know no registry)


def test_each_strategy_prices_its_own_drafting():
    costs = machine(0.10, draft_steps=0.30, n_max=13)  # a draft step 0.3 target steps
    geometric = Acceptance.geometric(0.8)
    model, lookup, hybrid = (round_seconds(costs, geometric, 4, strategy(name))
                             for name in ("model", "prompt-lookup", "hybrid"))
    assert lookup == pytest.approx(costs.t(5) + costs.target_rollback_s + costs.round_overhead_s)  # drafting is free
    assert model == pytest.approx(lookup + strategy("model").draft_seconds(costs, 4, geometric.all_accepted(4)))
    assert hybrid == model  # a hybrid's K is the draft model's, priced as its rounds
    assert strategy("hybrid").planning.prior == "model" and strategy("prompt-lookup").planning.default_alpha == 0.5


class RepeatDrafter:
    """A new strategy for the test: propose the last token again, k times."""

    kind = "repeat"

    def kv_cache_bytes(self):
        return {}

    def reset(self):
        pass

    def propose(self, seq, k):
        return Proposal([seq[-1]] * k, None, [], 0.0, self.kind)

    def keep(self, length):
        pass


def test_a_new_strategy_runs_through_the_planner_the_loop_and_the_profile_unchanged(tiny_engine, monkeypatch):
    repeat = Strategy("repeat", "the last token again", lambda *args, **kwargs: RepeatDrafter(),
                      planning=Planning(default_alpha=0.1))
    monkeypatch.setitem(STRATEGIES, "repeat", repeat)  # what a module drafters/repeat.py defining STRATEGY would do
    costs = machine(0.10, draft_steps=0.30, n_max=13)
    assert predicted_speedup(costs, Acceptance.geometric(0.1), 2, repeat) < 1.0  # rarely right, priced as free
    settings = GenerationSettings(max_new_tokens=16, drafter="repeat", k_policy=KPolicy.fixed(2))
    spec = drain(tiny_engine.speculative("w5 w17 w99 w3", settings))
    ar = drain(tiny_engine.autoregressive("w5 w17 w99 w3", settings))
    assert spec.ids == ar.ids and {r.drafter for r in spec.rounds if r.drafted} == {"repeat"}
