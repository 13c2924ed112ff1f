"""The run's one table (specdemo/bench/table.py): every run a typed row, written to JSON and read back as the same
types; the bench files committed before it read through the converter; results read by key only at JSON's boundary."""

import ast
import json
import math
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from specdemo import strict_json
from specdemo.bench import table
from specdemo.bench.harness import Context
from specdemo.bench.table import GENAI_DEFAULTS, Lane, Run
from specdemo.bench.settings import FULL
from specdemo.results.metrics import Summary
from specdemo.results.parting import Parting
from specdemo.settings import RunSettings

AR = Lane("ours autoregressive", "specdemo", "autoregressive", models="qwen2.5-coder-1.5b int8")
SPEC = Lane("ours speculative", "specdemo", "speculative", baseline=AR, k=4, k_policy="fixed", drafter="model",
            models="qwen2.5-coder-1.5b int8 + qwen2.5-coder-0.5b int4")
CPP_AR = Lane("llama.cpp autoregressive", "llamacpp", "autoregressive")
CPP_DRAFT = Lane("llama.cpp draft model", "llamacpp", "speculative", baseline=CPP_AR, reference=CPP_AR, k=4,
                 k_policy="fixed", drafter="model")


def _table() -> list[Run]:
    summary = Summary("speculative", tokens=40, wall_s=2.0, ttft_s=0.25, proposed=48, accepted=36, rejections=3,
                      accepted_histogram=[1, 2, 9], kv_cache_bytes={"target": 1024})
    parted = Parting(7, ["a", "b"], [0.1, 0.2], "near-tie", 0.3, 12)
    runs = [Run(AR, 0, 0, 40, 3.0, 40, 0.25, section="paper", machine="AMD EPYC"),
            Run(SPEC, 0, 0, 40, 2.0, 40, 0.25, False, summary, 48, 36, parted, "paper", "AMD EPYC"),
            Run(CPP_AR, 0, 0, 40, 3.5, 39, 0.5, section="llamacpp"),
            Run(CPP_DRAFT, 0, 0, 40, 2.5, 40, 0.75, proposed=20, accepted=15, section="llamacpp")]
    return runs


def test_a_run_has_its_prefill_apart_and_its_decode_rate_counts_the_tokens_after_the_first():
    run = Run(AR, 0, 0, 40, 4.0, 41, prefill_s=0.5)
    assert run.decode_s == pytest.approx(3.5)
    assert run.decode_rate == pytest.approx(40 / 3.5)
    assert math.isnan(Run(AR, 0, 0, 40, 4.0, 41).decode_rate)  # a file before schema 2 did not time the first token


def test_the_table_written_as_json_reads_back_as_the_same_runs():
    runs = _table()
    text = strict_json.dumps({"schema": table.SCHEMA, "table": [table.row(r) for r in runs]})

    back = table.load(json.loads(text))

    assert back == runs
    assert back[1].lane.baseline == AR and back[3].lane.reference == CPP_AR  # lanes rebuilt, each once per section
    assert back[1].summary.accepted_histogram == [1, 2, 9] and back[1].parting.verdict == "near-tie"


def test_every_row_of_the_json_carries_time_to_first_token_and_decode_rate():
    row = table.row(_table()[2])
    assert (row["prefill_s"], row["decode_s"], row["tokens"]) == (0.5, 3.0, 39)
    assert row["decode_tokens_per_s"] == pytest.approx(38 / 3.0)


def test_a_file_of_a_newer_schema_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="schema 4: this specdemo reads up to 3"):
        table.load({"schema": 4, "table": []})


def test_a_run_keeps_the_pass_of_its_section_it_ran_in_and_older_files_passes_are_told_apart():
    defaults = Run(AR, 0, 0, 100, 3.0, 100, 0.25, section="paper", setting=GENAI_DEFAULTS)
    assert table.load({"schema": table.SCHEMA, "table": [table.row(defaults)]}) == [defaults]

    old = {"sections": {"paper": {"by_tokens": {"100": {"runs": [_old_row()]}},
                                  "genai_defaults": {"runs": [_old_row()]}}}}  # before schema 2
    assert [r.setting for r in table.load(old)] == ["", GENAI_DEFAULTS]
    schema_2 = {k: v for k, v in table.row(defaults).items() if k != "setting"}
    assert table.load({"schema": 2, "table": [schema_2]})[0].setting == ""


def _old_row() -> dict:
    return {"lane": "ours autoregressive", "instruction": 0, "repeat": 0, "max_new_tokens": 100, "wall_s": 3.0,
            "tokens": 100}


def test_the_context_keeps_bare_runs_stamped_with_their_section_and_machine():
    ctx = Context(engine=None, settings=RunSettings(), bench=FULL, log=print, section="k", machine="AMD EPYC")
    live = Run(Lane("ar", "specdemo", "autoregressive", generate=lambda *a: None), 0, 0, 8, 1.0, 8, ids=[1, 2])

    assert ctx.keep([live]) == [live]

    kept = ctx.runs[0]
    assert (kept.section, kept.machine, kept.lane.generate, kept.ids) == ("k", "AMD EPYC", None, [])


def _committed_bench_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*benchmarks.json"], cwd=ROOT, capture_output=True, text=True).stdout
    return [ROOT / name for name in listed.split()]


@pytest.mark.parametrize("path", _committed_bench_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_bench_file_reads_back_as_a_table(path):
    results = json.loads(path.read_text())
    written = sum(1 for s in results.get("sections", {}).values()
                  for one in [s, *s.get("by_tokens", {}).values(), s.get("genai_defaults", {})]
                  for r in one.get("runs", []) if "lane" in r)

    runs = table.load(results)

    assert len(runs) == written + len(results.get("table", []))
    assert all(isinstance(r.lane, Lane) and r.section for r in runs)
    assert all(r.lane.baseline is not None for r in runs if r.lane.kind == "speculative")


def test_the_bench_files_are_found():
    assert len(_committed_bench_files()) >= 10


# ---- no result read by a string key


def _string_keyed_reads(path: Path) -> list[int]:
    """Lines where `path` reads by a string literal: x["key"] (not a write) or x.get("key", ...)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            lines.append(node.lineno)
    return lines


# table.py is JSON's boundary: the one module that reads results by key. The rest are modules the typed results have
# not reached yet: each section's figures are typed (schema.Figures), but the report and the plots still find a section
# by its name in the sections' map and read the run's top level (the machine, the models, the plan, the tune) as the
# dicts their owners describe themselves in; the sandbox reads its plan's cgroup files, and a few read another
# program's answer where it comes in (OpenVINO's records in nodes, gradio's in watching). Each held at its count, so
# none grows, and lowered as it moves onto typed data (issue 60).
NOT_YET = {"__init__.py": 4, "gating.py": 1, "humaneval.py": 1, "kernels.py": 1, "memory.py": 1, "nodes.py": 1,
           "plots.py": 13, "report.py": 46, "report_gguf.py": 3, "report_humaneval.py": 2, "report_tables.py": 31,
           "sandbox.py": 1, "sandbox_init.py": 5, "sections.py": 1, "sweeps.py": 1, "targets.py": 1, "watching.py": 3}
BOUNDARY = {"table.py"}
# Other programs' JSON, read where it comes in: llama-bench's `-o json` (llamacpp.bench_rates).
NOT_YET["llamacpp.py"] = 5


def test_the_measuring_modules_read_no_result_by_a_string_key_and_the_rest_only_fewer():
    package = ROOT / "specdemo" / "bench"
    for path in sorted(package.glob("*.py")):
        if path.name in BOUNDARY:
            continue
        reads = _string_keyed_reads(path)
        assert len(reads) <= NOT_YET.get(path.name, 0), f"{path.name} reads results by string key at lines {reads}"


def test_the_check_finds_a_string_keyed_read(tmp_path):
    source = tmp_path / "section.py"
    source.write_text('figures = {}\nfigures["lanes"] = 1\nx = figures["lanes"] + figures.get("speedup", 0)\n')
    assert _string_keyed_reads(source) == [3, 3]
