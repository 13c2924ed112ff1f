"""The llama.cpp peer (specdemo/bench/llamacpp.py) and its bench section: skipped in one line without
llama_cpp, its figures paired by the lanes' fields, and a short real run on the target GGUF."""

import json
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import USER_HOME

from specdemo.bench.schema import Sections
from specdemo import strict_json
from specdemo.bench import FULL, QUICK, llamacpp, table
from specdemo.bench.harness import Context, measure, peer_lane
from specdemo.bench.table import Lane, Output, Run
from specdemo.bench.report_gguf import llamacpp_section
from specdemo.bench.schema import LlamaCpp, Skipped
from specdemo.bench.sections import run_llamacpp, speculative_simple_runs
from specdemo.models import export
from specdemo.settings import RunSettings


@pytest.fixture
def no_llama_cpp(monkeypatch):
    """llama_cpp as if it were not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


def test_the_peer_says_in_one_line_that_llama_cpp_is_missing(no_llama_cpp):
    assert llamacpp.missing() == "llama.cpp: skipped (pip install -r requirements-llamacpp.txt)"


def test_the_section_is_skipped_with_that_line_and_the_report_shows_it(no_llama_cpp):
    lines = []
    ctx = Context(engine=None, settings=RunSettings(), bench=FULL, log=lines.append)  # nothing may be loaded

    section = run_llamacpp(ctx)

    assert section == Skipped(llamacpp.SKIPPED)
    assert lines == [llamacpp.SKIPPED]
    assert llamacpp_section(Sections(llamacpp=section), {}, []).endswith("\n\n" + llamacpp.SKIPPED)


def test_the_full_bench_measures_llama_cpp_and_the_quick_one_does_not():
    assert "llamacpp" in FULL.sections
    assert "llamacpp" not in QUICK.sections


def test_a_local_gguf_is_used_as_it_is_and_an_ir_folder_has_none(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "ir").mkdir()

    assert llamacpp.gguf_path(str(gguf)) == gguf
    assert llamacpp.gguf_path(str(tmp_path / "ir")) is None


def test_a_preset_gguf_is_assembled_once_into_specdemo_home(home, monkeypatch):
    assembled = []

    def assemble(model, dest, progress):
        assembled.append(model.title)
        dest.write_bytes(b"GGUF")

    monkeypatch.setattr(export, "assemble_parts", assemble)

    first = llamacpp.gguf_path("qwen2.5-coder-0.5b")
    again = llamacpp.gguf_path("qwen2.5-coder-0.5b")

    assert first == again == home / "bench" / "gguf" / "qwen2.5-coder-0.5b.gguf"
    assert assembled == ["Qwen2.5-Coder-0.5B-Instruct"]
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch file left behind


def test_the_tally_counts_the_drafts_the_target_kept():
    tally = llamacpp.Tally(lambda ids: np.array([7, 8, 9], dtype=np.intc))

    tally(np.zeros(10, dtype=np.intc))  # round 1 drafts 3 after 10 ids
    tally(np.zeros(12, dtype=np.intc))  # 1 draft kept, then the target's own token
    tally(np.zeros(16, dtype=np.intc))  # all 3 kept, then the bonus token

    assert (tally.proposed, tally.accepted) == (6, 4)


def _lanes() -> list[Lane]:
    ours_ar = Lane("ours AR", "specdemo", "autoregressive")
    cpp_ar = Lane("cpp AR", "llamacpp", "autoregressive")
    return [
        ours_ar,
        Lane("ours spec", "specdemo", "speculative", baseline=ours_ar),
        cpp_ar,
        Lane("cpp lookup", "llamacpp", "speculative", baseline=cpp_ar, reference=cpp_ar, k=4, k_policy="fixed", drafter="prompt-lookup"),
        Lane("cpp draft", "llamacpp", "speculative", baseline=cpp_ar, reference=cpp_ar, k=4, k_policy="fixed", drafter="model"),
    ]


SECTION = LlamaCpp(4, "K = 4", 100, 2, "0.0", "AVX2 = 1", None, {}, [])


def _report(runs: list[Run]) -> str:
    """The llamacpp section's report part over `runs` as the table writes and reads them back."""
    rows = [table.row(replace(r, section="llamacpp")) for r in runs]
    return llamacpp_section(Sections(llamacpp=SECTION), {}, table.load(json.loads(strict_json.dumps({"table": rows}))))


def test_our_speculative_tokens_per_second_over_each_llama_cpp_mode_is_paired_per_instruction():
    lanes = _lanes()
    # Seconds for 100 tokens, per lane, on two instructions; the second instruction runs everything twice as slow.
    seconds = {"ours AR": 5.0, "ours spec": 2.5, "cpp AR": 4.0, "cpp lookup": 5.0, "cpp draft": 3.0}
    runs = [Run(lane, i, 0, 100, seconds[lane.label] * (1 + i), 100, 0.0, **({"proposed": 40, "accepted": 30} if lane.drafter else {}))
            for i in range(2) for lane in lanes]

    text = _report(runs)

    assert "| ours spec ÷ cpp draft | 1.20× |" in text  # 3.0 / 2.5
    assert "| ours spec ÷ cpp lookup | 2.00× |" in text
    assert "| ours AR ÷ cpp AR | 0.80× |" in text
    # decode 99 tokens in 3 and 6 s, 100 with the prefill; acceptance 30 of 40; speedup 4 s / 3 s
    assert "| cpp draft | 24.8 tokens/s (16.5–33.0) | 0.00 s | 25.0 tokens/s (16.7–33.3) | 4.50 s (3.00–6.00) | 100 | 75 % | 1.33× | 2/2 |" in text
    assert "| ours spec | 29.7 tokens/s (19.8–39.6) | 0.00 s | 30.0 tokens/s (20.0–40.0) | 3.75 s (2.50–5.00) | 100 | – | 2.00× | 2/2 |" in text


def test_the_report_names_our_lane_over_each_llama_cpp_lane():
    runs = [Run(lane, 0, 0, 100, 2.0 if lane.framework == "specdemo" else 4.0, 100, 0.0) for lane in _lanes()]

    text = _report(runs)

    assert "| ours spec ÷ cpp draft | 2.00× |" in text
    assert "| ours spec ÷ cpp lookup | 2.00× |" in text
    assert "| ours AR ÷ cpp AR | 2.00× |" in text


# ---- llama.cpp's own tools: found where built, their output parsed from recorded samples

# llama-bench -m qwen2.5-coder-0.5b.gguf -p 42 -n 16 -t 2 -o json -r 2 (fields trimmed), and llama-speculative-simple
# with the 0.5B as target and draft, -n 16, K 4: recorded on the 2-core Zen 3 (AMD EPYC, avx2) while other work
# loaded it, so their rates say nothing of llama.cpp
LLAMA_BENCH_JSON = """[
{"build_commit": "0c1e570", "cpu_info": "AMD EPYC", "backends": "CPU", "model_type": "qwen2 1B Q4_K - Medium", "n_threads": 2, "n_prompt": 42, "n_gen": 0, "avg_ns": 4010997800, "stddev_ns": 1059216845, "avg_ts": 10.849518, "stddev_ts": 2.86512, "samples_ts": [8.82357, 12.8755]},
{"build_commit": "0c1e570", "cpu_info": "AMD EPYC", "backends": "CPU", "model_type": "qwen2 1B Q4_K - Medium", "n_threads": 2, "n_prompt": 0, "n_gen": 16, "avg_ns": 19102049613, "stddev_ns": 3674696895, "avg_ts": 0.899741, "stddev_ts": 0.334379, "samples_ts": [1.13618, 0.663299]}
]"""

SPECULATIVE_SIMPLE_LOG = """1.34.257.283 I encoded   41 tokens in   12.467 seconds, speed:    3.289 t/s
1.34.257.321 I decoded   20 tokens in   63.452 seconds, speed:    0.315 t/s
1.34.257.346 I
1.34.257.371 I n_draft   = 4
1.34.257.395 I n_predict = 20
1.34.257.419 I n_drafted = 16
1.34.257.443 I n_accept  = 16
1.34.257.469 I accept    = 100.000%
1.34.257.493 I
1.34.257.517 I draft:
"""


def test_llama_bench_json_gives_its_pp_and_tg_rates():
    assert llamacpp.bench_rates(LLAMA_BENCH_JSON) == (10.849518, 0.899741)


def test_speculative_simple_output_gives_its_prefill_decoding_and_drafts():
    assert llamacpp.printed(SPECULATIVE_SIMPLE_LOG) == llamacpp.Printed(41, 12.467, 20, 63.452, 16, 16)


def test_llama_cpp_tools_are_found_in_llamacpp_bin_and_are_none_where_not_built(tmp_path, monkeypatch):
    program = tmp_path / "llama-bench"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("LLAMACPP_BIN", str(tmp_path))

    assert llamacpp.tool("llama-bench") == program
    assert llamacpp.tool("llama-speculative-simple") is None


def test_without_llama_cpps_tools_the_section_adds_no_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMACPP_BIN", str(tmp_path))  # an empty folder: nothing built
    ctx = Context(engine=None, settings=RunSettings(), bench=FULL, log=print)

    assert speculative_simple_runs(ctx, tmp_path / "t.gguf", tmp_path / "d.gguf", [[1, 2]], 8, 2, _lanes()[2]) == []


def test_the_report_says_so_where_the_bindings_decode_more_than_10_percent_off_llama_bench():
    bench = Lane("llama-bench (pp, tg)", "llamacpp", "autoregressive")
    runs = [Run(lane, 0, 0, 100, 2.0 if lane.framework == "specdemo" else 4.0, 100, 0.0) for lane in _lanes()]
    near = Run(bench, -1, 0, 100, 4.0, 100, 0.3)  # 99 tokens in 3.7 s: the bindings' 99 in 4 s are 0.93x
    far = Run(bench, -1, 0, 100, 3.0, 100, 0.0)  # 99 in 3 s: the bindings are at 0.75x

    within, off = _report(runs + [near]), _report(runs + [far])

    assert "at 0.93× llama-bench's tg rate: within 10 %" in within
    assert "**The bindings decode at 0.75× llama-bench's tg rate**, more than 10 % off" in off
    # a file from before llama-bench ran beside the lanes (once, as instruction -1) is not said to have
    assert "ran back to back" not in within and "ran back to back" in _report(runs + [replace(near, instruction=0)])


DRAFT_GGUF = USER_HOME / "bench" / "gguf" / "qwen2.5-coder-0.5b.gguf"  # assembled by an earlier bench run, read only


@pytest.mark.skipif(llamacpp.tool("llama-bench") is None or not DRAFT_GGUF.is_file(),
                    reason="llama.cpp's llama-bench is not built here (LLAMACPP_BIN or PATH), or the 0.5B GGUF is not in "
                    "the user's SPECDEMO_HOME/bench/gguf: its output's parsing is tested on a recorded sample above")
def test_llama_bench_runs_on_the_draft_gguf_and_its_output_parses():
    pp, tg = llamacpp.llama_bench(DRAFT_GGUF, 8, 4, 2, repetitions=1)
    assert pp > 0 and tg > 0


def test_llama_bench_runs_beside_the_bindings_on_each_instruction_its_prefill_at_pps_rate_its_decoding_at_tgs(
        tmp_path, monkeypatch):
    program = tmp_path / "llama-bench"  # a stand-in that notes its arguments and prints the recorded sample
    (tmp_path / "sample.json").write_text(LLAMA_BENCH_JSON)
    program.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\ncat {tmp_path / 'sample.json'}\n")
    program.chmod(0o755)
    monkeypatch.setenv("LLAMACPP_BIN", str(tmp_path))
    bindings = Lane("cpp AR", "llamacpp", "autoregressive", generate=lambda i, ids, n: Output([7] * n, 2.0, 0.5))
    bench = peer_lane(Lane("llama-bench (pp, tg)", "llamacpp", "autoregressive"), llamacpp.bench_output,
                      model=tmp_path / "t.gguf", threads=2)

    runs = measure([bindings, bench], ["a", "b"], [[1] * 42, [1] * 44], 16, FULL, log=lambda message: None)

    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["42", "42", "44"]  # warm-up, then each instruction's prompt in turn
    rows = [r for r in runs if r.lane.label == "llama-bench (pp, tg)"]
    assert [r.instruction for r in rows] == [0, 1]
    assert [r.lane.label for r in runs[:2]] == ["cpp AR", "llama-bench (pp, tg)"]  # back to back on an instruction
    assert all(r.tokens == 17 and not r.same_as_reference for r in rows)  # its own tokens: none compared
    assert rows[1].prefill_s == pytest.approx(44 / 10.849518)  # this prompt's length at pp's rate
    assert rows[1].decode_rate == pytest.approx(0.899741)  # tg's rate
