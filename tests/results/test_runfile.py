"""A run to take home: a finished run saved in the schema of `generate --json`, read back and rendered again, several
side by side; bad files are refused with a sentence."""

import json
import subprocess
import sys

import pytest

from specdemo.results import runfile
from specdemo.results.failures import FAILURE_KINDS
from specdemo.results.lane import drain
from specdemo.run.sidebyside import SideBySide
from specdemo.settings import KPolicy, GenerationSettings, RunSettings
from tests.conftest import ROOT, exact

PROMPT = "w5 w17 w99 w3 w250 w42 w7"


@pytest.fixture(scope="module")
def saved(tiny_engine, tiny_target, tiny_draft, tmp_path_factory):
    settings = GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(3))
    side = SideBySide({"autoregressive": tiny_engine, "speculative": tiny_engine}, PROMPT,
                      RunSettings(exact(tiny_target), exact(tiny_draft), settings))
    side.prepare()
    record = side.finish({mode: drain(side.lane(mode)) for mode in side.engines})
    path = tmp_path_factory.mktemp("runs") / "run.json"
    runfile.save(record, path)
    return path, record


def test_a_saved_run_holds_both_lanes_their_records_the_machine_and_what_each_k_would_have_given(saved):
    path, record = saved
    again = json.loads(path.read_text(encoding="utf-8"))
    assert again == json.loads(json.dumps(record.to_json()))  # JSON all the way down
    for lane in ("autoregressive", "speculative"):
        assert again[lane]["summary"]["tokens"] == len(again[lane]["token_ids"]) == 24
        assert sum(r["emitted"] for r in again[lane]["rounds"]) == 24
    assert again["machine"]["cpu"] and again["models"]["target"]["compile_properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert again["counterfactual"]["greedy_only"] and again["settings"]["generation"]["k_policy"]["k"] == 3
    assert {f["kind"] for f in again["failures"]} <= set(FAILURE_KINDS)


def test_a_run_read_back_is_the_record_it_was_written_from(saved):
    path, record = saved
    again = runfile.load(path)
    assert json.loads(runfile.dumps(again)) == json.loads(runfile.dumps(record))  # each part typed again, as kept
    assert again.would.best_fixed().k == record.would.best_fixed().k and again.settings == record.settings
    assert again.speculative.ids == record.speculative.ids and again.speculative.summary.tokens == 24


def test_saved_runs_render_again_side_by_side(saved):
    path, record = saved
    run = runfile.load(path)
    text = runfile.compare([run, run], [str(path), "other.json"])
    header, *rows = text.splitlines()
    assert "run.json" in header and "other.json" in header
    speedup = next(row for row in rows if row.startswith("measured speedup"))
    measured = json.loads(path.read_text(encoding="utf-8"))["measured_speedup"]
    assert speedup.count(f"{measured:.2f}×") == 2  # as figures.py writes a speedup everywhere


def test_show_refuses_a_file_that_is_not_a_run_with_one_line(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    result = subprocess.run([sys.executable, "-m", "specdemo", "show", str(bad)], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad} is not a specdemo run (schema 1): save one with `generate --save FILE`"


def test_show_never_loads_openvino(tmp_path):
    """`show` reads JSON and renders text: the run file takes no engine, so the command loads no OpenVINO (1 s, not 5)."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": runfile.SCHEMA, "instruction": "hi", "autoregressive": {}, "speculative": {}}))
    code = ("import sys; from specdemo.cli.commands import main; status = main(['show', sys.argv[1]]); "
            "print(status, 'openvino' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stderr.strip().splitlines()[-1] == "0 False", done.stderr[-2000:]
    assert "hi" in done.stdout
