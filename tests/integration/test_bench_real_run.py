"""The benchmark: its statistics, its report and its flags on synthetic runs; one short real run.

The real-model, browser and slow tests of tests/bench/test_bench.py, which holds the fast ones."""

import json

import pytest

from specdemo import bench
from specdemo.bench import table
from specdemo.settings import GenerationSettings, RunSettings


# ---- one short real run


@pytest.mark.real_models
@pytest.mark.slow
def test_a_short_real_run_writes_the_report_json_and_plots(tmp_path):
    """The whole benchmark, ours and GenAI on the default pair, one instruction, 8 tokens: tables, JSON and plots."""
    settings = RunSettings(generation=GenerationSettings(max_new_tokens=8))
    small = bench.BenchSettings(mode="test", instructions=1, paper_tokens=(8,), genai_defaults_instructions=0, warmup_tokens=2,
                                sections=("paper",))
    results = bench.run(settings, small, tmp_path, log=lambda m: None, command="test")
    (genai,) = [r for r in table.load(results) if r.lane.label == "GenAI speculative"]
    assert genai.same_as_reference and genai.max_new_tokens == 8  # GenAI saw the same prompt tokens
    assert genai.lane.baseline.label == "GenAI autoregressive"
    text = (tmp_path / "benchmarks.md").read_text()
    assert "## 1. The paper's experiment" in text and "ours speculative / GenAI speculative" in text
    assert (tmp_path / "benchmarks.json").is_file() and (tmp_path / "benchmarks-paper.png").is_file()
    rows = json.loads((tmp_path / "benchmarks.json").read_text())["table"]  # every lane's runs, each timed in two
    assert len(rows) == 4 and all(row["prefill_s"] > 0 and row["decode_tokens_per_s"] > 0 for row in rows)
