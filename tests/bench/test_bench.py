"""The benchmark: its statistics, its report and its flags on synthetic runs; one short real run."""

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import exact

from specdemo import bench
from specdemo import strict_json
from specdemo.bench import report, report_tables, stats, table
from specdemo.bench.harness import Context, measure
from specdemo.bench.table import GENAI_DEFAULTS, Lane, Output, Run
from specdemo.bench.schema import Figures, Head, KvCache, Pair, Paper, Results, Sections, Sweep
from specdemo.bench.settings import REGISTRY, SECTIONS
from specdemo.bench.stats import (
    COMPONENTS,
    paired_ratios,
    speculative_figures,
    spread,
    time_shares,
)
from specdemo.bench.sweeps import sweep
from specdemo.bench.targets import judge_targets
from specdemo.cli.commands import benchmark_settings, build_parser
from specdemo.decoding.events import Round
from specdemo.host import machine
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.metrics import Summary, leviathan_speedup, speedup_from_calls
from specdemo.settings import GenerationSettings, RunSettings

AR = Lane("ar", "specdemo", "autoregressive")
SPEC = Lane("spec", "specdemo", "speculative", baseline=AR)


def _run(lane, instruction, wall_s, tokens=100, repeat=0, rounds=(), prefill_s=0.0, **summary):
    """A run of `lane`; with `summary` figures, ours (a Summary); its prefill instant unless given."""
    ours = Summary(lane.kind, **summary) if summary and lane.framework == "specdemo" else None
    return Run(lane, instruction, repeat, 100, wall_s, tokens, prefill_s, summary=ours, proposed=summary.get("proposed", 0),
               accepted=summary.get("accepted", 0), rounds=list(rounds))


def _round(index, verify_tokens, verify_s, draft_calls=(), rollback_s=0.0):
    drafted = verify_tokens - 1 if index else 0
    return Round(index=index, context=0, k=drafted, drafter="model" if drafted else "", draft_calls=list(draft_calls),
                 draft_s=sum(s for _, s in draft_calls), verify_tokens=verify_tokens, verify_s=verify_s, drafted=drafted,
                 accepted=drafted, emitted=drafted + 1, rollback_s=rollback_s, t=0.0)


# ---- statistics


def test_spread_gives_median_extremes_mean_and_sample_std():
    s = spread([4.0, 1.0, 3.0, 2.0])
    assert (s.median, s.min, s.max, s.mean, s.n) == (2.5, 1.0, 4.0, 2.5, 4)
    assert s.std == pytest.approx(1.2910, abs=1e-4)


def test_spread_of_one_value_has_no_deviation_and_nans_are_dropped():
    assert spread([2.0, math.nan]).std == 0.0
    assert spread([]).n == 0


def test_speedups_are_paired_by_instruction_and_repeat_per_token():
    runs = [
        _run(AR, 0, 10.0),
        _run(SPEC, 0, 5.0),
        _run(AR, 1, 8.0, repeat=0),
        _run(SPEC, 1, 2.0, tokens=50),  # stopped early: compared per token, 8/100 over 2/50
        _run(AR, 0, 9.0, repeat=1),  # no speculative partner: left out
    ]
    assert sorted(paired_ratios(runs, AR, SPEC)) == pytest.approx([2.0, 2.0])


def test_acceptance_is_pooled_over_rounds_and_fed_to_leviathans_formula():
    runs = [
        _run(SPEC, 0, 1.0, proposed=40, accepted=36, rejections=2, accepted_histogram=[1, 0, 0, 1, 8], draft_cost=0.2),
        _run(SPEC, 1, 1.0, proposed=8, accepted=0, rejections=2, accepted_histogram=[2], draft_cost=0.3),
    ]
    figures = speculative_figures(runs)
    assert figures.alpha_hat == pytest.approx(36 / 40)  # accepted / (accepted + rounds that ended in a rejection)
    assert stats.acceptance(runs) == pytest.approx(36 / 48)  # drafts kept / drafts offered
    assert figures.mean_k == pytest.approx(48 / 12)  # draft tokens per round, over every round
    assert figures.draft_cost == pytest.approx(0.25)
    assert figures.accepted_histogram == [3, 0, 0, 1, 8]
    assert figures.leviathan_speedup == pytest.approx(leviathan_speedup(0.9, 4.0, 0.25))


def test_time_shares_split_prefills_and_leave_the_rest_to_python():
    # The prefill (0.2 s), then 10 rounds of 4 draft steps (0.02 s each; the first round's first call is the draft's
    # prefill, 0.2 s) and a verify call of 0.1 s, with 0.01 s of rollback each.
    rounds = [_round(0, 30, 0.2)]
    rounds += [_round(i, 5, 0.1, [(31 if i == 1 else 1, 0.2 if i == 1 else 0.02)] + [(1, 0.02)] * 3, rollback_s=0.01)
               for i in range(1, 11)]
    shares = time_shares([_run(SPEC, 0, 2.5, rounds=rounds)])
    assert list(shares) == list(COMPONENTS)
    assert shares["target prefill"] == pytest.approx(0.2 / 2.5)
    assert shares["target verify"] == pytest.approx(1.0 / 2.5)
    assert shares["draft prefill"] == pytest.approx(0.2 / 2.5)
    assert shares["draft steps"] == pytest.approx(0.78 / 2.5)
    assert shares["rollback"] == pytest.approx(0.1 / 2.5)
    assert shares["our Python"] == pytest.approx(0.22 / 2.5)  # 2.5 s of wall time, 2.28 s in calls and trims
    assert sum(shares.values()) == pytest.approx(1.0)


def test_speedup_from_calls_is_leviathans_formula_when_a_verify_call_costs_one_step():
    alpha, k, c = 0.9, 4, 0.25
    tokens_per_round = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert speedup_from_calls(tokens_per_round, k, c * 0.08, verify_call=0.08, target_step=0.08) == pytest.approx(
        leviathan_speedup(alpha, k, c)
    )
    assert speedup_from_calls(tokens_per_round, k, c * 0.08, verify_call=0.1, target_step=0.08) < leviathan_speedup(alpha, k, c)


# ---- report


def test_cells_show_median_then_min_to_max():
    s = spread([4.05, 4.21, 4.60])
    assert report_tables.seconds(s) == "4.21 s (4.05–4.60)"
    assert report_tables.times(spread([1.8])) == "1.80×"
    assert report_tables.ms(spread([0.0421, 0.0403, 0.045])) == "42.1 ms (40.3–45.0)"
    assert report_tables.seconds(spread([])) == "–"


def test_markdown_table_has_header_alignment_and_rows():
    text = report_tables.table(["lane", "time"], [["ours", "1.0 s"]])
    assert text.splitlines() == ["| lane | time |", "| --- | ---: |", "| ours | 1.0 s |"]


GENAI_AR = Lane("GenAI AR", "genai", "autoregressive")
# The paper section's rows of the table, one instruction, 100 tokens each: ours 1.8 s AR, 1.0 s speculative (1.8×);
# GenAI 2.0 s and 1.1 s (our speculative decoding takes 0.91× its time); our loop's own share of wall time 1 %.
PAPER_RUNS = [replace(_run(lane, 0, wall_s), section="paper") for lane, wall_s in
              ((AR, 1.8), (SPEC, 1.0), (GENAI_AR, 2.0), (Lane("GenAI spec", "genai", "speculative", GENAI_AR), 1.1))]
SHARES = {kind: dict.fromkeys(COMPONENTS, 0.0) | {"our Python": 0.01} for kind in (AUTOREGRESSIVE, SPECULATIVE)}
PAPER_SECTION = Sections(paper=Paper(4, "", "fixed", None, None, None, SHARES))


def test_targets_are_judged_with_their_gap():
    targets = {t.target: t for t in judge_targets(PAPER_SECTION, PAPER_RUNS)}
    assert targets["our speculative / GenAI speculative time"].met
    speedup = targets["speculative speedup over autoregressive (code)"]
    assert not speedup.met and speedup.gap == pytest.approx(-0.1)
    assert list(bench.plain(speedup)) == ["id", "target", "where", "goal", "sense", "unit", "measured", "met", "gap"]  # JSON
    assert targets["our loop's share of wall time outside model calls"].met


def test_the_genai_defaults_pass_is_told_apart_by_its_setting_in_the_ratios_and_the_plots(tmp_path):
    from specdemo.bench import plots

    genai_ar = Lane("GenAI AR (its defaults)", "genai", "autoregressive")
    defaults = [replace(_run(lane, 0, wall_s), section="paper", setting=GENAI_DEFAULTS) for lane, wall_s in
                ((AR, 1.8), (SPEC, 1.0), (genai_ar, 1.5), (Lane("GenAI spec (its defaults)", "genai", "speculative", genai_ar), 2.0))]
    results = Results(sections=PAPER_SECTION, runs=PAPER_RUNS + defaults)

    text = report.peers_section(results.sections, {}, results.runs)

    assert "| spec / GenAI spec | 0.909× |" in text  # the paper's own pass: ours 1.0 s against GenAI's 1.1 s
    assert "| spec / GenAI spec (its defaults) (N = 100, 1 instructions) | 0.500× |" in text
    assert "| ar / GenAI AR (its defaults) (N = 100, 1 instructions) | 1.200× |" in text
    assert set(plots.draw(results, tmp_path)) == {"paper", "peers", "breakdown"}


# ---- flags


def _args(*flags):
    return build_parser().parse_args(["bench", *flags])


def test_quick_flag_selects_the_quick_preset():
    settings = benchmark_settings(_args("--quick"))
    assert settings == bench.QUICK
    assert "precision" not in settings.sections and settings.instructions == 2


def test_default_is_the_full_preset_with_every_section_but_the_opt_in_ones():
    assert benchmark_settings(_args()).sections == tuple(s for s in bench.SECTIONS if s not in ("humaneval", "gating"))


def test_every_registered_section_names_its_runner_report_parts_and_plots_and_asks_room_for_its_copies():
    from specdemo.bench.memory import section_need
    from specdemo.host.memory import compile_need

    target, draft = 1_780_000_000, 400_000_000
    for section in REGISTRY:
        assert callable(bench.found(section.run)), section.name
        assert section.report and all(callable(bench.found(part)) for _, part in section.report), section.name
        assert all(bench.found(painter).__name__.startswith("draw_") for painter in section.plots), section.name
        copies = section.copies[0] * compile_need(target) + section.copies[1] * compile_need(draft)
        assert section_need(section.name, target, draft, (2, 4)) >= copies, section.name


def test_each_registered_section_keeps_its_figures_in_the_field_of_its_name_in_the_order_they_run():
    assert tuple(f.name for f in fields(Sections)) == SECTIONS


def test_only_offers_exactly_the_registered_sections_in_the_order_they_run():
    everything = ",".join(reversed(bench.SECTIONS))
    assert benchmark_settings(_args("--only", everything)).sections == tuple(s.name for s in REGISTRY)


@dataclass(frozen=True)
class Echo(Figures):
    said: str


def run_echo(ctx):
    return Echo("hello")


def echo_part(sections: Sections, plots: dict, runs) -> str:
    echo = sections.gating
    return f"## 4½. Echo\n\nIt said {echo.said}.{report_tables.image(plots, 'echo', 'echo')}" if echo else ""


def draw_echo(results: Results, runs=()):
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(1, 1))[0] if results.sections.gating else None


def test_a_registered_sections_report_part_goes_in_its_place_and_its_plot_is_drawn(monkeypatch, tmp_path):
    from specdemo.bench import plots
    from specdemo.bench.settings import Section

    echo = Section("gating", f"{__name__}:run_echo", ((4, f"{__name__}:echo_part"),), (f"{__name__}:draw_echo",))
    for module in (report, plots):
        monkeypatch.setattr(module, "REGISTRY", (*(s for s in REGISTRY if s.name != "gating"), echo))
    results = Results("test", "now", machine.describe(), bench.BenchSettings(), seconds=1.0,
                      sections=Sections(memory=_memory_section(), gating=run_echo(None)))
    drawn = plots.draw(results, tmp_path)
    text = report.render(results, drawn)
    assert drawn == {"echo": "benchmarks-echo.png"} and (tmp_path / "benchmarks-echo.png").exists()
    assert "It said hello.\n\n![echo](benchmarks-echo.png)" in text
    assert text.index("## 4½. Echo") < text.index("## 5. Memory") < text.index("## Method")  # § 4, then § 5


def _memory_section():
    from specdemo.bench.memory import Memory, Peaks

    mode = Peaks(1, 2, 3, 2, 3, 1, {"target": 1}, 8)
    return Memory(8, mode, mode)


def test_only_runs_the_named_sections_in_the_standard_order():
    assert benchmark_settings(_args("--only", "memory, paper")).sections == ("paper", "memory")


def test_unknown_section_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown bench section speed; choose from paper"):
        benchmark_settings(_args("--only", "speed"))


def test_repeats_below_one_are_refused():
    with pytest.raises(ValueError, match="--repeats must be at least 1"):
        benchmark_settings(_args("--repeats", "0"))


def test_sampling_is_refused_because_peers_are_compared_token_for_token():
    with pytest.raises(ValueError, match="greedy"):
        bench.check_generation(GenerationSettings(temperature=0.7))


def test_a_speculative_lane_without_a_baseline_is_refused():
    with pytest.raises(ValueError, match="needs the autoregressive baseline"):
        Lane("spec", "specdemo", "speculative")


# ---- measuring


def _output(wall_s, ids=(1, 2, 3, 4), **summary):
    """A lane's generate() that always gives `ids` in `wall_s` seconds."""
    ours = Summary("speculative", **summary) if summary else None
    return lambda instruction, prompt_ids, n: Output(list(ids), wall_s, 0.0, ours, summary.get("proposed", 0),
                                                     summary.get("accepted", 0))


def test_lanes_are_warmed_up_then_interleaved_per_instruction():
    calls = []

    def lane(name, ids, kind="autoregressive"):
        def generate(instruction, prompt_ids, n):
            calls.append((name, instruction, n))
            return Output(ids, 1.0, 0.0)

        return Lane(name, "specdemo", kind, baseline=AR if kind == "speculative" else None, generate=generate)

    lanes = [lane("ar", [1, 2]), lane("spec", [1, 2], "speculative"), lane("other", [1, 3], "speculative")]
    settings = bench.BenchSettings(warmup_tokens=4)
    runs = measure(lanes, ["a", "b"], [[0], [0]], 10, settings, log=lambda m: None)
    assert calls[:3] == [("ar", "a", 4), ("spec", "a", 4), ("other", "a", 4)]  # warm-up, short
    assert [(name, instruction) for name, instruction, _ in calls[3:]] == [
        ("ar", "a"), ("spec", "a"), ("other", "a"), ("ar", "b"), ("spec", "b"), ("other", "b")
    ]
    assert [r.same_as_reference for r in runs[:3]] == [True, True, False]
    assert [r.instruction for r in runs] == [0, 0, 0, 1, 1, 1]


class _PromptsOnly:
    """An engine stand-in for lanes that do not call it: it only turns instructions into prompt ids."""

    def prompt_ids(self, instruction, generation):
        return [len(instruction)]


def test_one_sweep_rows_every_speculative_lane_against_its_own_baseline():
    small = bench.BenchSettings(instructions=2, sweep_tokens=8, warmup_tokens=2)
    ctx = Context(_PromptsOnly(), RunSettings(), small, log=lambda m: None)
    ours_ar = Lane("plain", "specdemo", "autoregressive", generate=_output(2.0))
    ours = Lane("quick one", "specdemo", "speculative", ours_ar, k=2, k_policy="fixed", drafter="model",
                generate=_output(0.5, proposed=4, accepted=3, rejections=1, accepted_histogram=[0, 1, 0]))
    theirs_ar = Lane("their plain", "genai", "autoregressive", generate=_output(1.0))
    theirs = Lane("their quick one", "genai", "speculative", theirs_ar, k=2, k_policy="fixed", drafter="model",
                  generate=_output(0.5, ids=(1, 2, 3, 5)))
    runs = sweep(ctx, "a test sweep", [ours_ar, ours, theirs_ar, theirs])
    assert len(runs) == len(ctx.runs) == 8  # 4 lanes x 2 instructions, kept in the table
    assert runs[0].ids and not ctx.runs[0].ids  # the ids are the section's to read, the table keeps none

    # autoregressive lanes are baselines, not rows
    rows = {row.lane.label: row for row in stats.sweep_rows(ctx.runs, ctx.section)}
    assert list(rows) == ["quick one", "their quick one"]
    assert rows["quick one"].measured_speedup.median == pytest.approx(4.0)  # over "plain"
    assert rows["their quick one"].measured_speedup.median == pytest.approx(2.0)  # over "their plain"
    assert rows["quick one"].alpha_hat == pytest.approx(0.75)  # 3 accepted, 1 rejection
    assert rows["their quick one"].same_as_reference == "0/2"  # checked against the section's first lane
    assert ctx.runs[1].lane.label == "quick one" and ctx.runs[1].lane.generate is None  # bare: it holds no pipeline


class _Walker(_PromptsOnly):
    """An engine stand-in that records what each counterfactual walk was asked with and teaches nothing."""

    def __init__(self):
        self.asked, self.keys, self.profile = [], None, None

    def would_have_given(self, prompt, generation, ids, rounds):
        self.asked.append((prompt, generation, list(ids), rounds))
        return None


def test_the_k_sweep_walks_every_autoregressive_answer_over_every_k_up_to_the_ceiling():
    """The K section's counterfactual walks each autoregressive answer once, greedy, over K = 1..K_MAX, at the
    section's length; where auto K wrote the same answer its rounds go along (they correct the teacher-forced mask)."""
    from specdemo.bench.sweeps import counterfactuals
    from specdemo.settings import K_MAX

    engine = _Walker()
    small = bench.BenchSettings(instructions=2, sweep_tokens=8, warmup_tokens=2)
    ctx = Context(engine, RunSettings(), small, log=lambda m: None)
    ar = Lane("plain", "specdemo", "autoregressive")
    auto = Lane("auto K", "specdemo", "speculative", ar, k_policy="auto", drafter="model")
    rounds = (_round(0, 3, 0.1),)
    runs = [_run(ar, 0, 2.0), _run(auto, 0, 1.0, rounds=rounds), _run(ar, 1, 2.0), _run(auto, 1, 1.0)]
    runs[3] = Run(**{**runs[3].__dict__, "ids": [9, 9]})  # auto K wrote another answer to the second instruction
    out = counterfactuals(ctx, runs, ar, observer=auto)
    assert set(out) == {(0, 0), (1, 0)}
    (_, first, _, seen), (_, second, _, unseen) = engine.asked
    assert first.k_max == K_MAX and first.max_new_tokens == 8 and first.greedy
    assert list(seen) == list(rounds)
    assert unseen is None


def test_renamed_lanes_are_still_paired_by_their_fields_in_figures_targets_and_report():
    """No label the report knew before: speedups, ratios, targets and tables still find their lanes."""
    mine_ar = Lane("mine, one token at a time", "specdemo", "autoregressive")
    mine = Lane("mine, drafting", "specdemo", "speculative", mine_ar, k=4, k_policy="fixed", drafter="model")
    their_ar = Lane("their plain pipeline", "genai", "autoregressive")
    theirs = Lane("their drafting pipeline", "genai", "speculative", their_ar, k=4, k_policy="fixed", drafter="model")
    spec_summary = dict(proposed=40, accepted=36, rejections=2, accepted_histogram=[0, 0, 1, 1, 8], draft_cost=0.2,
                        target_calls=11, target_s=1.0, verify_call_s=0.09, draft_calls=41, draft_s=0.8,
                        draft_step_s=0.019, rollback_s=0.01, mean_acceptance_length=3.6)
    runs = []
    for i in range(2):
        runs += [replace(run, section="paper") for run in (
            _run(mine_ar, i, 10.0, target_step_s=0.1), _run(mine, i, 4.0, **spec_summary), _run(their_ar, i, 9.0),
            _run(theirs, i, 5.0, proposed=40, accepted=30))]

    k_ar = Lane("one at a time", "specdemo", "autoregressive")  # the K sweep: 2.1× at four drafts, 2.3× the planner's
    runs += [replace(run, section="k") for run in (
        _run(k_ar, 0, 4.6), _run(Lane("four drafts", "specdemo", "speculative", k_ar, k=4, k_policy="fixed"), 0, 4.6 / 2.1),
        _run(Lane("the planner's", "specdemo", "speculative", k_ar, k_policy="auto"), 0, 2.0, predicted_speedup=2.3 * 1.04))]
    sections = Sections(paper=replace(PAPER_SECTION.paper, k_label="K = 4"), k=Sweep(100, []))
    targets = {t.id: t for t in judge_targets(sections, runs)}
    assert targets["genai_ratio"].measured == pytest.approx(0.8) and targets["genai_ratio"].met
    assert targets["speedup"].measured == pytest.approx(2.5)
    assert targets["speedup_best_k"].where == "the planner's"
    assert targets["auto_speedup"].measured == pytest.approx(2.3) and targets["prediction_error"].met

    results = Results("test", "now", machine.describe(), bench.BenchSettings(), seconds=1.0,
                      sections=Sections(paper=sections.paper), runs=runs, targets=list(targets.values()))
    text = report.render(results, plots={})
    assert "is **2.50×** faster than autoregressive (GenAI's C++ pipeline: 1.80×" in text
    assert "Our speculative loop takes **0.80×** the decoding time of GenAI's speculative pipeline" in text
    assert "| mine, drafting / their drafting pipeline | 0.800× |" in text
    assert "| 100 | 10.00 s | 4.00 s | 2.50× | 9.00 s | 5.00 s | 1.80× |" in text
    assert "| their drafting pipeline | 5.00 s | 50.0 ms | 0.00 s | 100 | 75 % | 2/2 |" in text  # its own acceptance


def _sweep(name, ar_wall_s, *rows, ar_summary=None, framework="specdemo", label=None):
    """A sweep section's rows of the table, one instruction: its autoregressive lane (`ar_wall_s`), then per row a
    speculative lane over it, (label, wall seconds, its fields and summary)."""
    ar = Lane(label or f"{name} autoregressive", framework, "autoregressive")
    runs = [_run(ar, 0, ar_wall_s, **(ar_summary or {}))]
    for row_label, wall_s, fields, summary in rows:
        runs.append(_run(Lane(row_label, framework, "speculative", ar, **fields), 0, wall_s, **summary))
    return [replace(r, section=name) for r in runs]


def test_every_sweep_is_read_from_the_table_as_written_beside_its_sections_own_facts(tmp_path):
    """§3 and §4 and their plots: each speculative lane of a sweep is a row of figures from the table; what the table
    does not hold (the counterfactual, a precision pair's sizes, a KV cache's element type) is its section's, by label."""
    from specdemo.bench import plots

    fixed = dict(k=2, k_policy="fixed", drafter="model")
    drafted = dict(proposed=8, accepted=6, rejections=2, accepted_histogram=[0, 2, 2], draft_cost=0.2,
                   predicted_speedup=2.2, kv_cache_bytes={"target": 2048, "draft": 1024})
    runs = (_sweep("k", 4.0, ("K=2", 2.0, fixed, drafted), ("auto K", 1.6, dict(k_policy="auto", drafter="model"), drafted))
            + _sweep("k", 3.0, ("GenAI K=2", 2.0, fixed, {}), framework="genai", label="GenAI autoregressive")
            + _sweep("precision", 3.0, ("target int8 + draft int4", 1.5, fixed, drafted))
            + _sweep("kv", 3.0, ("KV u8 speculative", 2.0, fixed, drafted), ar_summary=dict(target_step_s=0.03))
            + _sweep("vocab", 3.0, ("head 16k", 1.0, fixed, drafted))
            + _sweep("lookup", 3.0, ("ours prompt lookup", 1.0, fixed, drafted), label="ours autoregressive")
            + _sweep("lookup", 6.0, ("GenAI prompt lookup", 2.0, fixed, {}), framework="genai"))
    said = stats.Counterfactual("K=2", spread([2.1]), spread([0.05]), 1, [1], 0)
    oracle = stats.Counterfactual("auto K", oracle_speedup=spread([2.8]), best_fixed_k=[2],
                                  best_fixed_counterfactual=spread([2.1]), over_best_fixed=spread([1.25]))
    sections = Sections(k=Sweep(100, [said, oracle]),
                        precision=Sweep(100, [Pair("target int8 + draft int4", "int8", "int4", 2**20)], 2),
                        kv=Sweep(100, [KvCache("KV u8 speculative", "u8")], 2),
                        vocab=Sweep(100, [Head("head 16k", 16000, 16384, 0.01)]), lookup=Sweep(100, [], 2))
    written = table.load(json.loads(strict_json.dumps({"schema": table.SCHEMA, "table": [table.row(r) for r in runs]})))
    results = Results("test", "now", machine.describe(), bench.BenchSettings(), seconds=1.0, sections=sections,
                      runs=written)

    drawn = plots.draw(results, tmp_path)
    text = report.render(results, drawn)

    assert set(drawn) == {"k", "precision"}
    assert "| K=2 | 0.75 | 0.200 | 2.0 | 1.65× | 2.20× | 2.00× |" in text  # α̂ 6 / (6 + 2); 4 s over 2 s
    assert "| 20.0 ms | 1/1 | 1.50× | 1.000× |" in text  # GenAI at the same K: 3 s over 2 s, and as fast as ours
    assert "| K=2 | 2.00× | 2.20× | +10% (+10% to +10%) | 2.10× | +5% (+5% to +5%) | ±1 | 0 |" in text
    assert "**auto K**: measured 2.50×. On the same answers the counterfactual's best fixed K was 2 (2.10× predicted)" in text
    assert "| int8 | int4 | 1.0 MiB | 30.0 ms |" in text and "target int8 + draft int4 at 2.00×" in text
    assert "| u8 | 30.0 ms | 3.0 KiB |" in text
    assert "| head 16k | 16,384 | 10.0 ms |" in text
    assert "| GenAI prompt lookup | – | – | – | – | – | 3.00× | – | 20.0 ms | 1/1 | 1.50× |" in text  # over ours: 3 s / 2 s
    assert "Best fixed K: 2 at 2.00× (Leviathan: 1.65×)" in text and "ours prompt lookup 3.00×, GenAI prompt lookup 1.50×" in text


def test_the_transformers_lanes_beside_ours_are_read_from_the_table_as_written():
    """§2's transformers table, its headline and its target come from the section's rows of the run's table."""
    ours_ar, hf_ar = Lane("ours autoregressive", "specdemo", "autoregressive"), Lane("hf plain", "transformers", "autoregressive")
    ours = Lane("ours speculative", "specdemo", "speculative", ours_ar, k=4, k_policy="fixed", drafter="model")
    assisted = Lane("hf assisted", "transformers", "speculative", hf_ar, hf_ar, k=4, k_policy="fixed", drafter="model")
    runs = []
    for i in range(2):  # decode time per token: ours 9 ms spec / 19 ms AR; transformers 36 ms / 57 ms
        runs += [replace(_run(lane, i, wall_s, tokens=101, prefill_s=0.1), section="transformers")
                 for lane, wall_s in ((ours_ar, 2.0), (ours, 1.0), (hf_ar, 5.8), (assisted, 3.7))]
    sections = Sections(transformers=Figures())
    written = table.load(json.loads(strict_json.dumps({"schema": table.SCHEMA, "table": [table.row(r) for r in runs]})))

    text = report.peers_section(sections, {}, written)
    targets = {t.id: t for t in judge_targets(sections, written)}

    assert "| hf assisted | 3.70 s | 36.6 ms | 101 | 2/2 |" in text
    assert "| hf assisted / ours speculative | 4.00× |" in text and "| hf plain / ours autoregressive | 3.00× |" in text
    assert "| transformers speedup (AR / speculative) | 1.57× |" in text and "| ours speedup (AR / speculative) | 2.00× |" in text
    assert targets["transformers"].measured == pytest.approx(4.0) and targets["transformers"].where == "N=100"
    assert "takes **4.0×** our decoding time per token" in report._headlines(sections, written)


def test_the_report_shows_the_tune_the_models_ran_under_settings_by_times_and_the_draft_plan(tmp_path):
    """The tune file's trials and draft plan, as the bench records them, become the report's "Tuned" section."""
    from specdemo.learning import draft_choice, tune
    from specdemo.learning.profile import Profile, choices
    from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET
    from tests.learning.test_draft_choice import AVX2, option

    profile = Profile(tmp_path)
    fast = tune.Trial("target", choices.Setting(128, "f32", "u8"), seconds=0.0861, relative=0.83, agreement=1.0,
                      parting_rate=3.125, faithful=True, chosen=True)
    bf16 = tune.Trial("target", choices.Setting(32, "bf16", "f32"), seconds=0.09, agreement=0.9)
    full, trimmed = option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375)
    draft_choice.price([full, trimmed], AVX2)
    profile.keep_tune([fast, bf16], {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}, [full, trimmed])
    record = profile.tune_record(DEFAULT_DRAFT)
    text = report_tables.tune_section(json.loads(strict_json.dumps(record)))  # as benchmarks.json keeps it
    assert "| target | group 128, f32, KV u8 | 100.0 % | 86.1 ms | 0.83× | 3.1 | chosen |" in text
    assert "| target | group 32, bf16, KV f32 | 90.0 % | – | – | – | not faithful |" in text
    assert "| int4, head 16k | 16,000 | 37.5 ms | 90.0 % |" in text and text.count("| chosen |") == 2
    assert Profile(tmp_path / "untuned").tune_record(DEFAULT_DRAFT) == {}
    assert "Not tuned" in report_tables.tune_section({})


def test_the_watching_section_reads_the_run_a_pages_download_button_holds():
    from specdemo.bench import watching
    from specdemo.serve.downloads import Download
    from specdemo.ui.render import render_download

    text = '{"schema": 1, "instruction": "café ✓"}'
    assert watching.held_run(render_download(Download("specdemo-run-x.json", text))) == text
    with pytest.raises(ValueError, match="holds no run"):
        watching.held_run(render_download(None))  # greyed out: no run finished yet


def test_what_watching_costs_is_reported_as_ratios_to_the_cli():
    """Each mode's saved runs are rows of the table (their setting the mode); the report gives each figure's median over
    the repeats and, in brackets, the median of each repeat's figure over the CLI's of the same repeat."""
    from specdemo.bench import watching

    def saved(step_s, verify_s, draft_s, spec_wall_s):  # a saved run: 100 tokens a lane, the AR lane in 3 s
        ar = Summary("autoregressive", tokens=100, wall_s=3.0, target_step_s=step_s)
        spec = Summary("speculative", tokens=100, wall_s=spec_wall_s, verify_call_s=verify_s, draft_s=draft_s)
        return {"instruction": "x", AUTOREGRESSIVE: {"token_ids": [1], "summary": ar.to_dict()},
                SPECULATIVE: {"token_ids": [1], "summary": spec.to_dict()}}

    runs = [replace(r, section="watching", setting=mode) for repeat in range(2)
            for mode, saved_run in (("CLI", saved(0.040, 0.05, 2.0, 2.0)), ("page in Chromium", saved(0.050, 0.06, 2.5, 2.5)))
            for r in watching.rows(saved_run, repeat, 128)]

    text = watching.watching_section(Sections(watching=watching.Watching("x", 128, 2, 20)), {}, runs)

    assert text.startswith("## 8. What watching costs")
    assert "| page in Chromium | 50.0 ms (1.25×) | 60.0 ms (1.20×) | 2.50 s (1.25×) | 1.20× (0.80×) |" in text


def test_the_gating_rows_are_a_table_of_their_fields_a_gated_lane_that_stopped_said_so():
    from specdemo.bench import gating

    rows = [gating.Row("t(5) = 2.4 steps", "Write a function", 100, 0.62, 1.9, 1.5, 3, "gated K = 2", 1.0, 1.4, 1.35,
                       12, 4, True, False),
            gating.Row("t(5) = 2.4 steps", "Sort a list", 80, 0.4, 1.1, 0.9, 1, "K = 0", 1.0, 0.0, 0.0, 0, 0, False, True)]

    text = gating.gating_section(Sections(gating=gating.Gating(100, {}, rows)), {})

    assert "| Write a function | 100 | 0.62 | 1.90× | 1.50× (K = 3) | gated K = 2 | 1.00× | 1.40× (stopped) | 1.35× | 12 of 16 | NO |" in text
    assert "| Sort a list | 80 | 0.40 | 1.10× | 0.90× (K = 1) | K = 0 | 1.00× | – | – | – | yes |" in text  # no gate

def test_the_fidelity_table_reads_each_precision_as_compared_with_the_gguf():
    from specdemo.bench import report_gguf
    from specdemo.bench.schema import FidelitySection
    from specdemo.results.fidelity import Fidelity

    section = FidelitySection(3, [Fidelity("int8", "group 128, f32", 285, 0.9965, 0.0421),
                                  Fidelity("gguf", "its own blocks", 285, 1.0, 0.0)])

    text = report_gguf.fidelity_section(Sections(fidelity=section), {})

    assert "over the 3 built-in answers" in text and "at 285 positions" in text
    assert "| int8 | group 128, f32 | 99.7 % | 0.042 |" in text and "| gguf | its own blocks | 100.0 % | 0.000 |" in text
    assert list(bench.plain(section)["candidates"][0]) == ["precision", "compile_settings", "positions", "top1_agreement",
                                                           "mean_abs_logit_error"]  # in benchmarks.json

def test_where_two_of_our_lanes_part_the_run_record_judges_the_parting_by_its_margins():
    from specdemo.decoding.events import TokenEvent

    def lane(name, ids, margins, kind="autoregressive"):
        tokens = [TokenEvent(i, f"w{i}", "target", step, 0.0, margin=m) for step, (i, m) in enumerate(zip(ids, margins))]
        return Lane(name, "specdemo", kind, baseline=AR if kind == "speculative" else None,
                    generate=lambda instruction, prompt_ids, n: Output(ids, 1.0, 0.0, tokens=tokens))

    lanes = [lane("ar", [1, 2, 3], [3.0, 0.1, 2.0]), lane("spec", [1, 4, 5], [3.0, 0.05, 2.0], "speculative"),
             lane("wide", [1, 2, 6], [3.0, 0.1, 2.5], "speculative"), lane("same", [1, 2, 3], [3.0, 0.1, 2.0], "speculative")]
    log = []
    runs = measure(lanes, ["a"], [[0]], 3, bench.BenchSettings(warmup_tokens=1), log=log.append)
    near, wide, same = runs[1].parting, runs[2].parting, runs[3].parting
    assert near.index == 1 and near.tokens == ["w2", "w4"] and near.verdict == "near-tie"
    assert wide.index == 2 and wide.verdict == "defect"  # margins of 2 and 2.5 logits are no tie
    assert same is None and runs[0].parting is None
    assert "spec 1.00s (parted at token 2: near-tie)" in log[-1]


def test_the_memory_section_measures_each_mode_of_the_tiny_pair_in_a_process_of_its_own(tiny_target, tiny_draft):
    """bench --only memory: each mode's probe in its own process, the settings handed over as they are, a load, a run
    and its peaks read back as Peaks (it once failed before measuring: its result shadowed the memory module it reads,
    and the K policy came back from JSON as a dict)."""
    from types import SimpleNamespace

    from specdemo.bench import memory

    settings = RunSettings(exact(tiny_target), exact(tiny_draft), GenerationSettings(max_new_tokens=8))
    figures = memory.run_memory(SimpleNamespace(settings=settings, sweep_tokens=8, log=lambda m: None))

    for peaks in (figures.autoregressive, figures.speculative):
        assert 0 < peaks.rss_loaded_bytes <= peaks.peak_rss_generating_bytes <= peaks.peak_rss_process_bytes
        assert 0 < peaks.peak_anon_generating_bytes <= peaks.peak_anon_process_bytes
        assert peaks.tokens > 0 and peaks.private_bytes > 0
    assert set(figures.speculative.kv_cache_bytes) > set(figures.autoregressive.kv_cache_bytes)  # the draft's too


def test_the_precision_sweep_holds_one_target_at_a_time_beside_the_pair(monkeypatch):
    """Every target and draft precision held at once took 14 GiB of anonymous memory (AMX Xeon): the sweep now measures
    one target precision at a time (alone, then with each draft, back to back), letting each go before the next."""
    import gc
    import weakref
    from types import SimpleNamespace

    from specdemo.bench import sweeps
    from specdemo.settings import ModelSettings

    class Loaded:  # a loaded model: its settings, and how big it is on disk
        def __init__(self, settings):
            self.settings = settings

        def describe(self):
            return SimpleNamespace(size_on_disk_bytes=1)  # as LoadedModel.describe's Facts

    live: list[weakref.ref] = []  # every target the sweep loaded

    def load(settings, progress=None):
        model = Loaded(settings)
        if settings.source == "target":
            live.append(weakref.ref(model))
        return model

    held = []  # targets alive beside the pair at each sweep

    def measure_lanes(ctx, what, lanes):
        gc.collect()
        held.append(sum(ref() is not None for ref in live))
        return []

    monkeypatch.setattr(sweeps, "load_model", load)
    monkeypatch.setattr(sweeps, "sweep", measure_lanes)
    monkeypatch.setattr(sweeps, "Engine", lambda target, draft: SimpleNamespace(target=target, draft=draft))
    class Lane:  # a lane: its label (lanes key the sweep's rows, as table.Lane does)
        def __init__(self, label, engine, mode, generation, **kw):
            self.label = label

    monkeypatch.setattr(sweeps, "our_lane", Lane)
    pair = SimpleNamespace(target=Loaded(ModelSettings("target", "int8")), draft=Loaded(ModelSettings("draft", "int4")))
    ctx = SimpleNamespace(engine=pair, settings=RunSettings(ModelSettings("target", "int8"), ModelSettings("draft", "int4")),
                          bench=replace(bench.FULL, target_precisions=("int8", "gguf-mixed", "gguf", "int4"),
                                        draft_precisions=("int4", "int8", "fp16")),
                          log=lambda message: None, generation=GenerationSettings(), sweep_tokens=8,
                          k_label=lambda: "K = 4")
    figures = sweeps.run_precision(ctx)
    assert held == [0, 1, 1, 1]  # the pair's own target first, then each other precision alone
    assert [(r.target, r.draft) for r in figures.rows] == [
        (t, d) for t in ("int8", "gguf-mixed", "gguf", "int4") for d in ("int4", "int8", "fp16")]


@pytest.mark.parametrize("kernels_run", [True, False])
def test_the_precision_sweep_takes_our_kernels_layouts_only_where_they_run(monkeypatch, kernels_run):
    """Drafts and targets on specdemo's kernels (gguf-native, gguf-q4) join the sweep where the kernels run here."""
    from specdemo.bench import sweeps
    from specdemo.models import kernels

    monkeypatch.setattr(kernels, "_built", lambda: Path("libspecdemo_kernels.so") if kernels_run else None)
    monkeypatch.setattr(kernels, "_found_unavailable", lambda: False)
    monkeypatch.setattr(sweeps, "_loaded", lambda ctx, role, precision: precision)
    monkeypatch.setattr(sweeps, "_sweep_target", lambda ctx, target, drafts: [(target, d) for d in drafts])
    ctx = SimpleNamespace(bench=replace(bench.FULL, target_precisions=("int8", "gguf-native"),
                                        draft_precisions=("int4", "gguf-native", "gguf-q4")),
                          generation=GenerationSettings(), sweep_tokens=8, k_label=lambda: "K = 4")
    ours = ("gguf-native", "gguf-q4") if kernels_run else ()
    assert sweeps.run_precision(ctx).rows == [(t, d) for t in ("int8", *ours[:1]) for d in ("int4", *ours)]


def test_the_kv_sweep_compiles_the_pair_as_it_was_loaded_not_its_open_settings(monkeypatch):
    """The run's settings leave the target's layout and the draft's precision to the machine (faithful, auto); the KV
    sweep compiles the precisions the pair was loaded at (it once asked for the folder of an 'auto' draft and failed)."""
    from types import SimpleNamespace

    from specdemo.bench import sweeps
    from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET, ModelSettings

    loaded = []
    monkeypatch.setattr(sweeps, "load_model", lambda settings, progress=None: loaded.append(settings) or settings)
    monkeypatch.setattr(sweeps, "sweep", lambda ctx, what, lanes: [])
    monkeypatch.setattr(sweeps, "Engine", lambda target, draft: SimpleNamespace(
        target=SimpleNamespace(runtime=SimpleNamespace(kv_cache_precision=target.kv_cache_precision or "f32"))))
    class Lane:  # a lane: its label, hashable (lanes key the sweep's rows, as table.Lane does)
        def __init__(self, label, *args, **kw):
            self.label = label

    monkeypatch.setattr(sweeps, "our_lane", Lane)
    pair = SimpleNamespace(target=SimpleNamespace(settings=ModelSettings(DEFAULT_TARGET.source, "gguf-mixed"),
                                                  runtime=SimpleNamespace(kv_cache_precision="f32")),
                           draft=SimpleNamespace(settings=ModelSettings(DEFAULT_DRAFT.source, "int4")))
    ctx = SimpleNamespace(engine=pair, settings=RunSettings(), bench=replace(bench.FULL, kv_cache_precisions=("u8", "")),
                          log=lambda message: None, generation=GenerationSettings(), sweep_tokens=8,
                          k_label=lambda: "K = 4")
    sweeps.run_kv(ctx)
    assert [(s.precision, s.kv_cache_precision) for s in loaded] == [("gguf-mixed", "u8"), ("int4", "u8")]


def test_transformers_peer_times_its_first_token_apart_plain_and_assisted(tiny_hf):
    from specdemo.bench.peers import TransformersPair

    pair = TransformersPair(tiny_hf, tiny_hf)
    for k in (None, 2):
        run = pair.generate([1, 2, 3], 6, eos_ids={10**6}, k=k)  # an EOS it never writes: 6 tokens
        assert len(run.ids) == 6 and 0 < run.first_s < run.wall_s


def test_a_speculative_lane_that_drafted_no_round_is_said_so_not_divided_by_zero():
    from specdemo.bench.report import _round_costs

    assert "drafted no round" in _round_costs(speculative_figures([]), 0.08, {"goal": 2.0})


def test_a_peer_in_a_process_of_its_own_writes_what_it_writes_in_this_one(tiny_hf):
    from specdemo.bench.peers import PeerProcess, TransformersPair

    here = TransformersPair(tiny_hf, None).generate([1, 2, 3], 6, eos_ids={10**6})
    apart = PeerProcess(TransformersPair, tiny_hf, None)

    run = apart.generate([1, 2, 3], 6, eos_ids={10**6})

    apart.close()
    assert run.ids == here.ids and 0 < run.first_s < run.wall_s


def test_a_peer_process_raises_its_childs_error_where_it_was_asked(tmp_path):
    from specdemo.bench.peers import PeerProcess, TransformersPair

    with pytest.raises(OSError):
        PeerProcess(TransformersPair, tmp_path / "no model here", None)  # from_pretrained's error, from the child
