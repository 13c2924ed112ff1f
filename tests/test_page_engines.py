"""The page's engines: preparation shows itself in the server's terminal as in the page."""

import re

from specdemo.ui.engines import _also_in_the_terminal


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


def _fake_engines(monkeypatch, home):
    """Engines that load at once and record when; the tune file in the test's own home."""
    import threading
    from types import SimpleNamespace

    from specdemo.ui import engines

    loads = []
    monkeypatch.setattr(engines, "_LOADING", {})
    monkeypatch.setattr(engines, "_load_engine", lambda settings, with_draft: lambda report: loads.append(
        threading.current_thread().name) or SimpleNamespace(target=SimpleNamespace(tuned="tuned"),
                                                            draft=SimpleNamespace(tuned="")))
    return engines, loads


def _retune() -> None:
    """A tune in another process changes the choice (a new stamp in the profile)."""
    from specdemo.profile import Profile
    from specdemo.sources import specdemo_home

    Profile(specdemo_home()).store.update("tune", lambda tune: {**tune, "changed_ns": tune.get("changed_ns", 0) + 10**9})


def test_a_run_after_the_tune_changed_compiles_again_and_a_page_load_does_not(home, monkeypatch):
    from specdemo.settings import RunSettings

    engines, loads = _fake_engines(monkeypatch, home)
    first = engines.loading_for("pair", RunSettings())
    first.wait()
    assert engines.loading_for("pair", RunSettings()) is first  # nothing changed: the same engine
    _retune()
    assert engines.loading_for("pair", RunSettings(), refresh=False) is first  # a page being loaded keeps it
    again = engines.loading_for("pair", RunSettings())  # a run in its turn: compiled again under the new tune
    assert again is not first and again.message == engines.APPLYING
    again.wait()
    assert len(loads) == 2 and engines.loading_for("pair", RunSettings()) is again


def test_the_new_tune_is_applied_in_a_turn_of_its_own_after_the_run_that_holds_the_machine(home, monkeypatch):
    from specdemo.settings import RunSettings
    from specdemo.ui import handlers

    engines, loads = _fake_engines(monkeypatch, home)
    engines.loading_for("pair", RunSettings()).wait()
    run = handlers.LINE.join(16)  # a visitor's run holds the machine
    _retune()
    said = []
    applying = handlers.apply_tune(log=said.append)
    applying.join(0.5)
    assert applying.is_alive() and len(loads) == 1  # waits in the line: no compile beside the run
    handlers.LINE.leave(run)
    applying.join(10)
    assert len(loads) == 2 and said[0].startswith("applied this machine's tune in") and "no restart" in said[0]
    assert len(handlers.LINE) == 0
