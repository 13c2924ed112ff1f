"""One run, one owner (specdemo/run/sidebyside.py): the prompt is tokenized once, the plan made once, and the CLI, the
page and the bench produce the same run record for the same settings, all through SideBySide."""

import argparse
import json
import threading

import pytest

from specdemo import bench, strict_json
from specdemo.cli import terminal
from specdemo.results.lane import drain, finished
from specdemo.run.engine import Engine
from specdemo.run.sidebyside import SideBySide
from specdemo.settings import KPolicy, GenerationSettings, RunSettings
from tests.conftest import downloaded_run, exact

INSTRUCTION = "w5 w17 w99 w3 w250 w42 w7"


@pytest.fixture(scope="module")
def settings(tiny_target, tiny_draft) -> RunSettings:
    return RunSettings(exact(tiny_target), exact(tiny_draft), GenerationSettings(max_new_tokens=20, k_policy=KPolicy.fixed(3)))


@pytest.fixture(scope="module")
def engine(settings) -> Engine:
    engine = Engine.load(settings)
    engine.warm_up(settings.generation.k_max)
    return engine


def same_run(record: dict) -> dict:
    """What two records of the same run must share: everything but the times (wall clock, warm-up, costs corrected by
    other runs, the machine's load), down to each round's drafts and each walk's acceptances."""
    def lane(name):
        return {"ids": record[name]["token_ids"], "text": record[name]["text"],
                "rounds": [(r["k"], r["drafted"], r["accepted"], r["emitted"]) for r in record[name]["rounds"]]}

    would = record["counterfactual"]
    return {"instruction": record["instruction"], "configuration": record["configuration"],
            "settings": record["settings"], "autoregressive": lane("autoregressive"),
            "speculative": lane("speculative"), "parting": record["parting"], "failures": record["failures"],
            "plan": {key: record["plan"][key] for key in ("drafter", "k", "auto", "stops")},
            "counterfactual": [w["accepted"] for w in would["fixed"]] if would else None}


def test_the_cli_the_page_and_the_bench_write_the_same_run_record(settings, engine, capsys, monkeypatch, tmp_path):
    from specdemo.serve.engines import Engines
    from specdemo.serve.server import Server
    from specdemo.serve.values import PageValues
    from specdemo.ui import handlers
    from specdemo.serve.visitors import Visitor

    # the CLI, `generate --json`
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *args, **kwargs: engine))
    args = argparse.Namespace(instruction=INSTRUCTION, json=True, save=None, remeasure=False, max_prompt_tokens=0)
    assert terminal.generate(args, settings) == 0
    cli = json.loads(capsys.readouterr().out)

    # the page: Generate with the same settings, the engines its loadings would give, the run its button holds
    server = Server(engines=Engines(load_engine=lambda pair, with_draft: lambda report: engine,
                                    configurations={"faithful": (settings.target, settings.draft)}))
    values = PageValues(instruction=INSTRUCTION, max_new_tokens=20, k=3, k_auto=False, mode="one after another")
    views = list(handlers.generate(server, values, Visitor("a-session")))
    page = downloaded_run(views[-1].download)

    # the bench's sample run, as it writes it into run.json


    benched = json.loads(strict_json.dumps(bench.sample_run(engine, settings, INSTRUCTION)))

    assert same_run(cli) == same_run(page) == same_run(benched)
    assert cli["counterfactual"] is not None and cli["plan"]["drafter"] == "model"


def test_a_run_tokenizes_its_prompt_once_and_plans_once(settings, engine, monkeypatch):
    calls = {"encode": 0, "plan": 0}
    encode, plan = Engine._encode_chat, Engine.plan

    def counting_encode(self, *args):
        calls["encode"] += 1
        return encode(self, *args)

    def counting_plan(self, *args):
        calls["plan"] += 1
        return plan(self, *args)

    monkeypatch.setattr(Engine, "_encode_chat", counting_encode)
    monkeypatch.setattr(Engine, "plan", counting_plan)
    run = SideBySide({"autoregressive": engine, "speculative": engine}, INSTRUCTION, settings)
    run.prepare()
    record = run.finish({mode: drain(run.lane(mode)) for mode in run.engines})
    assert record.finished and calls == {"encode": 1, "plan": 1}


def test_a_stopped_lane_teaches_no_acceptance_and_gets_no_record(settings, engine):
    run = SideBySide({"autoregressive": engine, "speculative": engine}, INSTRUCTION, settings)
    run.prepare()
    stop = threading.Event()
    stop.set()
    results = {"autoregressive": drain(run.lane("autoregressive")), "speculative": drain(run.lane("speculative", stop))}
    assert finished(results["autoregressive"]) and not finished(results["speculative"])
    record = run.finish(results, stopped=True)
    assert not record.finished and record.would is None and record.parting is None and record.failures == []


def test_a_run_needs_its_plan_before_its_speculative_lane(settings, engine):
    run = SideBySide({"speculative": engine}, INSTRUCTION, settings)
    with pytest.raises(RuntimeError, match="prepare"):
        next(iter(run.lane("speculative")))
