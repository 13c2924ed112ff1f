"""Each figure described once (specdemo/results/figures.py): the CLI, the page and `show` say it by the same label and write
its value the same way, so a new figure is its description and nothing else."""

import json

import pytest

from specdemo.results import runfile
from specdemo.results.figures import FIGURES, GLOSSARY, figure
from specdemo.results.lane import drain
from specdemo.results.metrics import Summary, measured_speedup
from specdemo.results.record import Record
from specdemo.results.would import Counterfactual, Walk, sentences
from specdemo.settings import KPolicy, GenerationSettings, RunSettings
from specdemo.ui import render
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.serve.values import ONE_AFTER_ANOTHER
from tests.conftest import exact

PROMPT = "w5 w17 w99 w3 w250 w42 w7"


def recorded(ar, spec, settings: RunSettings) -> Record:
    return Record(PROMPT, settings.configuration, settings, {AUTOREGRESSIVE: ar, SPECULATIVE: spec})


def rendered(record: Record, capsys) -> tuple[str, str, str]:
    """The one Record as the terminal, the page and `show` (from its file form) say it."""
    from specdemo.cli.terminal import print_record

    print_record(record)
    show = runfile.compare([Record.from_json(json.loads(runfile.dumps(record)))], ["run.json"])
    return capsys.readouterr().out, render.render_results(record, ONE_AFTER_ANOTHER), show


@pytest.mark.parametrize("key, value, written", [
    ("verify_call_s", 0.0612, "61 ms"), ("draft_step_s", 0.01234, "12.3 ms"), ("measured_speedup", 1.9, "1.90×"),
    ("draft_acceptance_rate", 0.873, "87%"), ("wall_s", 3.14159, "3.14 s"), ("target_calls", 1234, "1,234"),
    ("acceptance_by_position", [0.95, 0.8], "0.95 0.80"), ("alpha_hat", None, "–"), ("ttft_s", float("nan"), "–"),
])
def test_a_figure_is_written_with_its_unit_and_digits(key, value, written):
    assert figure(key).format(value) == written


def test_every_figure_names_a_summary_field_and_the_glossary_is_the_described_ones():
    fields = set(Summary.__dataclass_fields__)
    assert all(f.key in fields or f.key == "measured_speedup" for f in FIGURES)
    assert len({f.label for f in FIGURES}) == len(FIGURES)  # one label, one figure
    assert {f.key for f in GLOSSARY} >= {"alpha_hat", "mean_acceptance_length", "measured_speedup", "predicted_speedup"}


def test_the_cli_the_page_and_show_say_and_write_a_figure_the_same_way(tiny_engine, tiny_target, tiny_draft, capsys):
    settings = GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(3))
    ar, spec = (drain(run(PROMPT, settings)) for run in (tiny_engine.autoregressive, tiny_engine.speculative))
    record = recorded(ar, spec, RunSettings(exact(tiny_target), exact(tiny_draft), settings))
    cli, page, show = rendered(record, capsys)
    s = spec.summary
    shown = {"alpha_hat": s.alpha_hat, "mean_acceptance_length": s.mean_acceptance_length,
             "measured_speedup": measured_speedup(ar.summary, s), "verify_call_s": s.verify_call_s}
    for key, value in shown.items():
        for where, text in (("CLI", cli), ("page", page), ("show", show)):
            assert figure(key).label in render.escape(text) or figure(key).label in text, (key, where)
            assert figure(key).format(value) in text, (key, where)


def test_a_new_figure_is_its_description_and_nothing_else(tiny_engine, tiny_target, tiny_draft, capsys, monkeypatch):
    """Described with its places, a figure the renderers never heard of appears in the CLI, the page and `show`."""
    from specdemo.results import figures
    from specdemo.results.figures import EVERYWHERE, Figure
    rate = Figure("rollback_s", "time rolling back", "ms", 2, places=EVERYWHERE)
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, rate))
    settings = GenerationSettings(max_new_tokens=16, k_policy=KPolicy.fixed(3))
    ar, spec = (drain(run(PROMPT, settings)) for run in (tiny_engine.autoregressive, tiny_engine.speculative))
    written = rate.format(spec.summary.rollback_s)
    record = recorded(ar, spec, RunSettings(exact(tiny_target), exact(tiny_draft), settings))
    for text in rendered(record, capsys):
        assert "time rolling back" in text and written in text


def test_the_cli_and_the_page_say_what_each_k_would_have_given_in_the_same_sentences(tiny_engine, tiny_target,
                                                                                        tiny_draft, capsys):
    settings = GenerationSettings(max_new_tokens=16, k_policy=KPolicy.fixed(3))
    ar, spec = (drain(run(PROMPT, settings)) for run in (tiny_engine.autoregressive, tiny_engine.speculative))
    record = recorded(ar, spec, RunSettings(exact(tiny_target), exact(tiny_draft), settings))
    walk = lambda k, calls, speedup: Walk(k, calls - 1, calls, calls * k, 1.0, speedup)  # noqa: E731
    record.would = Counterfactual(16, [1] * 16, 1.2, fixed=[walk(1, 9, 1.1), walk(2, 7, 1.25)], oracle=walk(0, 6, 1.4),
                                  replayed={})
    said = sentences(record.would, spec.summary.target_calls)
    assert said[0].startswith("On this very answer") and "the best fixed K = 2 would have given 1.25× in 7" in said[0]
    cli, page, _ = rendered(record, capsys)
    assert all(sentence in cli and render.escape(sentence) in page for sentence in said)
