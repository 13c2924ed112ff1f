"""One press of Generate, served (serve/turn.py): what happens, in order, said as the values the page renders. The line,
refusals and page load on servers of fakes; whole runs, Stop and a page that goes away on the tiny pair."""

import json
import re
import tempfile
import threading
import time

import pytest

from specdemo.results import runfile
from specdemo.serve import turn, waiting
from specdemo.serve.engines import KEPT, Engines
from specdemo.serve.server import Server
from specdemo.serve.values import PageValues
from specdemo.serve.visitors import Visitor
from specdemo.settings import GenerationSettings, KPolicy, RunSettings
from tests.conftest import exact, serve_on_the_page, watch_forward

INSTRUCTION = "w5 w17 w99 w3 w250 w42 w7"


def order(happenings) -> str:
    """The kinds of what happened, in order: "Admitted Running Working Finished"."""
    return " ".join(type(happening).__name__ for happening in happenings)


def test_a_refused_instruction_is_one_refusal_and_takes_no_place():
    server = Server()
    happenings = list(turn.take(server, PageValues(instruction=" \n\u3000"), Visitor("visitor")))
    assert happenings == [turn.Refused("The instruction is empty.")]
    assert len(server.line) == 0 and len(server.runs) == 0


def test_a_run_behind_another_says_its_place_and_stop_leaves_the_line():
    server = Server(line=waiting.RunQueue(max_waiting=4))
    holder = server.line.join(64)  # another visitor's run holds the machine
    happenings = turn.take(server, PageValues(instruction="Write a haiku."), Visitor("visitor", "10.0.0.7"))
    admitted, place = next(happenings), next(happenings)
    assert isinstance(admitted, turn.Admitted) and isinstance(place, turn.Waiting) and place.ahead == 1
    assert server.runs.cancel("visitor", admitted.run_id)  # Stop, naming the run
    assert list(happenings) == [turn.LeftLine()]
    assert len(server.line) == 1 and server.line.ahead(holder) == 0 and len(server.runs) == 0


def test_page_load_says_the_kept_pairs_progress_then_that_it_is_ready():
    loaded, engine = threading.Event(), object()

    def load(report):
        report(0.5, "converting the target")
        loaded.wait(5)
        return engine
    server = Server(engines=Engines(load_engine=lambda settings, with_draft: load))
    happenings = turn.wait_for_models(server)
    assert next(happenings) == turn.Preparing(0.5, "converting the target")
    loaded.set()
    assert list(happenings)[-1] == turn.Ready(engine)


def test_page_load_says_in_a_sentence_why_the_models_could_not_be_prepared():
    def load(report):
        raise RuntimeError("the target could not be compiled")
    server = Server(engines=Engines(load_engine=lambda settings, with_draft: load))
    assert list(turn.wait_for_models(server))[-1] == turn.Failed("The target could not be compiled.")


def test_a_model_that_cannot_be_loaded_refuses_the_run_and_frees_its_place():
    def load(report):
        raise RuntimeError("the draft could not be compiled")
    server = Server(engines=Engines(load_engine=lambda settings, with_draft: load))
    happenings = list(turn.take(server, PageValues(instruction="Write a haiku."), Visitor("visitor")))
    assert re.fullmatch(r"Admitted( Preparing)* Refused", order(happenings))
    assert happenings[-1] == turn.Refused("The draft could not be compiled.")
    assert len(server.line) == 0 and len(server.runs) == 0


# ----------------------------------------------------------------------------- runs on the tiny pair


@pytest.fixture(scope="module")
def tiny_server(tiny_target, tiny_draft) -> Server:
    settings = RunSettings(exact(tiny_target), exact(tiny_draft),
                           GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(3)))
    return serve_on_the_page(settings)


@pytest.fixture
def server(tiny_server, tmp_path, monkeypatch) -> Server:
    """A server of its own on the tiny pair's engines, its process's temp folder `tmp_path` (where a page would keep
    files to serve)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return Server(engines=tiny_server.engines)


def values(max_new_tokens: int = 24) -> PageValues:
    return PageValues(instruction=INSTRUCTION, max_new_tokens=max_new_tokens, k=3, k_auto=False)


def test_a_greedy_run_is_admitted_run_weighed_and_finished_with_its_download(server, tmp_path):
    happenings = list(turn.take(server, values(), Visitor("visitor")))
    assert re.fullmatch(r"Admitted( Preparing)* Running( Working)* Weighing Finished", order(happenings))
    running, finished = happenings[[type(h) for h in happenings].index(turn.Running)], happenings[-1]
    assert finished.lanes is running.lanes and all(lane.done for lane in finished.lanes.values())
    assert finished.record.finished and not finished.record.stopped
    run = json.loads(finished.download.text)
    assert run["speculative"]["token_ids"] == finished.record.speculative.ids
    assert finished.download.name.endswith(f"-{happenings[0].run_id}.json")
    assert len(server.line) == 0 and len(server.runs) == 0


def test_a_run_s_download_travels_in_its_own_update_and_is_no_file_another_session_could_ask_for(server, tmp_path):
    """Issue 62: the run's file was served at a path whoever held it could fetch. Now the run's JSON is in the last
    update of the turn that made it, for that page to save, and nothing is written for the page to serve."""
    finished = list(turn.take(server, values(), Visitor("visitor")))[-1]
    assert finished.download is not None
    assert list(tmp_path.rglob("*")) == []


def test_the_page_s_download_leaves_out_the_machine_s_details_which_the_cli_s_file_keeps(server, tmp_path):
    finished = list(turn.take(server, values(), Visitor("visitor")))[-1]
    run, kept = json.loads(finished.download.text), json.loads(runfile.dumps(finished.record))
    assert kept["machine"]["os"] and kept["machine"]["packages"] and kept["machine"]["ram_bytes"]  # the CLI's --save
    assert run["machine"] == {} and run["costs"]["host"] == {}
    assert all("source" not in model for model in run["models"].values())  # where the models lie on this disk
    assert run["costs"]["cpu"] == kept["costs"]["cpu"]  # the CPU the figures were measured on, as the page says
    saved = tmp_path / finished.download.name
    saved.write_text(finished.download.text, encoding="utf-8")  # as the visitor's browser saves it
    assert finished.record.costs.cpu in runfile.compare([runfile.load(saved)], ["page"])  # and `show` reads it


@pytest.fixture
def slow_lanes(server, monkeypatch) -> Server:
    """The tiny pair's server, its target taking 20 ms a call: a run of 240 tokens lasts seconds, long enough to stop."""
    engine = server.engines.load_engine(None, True)(None)  # the one engine serve_on_the_page loads for every lane
    watch_forward(monkeypatch, engine.target.runtime, lambda ids: time.sleep(0.02))
    return server


def test_stop_while_the_lanes_run_ends_the_run_stopped_unweighed_and_without_a_file(slow_lanes):
    server = slow_lanes
    happenings = turn.take(server, values(max_new_tokens=240), Visitor("visitor"))
    admitted, seen = next(happenings), []
    for happening in happenings:
        seen.append(happening)
        if isinstance(happening, turn.Working):
            server.runs.cancel("visitor", admitted.run_id)  # Stop
    assert re.fullmatch(r"(Preparing )*Running( Working)+ Finished", order(seen))
    assert seen[-1].record.stopped and not seen[-1].record.finished and seen[-1].download is None


def lane_workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "specdemo-lanes"]


def test_a_closed_turn_gives_up_its_place_lets_its_models_go_and_stops_its_lanes(slow_lanes):
    server = slow_lanes
    happenings = turn.take(server, values(max_new_tokens=240), Visitor("visitor"))
    next(happening for happening in happenings if isinstance(happening, turn.Working))  # the lanes are running
    assert lane_workers() != []
    happenings.close()  # the page went away
    assert len(server.line) == 0 and len(server.runs) == 0 and server.engines.loadings[KEPT].users == 0
    deadline = time.monotonic() + 10
    while lane_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lane_workers() == []  # they stopped after their current step
