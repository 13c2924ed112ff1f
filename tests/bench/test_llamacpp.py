"""The llama.cpp peer (specdemo/bench/llamacpp.py) and its bench section: skipped in one line without
llama_cpp, its figures paired by the lanes' fields, and a short real run on the target GGUF."""

import sys

import numpy as np
import pytest

from specdemo.bench import FULL, QUICK, llamacpp
from specdemo.bench.harness import Context, Lane, Run
from specdemo.bench.report_gguf import llamacpp_section
from specdemo.bench.sections import llamacpp_figures, run_llamacpp
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

    assert section == {"skipped": llamacpp.SKIPPED}
    assert lines == [llamacpp.SKIPPED]
    assert llamacpp_section({"llamacpp": section}, {}).endswith("\n\n" + llamacpp.SKIPPED)


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


def test_our_speculative_tokens_per_second_over_each_llama_cpp_mode_is_paired_per_instruction():
    lanes = _lanes()
    # Seconds for 100 tokens, per lane, on two instructions; the second instruction runs everything twice as slow.
    seconds = {"ours AR": 5.0, "ours spec": 2.5, "cpp AR": 4.0, "cpp lookup": 5.0, "cpp draft": 3.0}
    runs = [Run(lane, i, 0, 100, seconds[lane.label] * (1 + i), 100, 0.0, **({"proposed": 40, "accepted": 30} if lane.drafter else {}))
            for i in range(2) for lane in lanes]

    figures = llamacpp_figures(lanes, runs)

    ratio = {(r["numerator"], r["denominator"]): r for r in figures["ratios"].values()}
    assert ratio[("cpp draft", "ours spec")]["median"] == pytest.approx(3.0 / 2.5)
    assert ratio[("cpp lookup", "ours spec")]["median"] == pytest.approx(5.0 / 2.5)
    assert ratio[("cpp AR", "ours AR")]["median"] == pytest.approx(4.0 / 5.0)
    assert figures["speedup"]["cpp draft"]["median"] == pytest.approx(4.0 / 3.0)
    assert figures["acceptance"]["cpp draft"] == pytest.approx(0.75)
    assert figures["lanes"]["cpp AR"]["tokens_per_s"]["max"] == pytest.approx(25.0)


def test_the_report_names_our_lane_over_each_llama_cpp_lane():
    lanes = _lanes()
    runs = [Run(lane, 0, 0, 100, 2.0 if lane.framework == "specdemo" else 4.0, 100, 0.0) for lane in lanes]
    section = {"k": 4, "k_label": "auto K", "max_new_tokens": 100, "threads": 2, "version": "0.0", "system_info": "AVX2 = 1",
               **llamacpp_figures(lanes, runs)}

    text = llamacpp_section({"llamacpp": section}, {})

    assert "| ours spec ÷ cpp draft | 2.00× |" in text
    assert "| ours spec ÷ cpp lookup | 2.00× |" in text
    assert "| ours AR ÷ cpp AR | 2.00× |" in text
