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
    with pytest.raises(ValueError, match="schema 5: this specdemo reads up to 4"):
        table.load({"schema": 5, "table": []})


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


def _string_keyed_reads(path: Path) -> dict[str, list[int]]:
    """Lines where `path` reads by a string literal: x["key"] (not a write) or x.get("key", ...), by the top-level
    function or class (Class.method) they are in ("" outside any)."""
    reads: dict[str, list[int]] = {}

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)) and not owner:
                inner = child.name
            elif isinstance(child, ast.FunctionDef) and isinstance(node, ast.ClassDef):
                inner = f"{node.name}.{child.name}"
            else:
                inner = owner
            if isinstance(child, ast.Subscript) and isinstance(child.ctx, ast.Load):
                key = child.slice
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "get" \
                    and child.args:
                key = child.args[0]
            else:
                key = None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                reads.setdefault(inner, []).append(child.lineno)
            visit(child, inner)

    visit(ast.parse(path.read_text()), "")
    return reads


# The only functions of the bench that read by a string key: the loaders, each turning one kind of JSON into its types
# (the results file's runs, a tune record), and where another program's data or the environment comes in.
LOADERS = {
    "table.py": {"load", "_with_lane_fields", "_runs", "_drafting"},  # benchmarks.json's runs, every schema's
    "report_tables.py": {"tuned"},  # Profile.tune_record(), as benchmarks.json keeps it
    "llamacpp.py": {"bench_rates", "tool"},  # llama-bench's `-o json`; LLAMACPP_BIN
    "memory.py": {"run_memory"},  # the child's PYTHONPATH
    "nodes.py": {"original_names"},  # OpenVINO's runtime info of a node
    "watching.py": {"Page.by_api"},  # gradio's answer to the page's API
}


def test_no_result_is_read_by_a_string_key_outside_the_loaders():
    for path in sorted((ROOT / "specdemo" / "bench").glob("*.py")):
        outside = {owner: lines for owner, lines in _string_keyed_reads(path).items()
                   if owner not in LOADERS.get(path.name, set())}
        assert not outside, f"{path.name} reads by a string key outside its loaders: {outside}"


def test_the_check_finds_a_string_keyed_read_and_the_function_it_is_in(tmp_path):
    source = tmp_path / "section.py"
    source.write_text('figures = {}\nfigures["lanes"] = 1\n\n\ndef read(figures):\n'
                      '    return figures["lanes"] + figures.get("speedup", 0)\n')
    assert _string_keyed_reads(source) == {"read": [6, 6]}
