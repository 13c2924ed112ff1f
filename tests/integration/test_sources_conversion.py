"""Model sources: conversion once into an atomic cache, and clear refusals of bad sources.

The real-model, browser and slow tests of tests/models/test_sources.py, which holds the fast ones."""

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


@pytest.mark.slow  # converts with optimum-intel and NNCF
def test_conversion_runs_in_a_child_that_keeps_torch_out_of_this_process(home, tiny_hf):
    import subprocess

    script = ("import sys; from specdemo.models import sources; from specdemo.settings import ModelSettings; "
              "sources.prepare(ModelSettings(sys.argv[1], precision='int8'), lambda f, m: None); "
              "print('torch' in sys.modules, 'nncf' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, str(tiny_hf)], capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).parents[2])  # SPECDEMO_HOME comes from the `home` fixture
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]  # neither torch nor NNCF was imported here
    assert result.stderr == ""  # the converters' own output went to the log, not to the terminal
    assert sources.log_path(sources.cached_folder(ModelSettings(str(tiny_hf), precision="int8"))).is_file()
