"""The page's pure parts: rendering events, reading the page's values, running the lanes (with fake engines), and
what the page refuses to take from a visitor."""

import queue
import re
import threading

import pytest

from specdemo import ui
from specdemo.events import ACCEPTED, BONUS, CORRECTED, TARGET, Summary, TokenEvent
from specdemo.settings import DRAFTERS, GenerationSettings

PAGE_DEFAULTS = dict(max_new_tokens=48.0, k=4.0, adaptive=False, drafter="model", decoding="greedy",
                     temperature=0.7, top_p=0.95, top_k=50.0, seed=None)


def token(text, source=ACCEPTED, step=1, t=0.1, **extra):
    return TokenEvent(id=len(text), text=text, source=source, step=step, t=t, **extra)


def lane_with(events, **summary):
    lane = ui.LaneRun(events=list(events))
    lane.summary = Summary(tokens=len(events), **summary)
    return lane


# ----------------------------------------------------------------------------- tokens


def test_tokens_are_coloured_by_provenance():
    html = ui.render_tokens([token("a", TARGET, 0), token("b", ACCEPTED), token("c", CORRECTED), token("d", BONUS)])
    for source in (TARGET, ACCEPTED, CORRECTED, BONUS):
        assert f'class="sd-tok sd-{source}"' in html


def test_token_text_is_escaped_so_model_output_shows_literally():
    html = ui.render_tokens([token('<script>alert("x")</script> & f"{name}" `${total}`')])
    assert "<script>" not in html
    assert "&lt;script&gt;" in html and "&amp;" in html
    assert "{" not in html and "$" not in html  # the HTML component's templating never sees them


def test_rejected_drafts_stay_struck_through_where_they_were_rejected():
    html = ui.render_tokens([token(" the"), token(" sky", CORRECTED, rejected=[7, 8], rejected_text=" sea is")])
    assert html.index(" the") < html.index('<del class="sd-rejected"') < html.index(" sky")
    assert "2 draft token(s) rejected" in html


def test_hover_title_gives_step_and_probabilities_when_sampling():
    title = ui.token_title(token("x", ACCEPTED, step=3, p_target=0.8125, p_draft=0.5))
    assert title == "step 3 · accepted draft · p_target 0.812 · p_draft 0.500"


def test_greedy_hover_title_gives_step_and_provenance_only():
    assert ui.token_title(token("x", CORRECTED, step=2)) == "step 2 · corrected by target"
    assert ui.token_title(token("x", TARGET, step=0)) == "step 0 · target"


# ----------------------------------------------------------------------------- the page's values


def test_page_values_become_generation_settings():
    settings = ui.generation_settings(**PAGE_DEFAULTS)
    assert settings == GenerationSettings(max_new_tokens=48, k=4, temperature=0.0, top_k=0, top_p=1.0, seed=None)


def test_sampling_uses_temperature_top_p_top_k_and_seed():
    settings = ui.generation_settings(**{**PAGE_DEFAULTS, "decoding": "sampling", "seed": 7.0})
    assert (settings.temperature, settings.top_p, settings.top_k, settings.seed) == (0.7, 0.95, 50, 7)


def test_adaptive_k_may_grow_past_a_large_starting_k():
    settings = ui.generation_settings(**{**PAGE_DEFAULTS, "k": 12.0, "adaptive": True})
    assert settings.k_max == 12


@pytest.mark.parametrize("change, message", [
    ({"k": 0}, "k must be between 1 and 64"),
    ({"k": 2.5}, "k must be a whole number"),
    ({"decoding": "sampling", "temperature": float("nan")}, "temperature must be in"),
    ({"max_new_tokens": 1025}, "capped at 1,024"),
])
def test_impossible_values_are_refused_with_a_sentence(change, message):
    with pytest.raises(ValueError, match=message):
        ui.generation_settings(**{**PAGE_DEFAULTS, **change})


def test_instruction_length_is_capped_on_the_server():
    ui.check_instruction("x" * ui.MAX_INSTRUCTION_CHARS)
    with pytest.raises(ValueError, match="at most 20,000"):
        ui.check_instruction("x" * (ui.MAX_INSTRUCTION_CHARS + 1))


def test_errors_are_shown_as_sentences():
    assert ui.as_sentence(ValueError("the instruction is empty")) == "The instruction is empty."


def test_examples_cover_code_prose_a_pasted_text_and_another_language():
    examples = ui.load_examples()
    assert len(examples) >= 4
    assert all(e["drafter"] in DRAFTERS and e["instruction"].strip() and e["label"] for e in examples)
    assert any(e["drafter"] == "prompt-lookup" for e in examples)
    assert any(not e["instruction"].isascii() for e in examples)
    assert all(len(e["instruction"]) <= ui.MAX_INSTRUCTION_CHARS for e in examples)


# ----------------------------------------------------------------------------- figures and charts


def test_speedup_compares_throughput():
    assert ui.measured_speedup(Summary(mode="autoregressive", tokens_per_s=5.0), Summary(mode="speculative", tokens_per_s=9.0)) == 1.8


def test_results_say_which_mode_produced_the_numbers():
    ar = lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, target_calls=48, stop_reason="eos")
    spec = lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=10.0, target_calls=12, draft_acceptance_rate=0.75, alpha=0.8,
                     tokens_per_call=4.0, expected_speedup=2.5, stop_reason="eos")
    one = ui.render_results(ar, spec, ui.ONE_AFTER_ANOTHER, GenerationSettings())
    assert "2.00×" in one and "2.50×" in one and "75%" in one and "36 of 48" in one
    assert "one after another" in one and "same 1 tokens" in one
    assert "race" in ui.render_results(ar, spec, ui.RACE, GenerationSettings())


def test_results_of_a_stopped_run_give_no_speedup():
    ar = lane_with([], mode="autoregressive", stop_reason="eos")
    spec = lane_with([], mode="speculative", stop_reason="cancelled")
    assert "Stopped" in ui.render_results(ar, spec, ui.ONE_AFTER_ANOTHER, GenerationSettings())
    assert "Stopped" in ui.render_results(ar, ui.LaneRun(), ui.ONE_AFTER_ANOTHER, GenerationSettings())


def test_lane_figures_show_elapsed_tokens_rate_and_first_token():
    html = ui.render_lane_figures(lane_with([token("a", t=0.25), token("b", t=0.5)], mode="speculative", wall_s=1.0, tokens_per_s=2.0, ttft_s=0.25), 0.0)
    assert "1.0 s" in html and ">2<" in html and "2.0" in html and "0.25 s" in html


def test_timeline_has_both_lanes_from_the_origin_even_before_they_run():
    frame = ui.timeline_frame({ui.AUTOREGRESSIVE: ui.LaneRun(events=[token("a", t=0.5), token("b", t=0.75)]),
                               ui.SPECULATIVE: ui.LaneRun()})
    assert frame.values.tolist() == [[0.0, 0, "autoregressive"], [0.5, 1, "autoregressive"], [0.75, 2, "autoregressive"],
                                     [0.0, 0, "speculative"]]


def test_histogram_counts_rounds_by_accepted_draft_tokens():
    frame = ui.histogram_frame(Summary(mode="speculative", accepted_histogram=[2, 0, 1, 0, 5]))
    assert frame.values.tolist() == [["0", 2], ["1", 0], ["2", 1], ["3", 0], ["4", 5]]


def test_model_panel_shows_sizes_precisions_devices_and_kv_cache():
    model = dict(name="Tiny", parameters=1_777_029_120, precision="int8", size_on_disk_bytes=1_782_835_973, device="CPU",
                 kv_cache_precision="f16", layers=28, context_length=32768)
    html = ui.render_models(model, {**model, "precision": "int4"}, threads=1, kv_cache_bytes={"target": 2_800_000})
    for text in ("1.78 B", "INT8", "INT4", "1.66 GiB", "f16, 2.7 MiB", "f16, – until a run", "CPU", "32,768 tokens"):
        assert text in html


# ----------------------------------------------------------------------------- running the lanes


class FakeEngine:
    """Yields `tokens` events per lane; `meet` makes each lane wait for the other to have started."""

    def __init__(self, tokens=3, meet=None, until_cancelled=False):
        self.tokens, self.meet, self.until_cancelled = tokens, meet, until_cancelled
        self.log = []

    def autoregressive(self, instruction, settings, cancel):
        yield from self._run("autoregressive", cancel)

    def speculative(self, instruction, settings, cancel):
        yield from self._run("speculative", cancel)

    def _run(self, mode, cancel):
        self.log.append(f"{mode} starts")
        if self.meet is not None:
            self.meet.wait(timeout=5)
        n = 0
        while (n < self.tokens or self.until_cancelled) and not cancel.is_set():
            n += 1
            yield token("x", TARGET, step=n, t=n * 0.01)
            cancel.wait(0.01)
        self.log.append(f"{mode} ends")
        yield Summary(mode=mode, tokens=n, stop_reason="cancelled" if cancel.is_set() else "max_new_tokens")


def run_lanes(engines, mode, cancel=None):
    lanes = {name: ui.LaneRun() for name in ui.LANES}
    inbox = queue.SimpleQueue()
    threads = ui.start_lanes(engines, "hi", GenerationSettings(), mode, cancel or threading.Event(), inbox)
    updates = sum(1 for _ in ui.follow(lanes, threads, inbox))
    return lanes, updates


def test_one_after_another_runs_the_speculative_lane_after_the_autoregressive_one():
    engine = FakeEngine()
    lanes, _ = run_lanes({ui.AUTOREGRESSIVE: engine, ui.SPECULATIVE: engine}, ui.ONE_AFTER_ANOTHER)
    assert engine.log == ["autoregressive starts", "autoregressive ends", "speculative starts", "speculative ends"]
    assert [len(lanes[name].events) for name in ui.LANES] == [3, 3]
    assert all(lane.summary.stop_reason == "max_new_tokens" for lane in lanes.values())


def test_race_runs_both_lanes_at_once():
    meet = threading.Barrier(2)  # breaks (and the lanes log no tokens) unless both lanes start together
    engines = {ui.AUTOREGRESSIVE: FakeEngine(meet=meet), ui.SPECULATIVE: FakeEngine(meet=meet)}
    lanes, _ = run_lanes(engines, ui.RACE)
    assert not meet.broken
    assert [len(lanes[name].events) for name in ui.LANES] == [3, 3]


def test_cancel_stops_both_lanes_after_their_current_step():
    cancel = threading.Event()
    engines = {ui.AUTOREGRESSIVE: FakeEngine(until_cancelled=True), ui.SPECULATIVE: FakeEngine(until_cancelled=True)}
    threading.Timer(0.2, cancel.set).start()
    lanes, _ = run_lanes(engines, ui.RACE, cancel)
    assert all(lane.summary.stop_reason == "cancelled" for lane in lanes.values())


def test_a_cancelled_run_one_after_another_never_starts_the_second_lane():
    cancel = threading.Event()
    engine = FakeEngine(until_cancelled=True)
    threading.Timer(0.2, cancel.set).start()
    lanes, _ = run_lanes({ui.AUTOREGRESSIVE: engine, ui.SPECULATIVE: engine}, ui.ONE_AFTER_ANOTHER, cancel)
    assert engine.log == ["autoregressive starts", "autoregressive ends"]
    assert lanes[ui.SPECULATIVE].summary is None


def test_updates_are_throttled_however_fast_tokens_come():
    engine = FakeEngine(tokens=30)  # about 0.3 s of tokens at one per 10 ms
    _, updates = run_lanes({ui.AUTOREGRESSIVE: engine, ui.SPECULATIVE: engine}, ui.ONE_AFTER_ANOTHER)
    assert updates <= 0.8 / ui.UPDATE_INTERVAL_S


def test_a_failing_lane_is_reported_as_a_sentence():
    class Broken(FakeEngine):
        def speculative(self, instruction, settings, cancel):
            raise RuntimeError("the device was lost")
            yield

    lanes, _ = run_lanes({ui.AUTOREGRESSIVE: FakeEngine(), ui.SPECULATIVE: Broken()}, ui.RACE)
    assert lanes[ui.SPECULATIVE].error == "The device was lost."
    assert lanes[ui.AUTOREGRESSIVE].summary is not None


def test_stop_cancels_only_that_visitors_run():
    mine, theirs = ui._begin_run("me"), ui._begin_run("them")
    assert ui.cancel_run("me")
    assert mine.is_set() and not theirs.is_set()
    ui._end_run("me", mine)
    ui._end_run("them", theirs)
    assert not ui.cancel_run("me")


# ----------------------------------------------------------------------------- page safety


def test_the_only_free_text_the_page_takes_is_the_instruction_so_no_model_can_be_named():
    config = ui.build().get_config_file()
    components = {c["id"]: c for c in config["components"]}
    inputs = [components[i] for event in config["dependencies"] for i in event["inputs"]]
    assert [c["props"]["elem_id"] for c in inputs if c["type"] == "textbox"] == ["instruction"]
    assert {c["type"] for c in inputs} <= {"textbox", "slider", "radio", "dropdown", "checkbox", "number", "dataset"}
    for dropdown in (c for c in inputs if c["type"] == "dropdown"):
        assert not dropdown["props"]["allow_custom_value"]
        assert {value for _, value in dropdown["props"]["choices"]} <= set(ui.offered_devices())


@pytest.mark.parametrize("mode, target, draft, message", [
    (None, "CPU", "CPU", "the run mode must be 'one after another' or 'race', got None"),
    (ui.RACE, None, "CPU", "the target device must be one of"),
    (ui.ONE_AFTER_ANOTHER, "CPU", "/models/my-model", "the draft device must be one of"),
])
def test_a_run_mode_or_device_the_page_does_not_offer_is_refused(mode, target, draft, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ui.check_choices(mode, target, draft)


def test_every_offered_choice_is_accepted():
    for device in ui.offered_devices():
        ui.check_choices(ui.RACE, device, device)


def test_prompt_length_in_tokens_is_capped_on_the_server():
    ui.check_prompt([0] * ui.MAX_PROMPT_TOKENS)
    with pytest.raises(ValueError, match="the prompt is 2,049 tokens; this page accepts at most 2,048"):
        ui.check_prompt([0] * (ui.MAX_PROMPT_TOKENS + 1))


def test_the_app_binds_loopback_and_asks_for_no_share_link_by_default(monkeypatch):
    import app

    for name in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = app.parse_args([])
    assert (args.host, args.share) == ("127.0.0.1", False)
    assert app.parse_args(["--share"]).share
