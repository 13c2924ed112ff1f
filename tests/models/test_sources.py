"""Model sources: conversion once into an atomic cache, and clear refusals of bad sources."""

from pathlib import Path

import pytest

from specdemo.models import sources
from specdemo.settings import ModelSettings


def _quiet(fraction, message):
    pass


def test_an_openvino_ir_folder_is_used_as_it_is(home, tiny_target):
    assert sources.prepare(ModelSettings(str(tiny_target)), _quiet) == tiny_target


def test_a_missing_local_path_is_refused(home):
    with pytest.raises(sources.ModelSourceError, match="no such model folder or file"):
        sources.prepare(ModelSettings("./no/such/model"), _quiet)


def test_a_folder_without_a_model_is_refused(home, tmp_path):
    with pytest.raises(sources.ModelSourceError, match="neither an OpenVINO IR"):
        sources.prepare(ModelSettings(str(tmp_path)), _quiet)


def test_a_hub_model_without_network_gives_one_clear_sentence(home):
    with pytest.raises(sources.ModelSourceError, match="could not fetch someone-specdemo/no-such-model"):
        sources.prepare(ModelSettings("someone-specdemo/no-such-model"), _quiet)


def test_the_terminal_shows_one_line_per_stage_with_time_and_estimate():
    import io

    out = io.StringIO()
    report = sources.terminal_progress("m", out)
    for i in range(1, 23):
        report(0.1 * i / 22, f"M: assembling and checking 22 parts ({i}/22)")
    report(0.35, "m: exporting to OpenVINO IR with optimum-intel")
    report(1.0, "m: ready")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("M: assembling and checking 22 parts (0%)")
    assert "exporting to OpenVINO IR with optimum-intel (35%, about" in lines[1] and "left)" in lines[1]
    assert lines[2].endswith("m: ready (100%)")


def test_a_space_with_persistent_storage_keeps_its_home_there(monkeypatch, tmp_path):
    storage = tmp_path / "data"
    storage.mkdir()
    monkeypatch.setattr(sources, "SPACE_STORAGE", storage)
    monkeypatch.delenv("SPECDEMO_HOME", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/specdemo")
    assert sources.specdemo_home() == storage / "specdemo"
    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path / "chosen"))  # the user's choice wins
    assert sources.specdemo_home() == tmp_path / "chosen"


def test_without_a_space_or_its_storage_the_home_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEMO_HOME", raising=False)
    monkeypatch.setattr(sources, "SPACE_STORAGE", tmp_path / "data")  # a Space without persistent storage
    monkeypatch.setenv("SPACE_ID", "someone/specdemo")
    assert sources.specdemo_home() == Path.home() / ".cache" / "specdemo"
    (tmp_path / "data").mkdir()
    monkeypatch.delenv("SPACE_ID")  # a writable /data on a machine that is no Space
    assert sources.specdemo_home() == Path.home() / ".cache" / "specdemo"
