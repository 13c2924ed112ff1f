"""The page's engines: preparation shows itself in the server's terminal as in the page."""

import re

from specdemo.serve.engines import _also_in_the_terminal


def test_preparing_reports_to_the_page_and_prints_one_terminal_line_per_stage(capsys):
    page = []
    report = _also_in_the_terminal(lambda fraction, message: page.append((fraction, message)))
    steps = [(0.0, "Big: assembling and checking 3 parts (0/3)"), (0.05, "Big: assembling and checking 3 parts (1/3)"),
             (0.35, "big: exporting to OpenVINO IR"), (None, "compiling"), (1.0, "big: ready"),
             (0.0, "Small: assembling and checking 1 parts (0/1)"), (1.0, "small: ready")]
    for fraction, message in steps:
        report(fraction, message)
    assert page == steps  # the page sees everything, compiling (no fraction) included
    lines = capsys.readouterr().err.splitlines()
    stages = [re.sub(r", about .* left\)$", ")", line.split("] ", 1)[1]) for line in lines]  # without the estimate
    assert stages == [
        "Big: assembling and checking 3 parts (0%)", "big: exporting to OpenVINO IR (35%)", "compiling", "big: ready (100%)",
        "Small: assembling and checking 1 parts (0%)", "small: ready (100%)"]


def test_two_models_converting_at_once_keep_their_own_stages_each_line_on_the_loading_clock(capsys, monkeypatch):
    import itertools
    import time

    ticks = itertools.count(0, 5)
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))  # 5 s each time a clock is read
    report = _also_in_the_terminal(lambda fraction, message: None)
    for fraction, message in [(0.0, "Big-Instruct: assembling and checking 3 parts (0/3)"),
                              (0.0, "Small-Instruct: assembling and checking 1 parts (0/1)"),
                              (0.15, "big: dequantizing"), (0.15, "small: dequantizing"), (0.8, "big: saving"),
                              (0.7, "small: saving"), (1.0, "small: ready"), (1.0, "big: ready")]:
        report(fraction, message)
    lines = capsys.readouterr().err.splitlines()
    stages = [re.sub(r" \(.*\)$", "", line.split("] ", 1)[1]) for line in lines]
    assert stages == ["Big-Instruct: assembling and checking 3 parts", "Small-Instruct: assembling and checking 1 parts",
                      "big: dequantizing", "small: dequantizing", "big: saving", "small: saving", "small: ready",
                      "big: ready"]  # a model's stage is not taken for a new conversion of the other
    seconds = [int(line[1:].split(" s]")[0]) for line in lines]
    assert seconds == sorted(seconds) and seconds[-1] > 30  # one clock, since loading began, never restarted


def _fake_engines(**fakes):
    """Engines that load at once and record when (`fakes`: other loaders), and the loads recorded."""
    import threading
    from types import SimpleNamespace

    from specdemo.serve.engines import Engines

    loads = []
    engines = Engines(**{"load_engine": lambda settings, with_draft: lambda report: loads.append(
        threading.current_thread().name) or SimpleNamespace(target=SimpleNamespace(tuned="tuned"),
                                                            draft=SimpleNamespace(tuned=""), to_learn=lambda k, log: []),
        **fakes})
    return engines, loads


def _retune() -> None:
    """A tune in another process changes the choice (a new stamp in the profile)."""
    from specdemo.learning.profile import Profile
    from specdemo.models.sources import specdemo_home

    Profile(specdemo_home()).store.update("tune", lambda tune: {**tune, "changed_ns": tune.get("changed_ns", 0) + 10**9})


def test_a_run_after_the_tune_changed_compiles_again_and_a_page_load_does_not(home):
    from specdemo.serve.engines import APPLYING
    from specdemo.settings import RunSettings

    engines, loads = _fake_engines()
    first = engines.loading_for("pair", RunSettings())
    first.wait()
    assert engines.loading_for("pair", RunSettings()) is first  # nothing changed: the same engine
    _retune()
    assert engines.loading_for("pair", RunSettings(), refresh=False) is first  # a page being loaded keeps it
    again = engines.loading_for("pair", RunSettings())  # a run in its turn: compiled again under the new tune
    assert again is not first and again.message == APPLYING
    again.wait()
    assert len(loads) == 2 and engines.loading_for("pair", RunSettings()) is again


def test_the_new_tune_is_applied_in_a_turn_of_its_own_after_the_run_that_holds_the_machine(home):
    from specdemo.serve import learning
    from specdemo.serve.server import Server
    from specdemo.settings import RunSettings

    engines, loads = _fake_engines()
    server = Server(engines=engines)
    engines.loading_for("pair", RunSettings()).wait()
    run = server.line.join(16)  # a visitor's run holds the machine
    _retune()
    said = []
    applying = learning.apply_tune(server, log=said.append)
    applying.join(0.5)
    assert applying.is_alive() and len(loads) == 1  # waits in the line: no compile beside the run
    server.line.leave(run)
    applying.join(10)
    assert len(loads) == 2 and said[0].startswith("applied this machine's tune in") and "no restart" in said[0]
    assert len(server.line) == 0


def _room(left_gib: float):
    """memory.room() as a machine with `left_gib` GiB left in the bound."""
    from specdemo.host import memory

    budget = 8 * 2**30
    return lambda environ=None: memory.Room(budget, budget - int(left_gib * 2**30), None, 64 * 2**30)


def _prepared(monkeypatch, weights_gib: float = 1.0):
    """Every model prepared, each 1 GiB of weights: compile_need 1.25 GiB."""
    from specdemo.models import sources

    monkeypatch.setattr(sources, "is_prepared", lambda settings: True)
    monkeypatch.setattr(sources, "weights_bytes", lambda settings: int(weights_gib * 2**30))


def test_a_visitor_s_genai_lane_loads_only_beside_what_the_background_work_may_still_need(home, monkeypatch):
    import pytest

    from specdemo.host import memory
    from specdemo.settings import RunSettings

    engines, loads = _fake_engines(load_genai=lambda settings, lookup: lambda report: loads.append("genai") or "pipeline")
    _prepared(monkeypatch)  # GenAI's target and draft: 2.5 GiB to compile
    monkeypatch.setattr(memory, "room", _room(3.0))
    with pytest.raises(memory.Short, match=r"OpenVINO GenAI's pipeline needs about 2.5 GiB .* spoken for by the background"):
        engines.genai_loading_for(RunSettings(), prompt_lookup=False, reserve=int(1.0 * 2**30))  # a tune still to come
    assert loads == [] and "genai" not in engines.loadings
    loading = engines.genai_loading_for(RunSettings(), prompt_lookup=False, reserve=0)  # the work is done: it fits
    assert loading.wait() == "pipeline"


def test_loadings_under_way_are_counted_so_a_race_s_two_engines_are_not_both_let_in_on_the_same_room(home, monkeypatch):
    import threading

    import pytest

    from specdemo.host import memory

    slow = threading.Event()
    engines, _ = _fake_engines(load_engine=lambda settings, with_draft: lambda report: slow.wait(10) and "engine")
    _prepared(monkeypatch)
    monkeypatch.setattr(memory, "room", _room(3.0))  # room for the race's first engine (1.25), not both (1.25 + 2.5)
    with pytest.raises(memory.Short, match="a race's speculative engine needs about 2.5 GiB"):
        engines.lane_loadings("race", "CPU", "CPU")
    slow.set()


def test_the_fastest_configuration_is_never_converted_in_a_visitor_s_turn(home, monkeypatch):
    import pytest

    from specdemo.models import sources

    engines, loads = _fake_engines()
    monkeypatch.setattr(sources, "is_prepared", lambda settings: settings.precision != "int4")
    with pytest.raises(sources.ModelSourceError, match="not prepared on this machine yet .* background work prepares the models"):
        engines.lane_loadings("one after another", "CPU", "CPU", "fastest")
    assert loads == []


def test_optional_models_sitting_idle_are_released_and_the_default_pair_and_a_running_run_s_are_kept(home, monkeypatch):
    from specdemo.host import memory
    from specdemo.settings import RunSettings

    engines, loads = _fake_engines()
    _prepared(monkeypatch)
    monkeypatch.setattr(memory, "room", _room(7.0))
    engines.loading_for("pair", RunSettings()).wait()
    race = engines.lane_loadings("race", "CPU", "CPU")
    held = engines.held()
    held.add(race["speculative"])  # a run holds the race's speculative engine
    for loading in race.values():
        loading.wait()
    assert engines.release_idle(idle_s=0) == ["race-autoregressive"]
    assert set(engines.loadings) == {"pair", "race-speculative"}
    held.release()
    assert engines.release_idle(idle_s=60) == []  # just used: not idle yet
    assert engines.release_idle(idle_s=0) == ["race-speculative"] and set(engines.loadings) == {"pair"}


def test_what_the_background_work_may_still_need_is_its_step_s_need_less_what_it_holds(monkeypatch):
    from types import SimpleNamespace

    from specdemo.host import memory
    from specdemo.serve import tuning
    from specdemo.serve.work import Background

    _prepared(monkeypatch)
    background = Background()
    background.current = SimpleNamespace(state="running", index=2, holds=lambda: 2**30,
                                         steps=[("preparing the draft at int8", []), (tuning.TUNING, [])])
    assert background.reserve() == memory.tune_need(2**30, 2**30) - 2**30
    background.current.state = "done"
    assert background.reserve() == 0
