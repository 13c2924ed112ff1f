"""The benchmark: its statistics, its report and its flags on synthetic runs; one short real run."""

import math

import pytest

from specdemo import bench, bench_report
from specdemo.bench_stats import (
    COMPONENTS,
    Run,
    paired_ratios,
    call_speedup,
    speculative_figures,
    spread,
    time_shares,
)
from specdemo.cli import build_parser
from specdemo.events import expected_speedup
from specdemo.settings import GenerationSettings


def _run(lane, instruction, wall_s, tokens=100, repeat=0, **summary):
    return Run(lane, instruction, repeat, 100, wall_s, tokens, summary=summary)


# ---- statistics


def test_spread_gives_median_extremes_mean_and_sample_std():
    s = spread([4.0, 1.0, 3.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["mean"], s["n"]) == (2.5, 1.0, 4.0, 2.5, 4)
    assert s["std"] == pytest.approx(1.2910, abs=1e-4)


def test_spread_of_one_value_has_no_deviation_and_nans_are_dropped():
    assert spread([2.0, math.nan])["std"] == 0.0
    assert spread([])["n"] == 0


def test_speedups_are_paired_by_instruction_and_repeat_per_token():
    runs = [
        _run("ar", 0, 10.0),
        _run("spec", 0, 5.0),
        _run("ar", 1, 8.0, repeat=0),
        _run("spec", 1, 2.0, tokens=50),  # stopped early: compared per token, 8/100 over 2/50
        _run("ar", 0, 9.0, repeat=1),  # no speculative partner: left out
    ]
    assert sorted(paired_ratios(runs, "ar", "spec")) == pytest.approx([2.0, 2.0])


def test_acceptance_is_pooled_over_rounds_and_fed_to_leviathans_formula():
    runs = [
        _run("spec", 0, 1.0, proposed=40, accepted=36, rejections=2, accepted_histogram=[1, 0, 0, 1, 8], cost_ratio=0.2),
        _run("spec", 1, 1.0, proposed=8, accepted=0, rejections=2, accepted_histogram=[2], cost_ratio=0.3),
    ]
    figures = speculative_figures(runs)
    assert figures["alpha"] == pytest.approx(36 / 40)  # accepted / (accepted + rounds that ended in a rejection)
    assert figures["draft_acceptance_rate"] == pytest.approx(36 / 48)
    assert figures["mean_k"] == pytest.approx(48 / 12)  # draft tokens per round, over every round
    assert figures["c"] == pytest.approx(0.25)
    assert figures["accepted_histogram"] == [3, 0, 0, 1, 8]
    assert figures["leviathan_speedup"] == pytest.approx(expected_speedup(0.9, 4.0, 0.25))


def test_time_shares_split_prefills_and_leave_the_rest_to_python():
    summary = dict(
        target_calls=11, target_s=1.2, target_step_s=0.1,  # prefill 0.2 s, 10 verify calls of 0.1 s
        draft_calls=41, draft_s=1.0, draft_step_s=0.02,  # prefill 0.2 s, 40 steps of 0.02 s
        rollback_s=0.1,
    )
    shares = time_shares([_run("spec", 0, 2.5, **summary)])
    assert list(shares) == list(COMPONENTS)
    assert shares["target prefill"] == pytest.approx(0.2 / 2.5)
    assert shares["target verify"] == pytest.approx(1.0 / 2.5)
    assert shares["draft prefill"] == pytest.approx(0.2 / 2.5)
    assert shares["draft steps"] == pytest.approx(0.8 / 2.5)
    assert shares["our Python"] == pytest.approx(0.2 / 2.5)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_call_speedup_is_leviathans_formula_when_a_verify_call_costs_one_step():
    alpha, k, c = 0.9, 4, 0.25
    tokens_per_round = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert call_speedup(tokens_per_round, k, draft_step_s=c * 0.08, verify_s=0.08, step_s=0.08) == pytest.approx(
        expected_speedup(alpha, k, c)
    )
    assert call_speedup(tokens_per_round, k, c * 0.08, verify_s=0.1, step_s=0.08) < expected_speedup(alpha, k, c)


# ---- report


def test_cells_show_median_then_min_to_max():
    s = spread([4.05, 4.21, 4.60])
    assert bench_report.seconds(s) == "4.21 s (4.05–4.60)"
    assert bench_report.times(spread([1.8])) == "1.80×"
    assert bench_report.ms(spread([0.0421, 0.0403, 0.045])) == "42.1 ms (40.3–45.0)"
    assert bench_report.seconds(spread([])) == "–"


def test_markdown_table_has_header_alignment_and_rows():
    text = bench_report.table(["lane", "time"], [["ours", "1.0 s"]])
    assert text.splitlines() == ["| lane | time |", "| --- | ---: |", "| ours | 1.0 s |"]


def test_targets_are_judged_with_their_gap():
    sections = {
        "paper": {
            "by_tokens": {
                "100": {
                    "ratios": {"ours speculative / GenAI speculative": spread([0.9])},
                    "speedup": {"ours speculative": spread([1.8])},
                    "time_shares": {"ours speculative": dict.fromkeys(COMPONENTS, 0.0) | {"our Python": 0.01}},
                }
            }
        }
    }
    targets = {t["target"]: t for t in bench.judge_targets(sections)}
    assert targets["our speculative / GenAI speculative time"]["met"]
    speedup = targets["speculative speedup over autoregressive (code)"]
    assert not speedup["met"] and speedup["gap"] == pytest.approx(-0.1)
    assert targets["our loop's share of wall time outside model calls"]["met"]


# ---- flags


def _args(*flags):
    return build_parser().parse_args(["bench", *flags])


def test_quick_flag_selects_the_quick_preset():
    settings = bench.bench_settings(_args("--quick"))
    assert settings == bench.QUICK
    assert "precision" not in settings.sections and settings.instructions == 2


def test_default_is_the_full_preset_with_every_section():
    assert bench.bench_settings(_args()).sections == bench.SECTIONS


def test_only_runs_the_named_sections_in_the_standard_order():
    assert bench.bench_settings(_args("--only", "memory, paper")).sections == ("paper", "memory")


def test_unknown_section_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown bench section speed; choose from paper"):
        bench.bench_settings(_args("--only", "speed"))


def test_repeats_below_one_are_refused():
    with pytest.raises(ValueError, match="--repeats must be at least 1"):
        bench.bench_settings(_args("--repeats", "0"))


def test_sampling_is_refused_because_peers_are_compared_token_for_token():
    with pytest.raises(ValueError, match="greedy"):
        bench.check_generation(GenerationSettings(temperature=0.7))


# ---- measuring


def test_lanes_are_warmed_up_then_interleaved_per_instruction():
    calls = []

    def lane(name, ids):
        def run(instruction, prompt_ids, n):
            calls.append((name, instruction, n))
            return Run(name, 0, 0, n, 1.0, len(ids), ids=ids)

        return bench.Lane(name, run)

    lanes = [lane("ar", [1, 2]), lane("spec", [1, 2]), lane("other", [1, 3])]
    settings = bench.BenchSettings(warmup_tokens=4)
    runs = bench.measure(lanes, ["a", "b"], [[0], [0]], 10, settings, log=lambda m: None)
    assert calls[:3] == [("ar", "a", 4), ("spec", "a", 4), ("other", "a", 4)]  # warm-up, short
    assert [(name, instruction) for name, instruction, _ in calls[3:]] == [
        ("ar", "a"), ("spec", "a"), ("other", "a"), ("ar", "b"), ("spec", "b"), ("other", "b")
    ]
    assert [r.same_as_reference for r in runs[:3]] == [True, True, False]
    assert [r.instruction for r in runs] == [0, 0, 0, 1, 1, 1]


# ---- one short real run


def test_a_short_real_run_writes_the_report_json_and_plots(tmp_path):
    """Ours and GenAI on the default pair, one instruction, 8 tokens: tables, JSON and plots are written."""
    from specdemo.engine import Engine
    from specdemo.settings import RunSettings

    settings = RunSettings(generation=GenerationSettings(max_new_tokens=8))
    small = bench.BenchSettings(mode="test", instructions=1, paper_tokens=(8,), genai_defaults_instructions=0, warmup_tokens=2, sections=("paper",))
    ctx = bench.Context(Engine.load(settings), settings, small, log=lambda m: None)
    results = {
        "command": "test", "started": "now", "seconds": 1.0, "machine": bench.machine.describe(),
        "bench": bench.asdict(small), "sections": {"paper": bench.run_paper(ctx)},
    }
    results["targets"] = bench.judge_targets(results["sections"])
    bench.write(results, tmp_path, log=lambda m: None)
    figures = results["sections"]["paper"]["by_tokens"]["8"]
    assert figures["lanes"]["GenAI speculative"]["same_as_reference"] == "1/1"  # GenAI saw the same prompt tokens
    report = (tmp_path / "benchmarks.md").read_text()
    assert "## 1. The paper's experiment" in report and "ours speculative / GenAI speculative" in report
    assert (tmp_path / "benchmarks.json").is_file() and (tmp_path / "benchmarks-paper.png").is_file()
