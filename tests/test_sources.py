"""Model sources: conversion once into an atomic cache, and clear refusals of bad sources."""

import sys
from pathlib import Path

import pytest

from specdemo.models import sources
from specdemo.settings import ModelSettings


def _quiet(fraction, message):
    pass


@pytest.mark.slow  # converts with optimum-intel and NNCF
def test_a_local_hugging_face_folder_is_converted_once_and_cached(home, tiny_hf, monkeypatch):
    settings = ModelSettings(str(tiny_hf), precision="int8")
    folder = sources.prepare(settings, _quiet)
    assert folder.is_relative_to(home / "models" / sources.CACHE_VERSION)
    assert (folder / "openvino_model.xml").is_file() and (folder / sources.COMPLETE_MARKER).is_file()

    def must_not_convert(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(sources, "_convert_in_child", must_not_convert)
    assert sources.prepare(settings, _quiet) == folder


@pytest.mark.slow  # converts with optimum-intel and NNCF
def test_weights_are_compressed_to_the_requested_precision(home, tiny_hf):
    import openvino as ov

    def weight_types(precision):
        model = ov.Core().read_model(sources.prepare(ModelSettings(str(tiny_hf), precision=precision), _quiet) / "openvino_model.xml")
        return {op.get_element_type().to_string() for op in model.get_ops() if op.get_type_name() == "Constant"}

    assert "u4" in weight_types("int4")
    assert "u8" in weight_types("int8") and "u4" not in weight_types("int8")
    assert not {"u4", "u8"} & weight_types("fp16")


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


@pytest.mark.slow  # converts with optimum-intel and NNCF
def test_conversion_runs_in_a_child_that_keeps_torch_out_of_this_process(home, tiny_hf):
    import subprocess

    script = ("import sys; from specdemo.models import sources; from specdemo.settings import ModelSettings; "
              "sources.prepare(ModelSettings(sys.argv[1], precision='int8'), lambda f, m: None); "
              "print('torch' in sys.modules, 'nncf' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, str(tiny_hf)], capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).parents[1])  # SPECDEMO_HOME comes from the `home` fixture
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]  # neither torch nor NNCF was imported here
    assert result.stderr == ""  # the converters' own output went to the log, not to the terminal
    assert sources.log_path(sources.cached_folder(ModelSettings(str(tiny_hf), precision="int8"))).is_file()


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
