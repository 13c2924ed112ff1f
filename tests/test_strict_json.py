"""Every file specdemo writes as JSON (the machine profile, a run, a benchmark's results) is strict JSON: no NaN or
Infinity, which most readers other than Python's refuse. A figure that was not measured is written as null, and
specdemo reads null back as "not measured", as it read NaN."""

import json
import math
from dataclasses import replace

from specdemo.learning.profile import Profile
from specdemo.learning.profile.choices import FROM_PLAN, Setting, model_key
from specdemo.learning.tune import Trial
from specdemo.results import runfile
from specdemo.results.lane import Result
from specdemo.results.metrics import Summary
from specdemo.results.parting import Parting
from specdemo.results.record import Record
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET
from tests.learning.test_draft_choice import option


def strict(text: str):
    """`text` parsed as JSON is specified: NaN, Infinity and -Infinity are refused."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_machine_profile_is_strict_json_and_its_null_figures_read_as_not_measured(tmp_path):
    profile = Profile(tmp_path)
    timed = Trial("draft", Setting(128, "f32", "u8"), seconds=0.01, relative=0.9, agreement=1.0, faithful=True,
                  chosen=True)
    untimed = Trial("draft", Setting(32, "bf16", "f32"), agreement=0.9)  # not faithful: never timed
    int4, int8 = option(0, 0.9, 0.02), option(0, 0.95, math.nan, precision="int8")  # int8's step was not measured
    int4.predicted_speedup, int4.chosen = 1.4, True
    profile.keep_tune([timed, untimed], {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}, [int4, int8])
    tune = strict(profile.store.path.read_text())["tune"]
    int8_draft = replace(DEFAULT_DRAFT, precision="int8")
    planned = tune["models"][model_key(int8_draft)]  # the draft's setting, by the plan: not timed at int8 itself
    assert planned["relative"] is None and planned["from"] == FROM_PLAN
    again = Profile(tmp_path)
    assert again.gain(int8_draft).startswith("tuned") and "faster" not in again.gain(int8_draft)
    assert [o.precision for o in again.planned_options(DEFAULT_DRAFT)] == ["int4", "int8"]


def test_a_saved_run_is_strict_json_and_shows_again_with_what_was_not_recorded(tmp_path):
    parted = Parting(3, ["a", "b"], [math.nan, 0.5], "defect")  # the autoregressive lane did not record its margin
    lanes = {lane: Result([], Summary(lane, ttft_s=math.nan)) for lane in ("autoregressive", "speculative")}
    run = Record("w5", "custom", None, lanes, parting=parted)  # no first token: its time not measured
    path = tmp_path / "run.json"
    runfile.save(run, path)
    saved = strict(path.read_text())
    assert saved["parting"]["margin"][0] is None and saved["speculative"]["summary"]["ttft_s"] is None
    assert saved == strict(runfile.dumps(run))  # as `generate --json` prints it
    text = runfile.compare([runfile.load(path)], [str(path)])
    assert "margin there was not recorded in the autoregressive lane and 0.50 in the speculative one" in text


def test_a_benchmarks_results_are_strict_json(tmp_path, monkeypatch):
    from specdemo import bench
    from specdemo.bench import plots, report, stats
    from specdemo.bench.schema import Results, Sections

    monkeypatch.setattr(plots, "draw", lambda results, out: {})
    monkeypatch.setattr(report, "render", lambda results, drawn: "")
    nothing = Sections(paper={"speedup": stats.spread([])})  # nothing measured
    bench.write(Results(sections=nothing, warm_up_s=-math.inf), tmp_path, log=lambda message: None)
    written = strict((tmp_path / "benchmarks.json").read_text())
    assert written["sections"]["paper"]["speedup"]["median"] is None and written["warm_up_s"] is None


def test_every_json_text_specdemo_writes_goes_through_strict_json():
    """An AST walk over specdemo/: json.dump and json.dumps appear only in strict_json.py, so every file, message and key
    specdemo writes is strict JSON (the tests above read the profile, a run and a benchmark's results strictly)."""
    import ast

    from tests.conftest import ROOT

    loose = []
    for path in sorted((ROOT / "specdemo").rglob("*.py")):
        if path.name == "strict_json.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in ("dump", "dumps") and isinstance(node.value, ast.Name)
                    and node.value.id == "json"):
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not loose, f"json.dump(s) outside strict_json: {loose}"
