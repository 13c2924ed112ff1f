"""What the page shows, from events and summaries: pure renderers checked without a browser."""

from specdemo.decoding.events import ACCEPTED, BONUS, CORRECTED, TARGET, TokenEvent
from specdemo.results.metrics import Summary, measured_speedup
from specdemo.results.parting import parting
from specdemo.results.record import Record
from specdemo.settings import GenerationSettings, KPolicy, RunSettings
from specdemo.ui import render
from specdemo.names import AUTOREGRESSIVE, GENAI, LANES, SPECULATIVE
from specdemo.serve.lanes import LaneRun
from specdemo.serve.values import ONE_AFTER_ANOTHER, RACE


def token(text, source=ACCEPTED, step=1, t=0.1, **extra):
    return TokenEvent(id=len(text), text=text, source=source, step=step, t=t, **extra)


def lane_with(events, **summary):
    lane = LaneRun(events=list(events))
    lane.summary = Summary(tokens=len(events), **summary)
    return lane


def results_of(lanes, mode, settings, parted=None, would=None, provisional="", configuration="faithful"):
    """The results block the page renders for lanes so run: their Record (as SideBySide.finish makes it), rendered."""
    record = Record("", configuration, RunSettings(generation=settings),
                    {lane: lanes[lane].result() if lanes[lane].summary is not None else None for lane in LANES},
                    would=would, parting=parted, provisional=provisional)
    return render.render_results(record, mode, lanes.get(GENAI))


# ----------------------------------------------------------------------------- tokens


def test_tokens_are_coloured_by_provenance():
    html = render.render_tokens([token("a", TARGET, 0), token("b", ACCEPTED), token("c", CORRECTED), token("d", BONUS)])
    for source in (TARGET, ACCEPTED, CORRECTED, BONUS):
        assert f'class="sd-tok sd-{source}"' in html


def test_token_text_is_escaped_so_model_output_shows_literally():
    html = render.render_tokens([token('<script>alert("x")</script> & f"{name}" `${total}`')])
    assert "<script>" not in html
    assert "&lt;script&gt;" in html and "&amp;" in html
    assert "{" not in html and "$" not in html  # the HTML component's templating never sees them


def test_rejected_drafts_stay_struck_through_where_they_were_rejected():
    html = render.render_tokens([token(" the"), token(" sky", CORRECTED, rejected=[7, 8], rejected_text=" sea is")])
    assert html.index(" the") < html.index('<del class="sd-rejected"') < html.index(" sky")
    assert "2 draft token(s) rejected" in html


def test_hover_title_gives_step_and_probabilities_when_sampling():
    title = render.token_title(token("x", ACCEPTED, step=3, p_target=0.8125, p_draft=0.5))
    assert title == "step 3 · accepted draft · p_target 0.812 · p_draft 0.500"


def test_greedy_hover_title_gives_step_and_provenance_only():
    assert render.token_title(token("x", CORRECTED, step=2)) == "step 2 · corrected by target"
    assert render.token_title(token("x", TARGET, step=0)) == "step 0 · target"


# ----------------------------------------------------------------------------- figures and charts


def test_speedup_compares_throughput():
    assert measured_speedup(Summary(mode="autoregressive", tokens_per_s=5.0), Summary(mode="speculative", tokens_per_s=9.0)) == 1.8


def test_results_say_which_mode_produced_the_numbers():
    ar = lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, target_calls=48, stop_reason="eos")
    spec = lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=10.0, target_calls=12, draft_acceptance_rate=0.75,
                     alpha_hat=0.8, rounds=11, mean_acceptance_length=4.0, leviathan_speedup=2.5, stop_reason="eos")
    one = results_of({AUTOREGRESSIVE: ar, SPECULATIVE: spec}, ONE_AFTER_ANOTHER, GenerationSettings())
    assert "2.00×" in one and "2.50×" in one and "75%" in one and "36 of 48" in one
    assert "one after another" in one and "same 1 tokens" in one
    assert "race" in results_of({AUTOREGRESSIVE: ar, SPECULATIVE: spec}, RACE, GenerationSettings())


def test_results_of_a_stopped_run_give_no_speedup():
    ar = lane_with([], mode="autoregressive", stop_reason="eos")
    spec = lane_with([], mode="speculative", stop_reason="cancelled")
    assert "Stopped" in results_of({AUTOREGRESSIVE: ar, SPECULATIVE: spec}, ONE_AFTER_ANOTHER, GenerationSettings())
    assert "Stopped" in results_of({AUTOREGRESSIVE: ar, SPECULATIVE: LaneRun()}, ONE_AFTER_ANOTHER, GenerationSettings())


def test_lane_figures_show_elapsed_tokens_rate_and_first_token():
    html = render.render_lane_figures(lane_with([token("a", t=0.25), token("b", t=0.5)], mode="speculative", wall_s=1.0, tokens_per_s=2.0, ttft_s=0.25), 0.0)
    assert "1.0 s" in html and ">2<" in html and "2.0" in html and "0.25 s" in html


def test_timeline_has_both_lanes_from_the_origin_even_before_they_run():
    series = render.timeline_series({AUTOREGRESSIVE: LaneRun(events=[token("a", t=0.5), token("b", t=0.75)]),
                                     SPECULATIVE: LaneRun()})
    assert series == {AUTOREGRESSIVE: [(0.0, 0), (0.5, 1), (0.75, 2)], SPECULATIVE: [(0.0, 0)]}


def test_a_lane_text_update_carries_only_the_new_tokens_and_where_they_start():
    events = [token("a", TARGET, 0), token("b"), token("c")]
    html = render.render_stream(events[1:], 1, reset=False)
    assert 'data-from="1" data-to="3" data-reset="0"' in html and html.count("sd-tok") == 2
    assert 'data-from="0" data-to="3" data-reset="1"' in render.render_stream(events, 0, reset=True)


def test_model_panel_shows_sizes_precisions_devices_and_kv_cache():
    model = dict(name="Tiny", parameters=1_777_029_120, precision="int8", size_on_disk_bytes=1_782_835_973, device="CPU",
                 kv_cache_precision="f16", layers=28, context_length=32768)
    html = render.render_models(model, {**model, "precision": "int4"}, threads=1, kv_cache_bytes={"target": 2_800_000})
    for text in ("1.78 B", "INT8", "INT4", "1.66 GiB", "f16, 2.7 MiB", "f16, – until a run", "CPU", "32,768 tokens"):
        assert text in html
    assert "draft plan" not in html
    planned = render.render_models(model, {**model, "precision": "int8", "precision_from": "the draft plan"})
    assert "INT8 (the draft plan&#x27;s choice)" in planned  # escaped, as every cell


def test_results_say_how_genai_compares_and_whether_its_tokens_equal_ours():
    spec = lane_with([token("a"), token("bb")], mode="speculative", tokens_per_s=10.0, stop_reason="eos").result()
    same = lane_with([token("a", TARGET), token("bb", TARGET)], mode="speculative", tokens_per_s=8.0, proposed=10,
                     accepted=8, draft_acceptance_rate=0.8, mean_k=4.0, drafter="model", stop_reason="eos")
    line = render.render_genai_line(same, spec, GenerationSettings())
    assert "K = 4" in line and "0.80× our speculative lane" in line and "8 of 10 drafts (80%)" in line
    assert "its 2 tokens equal our speculative lane's" in line
    other = lane_with([token("a", TARGET), token("ccc", TARGET)], mode="speculative", tokens_per_s=8.0, mean_k=4.0)
    assert "part from ours at token 2" in render.render_genai_line(other, spec, GenerationSettings())
    failed = LaneRun(error="The pipeline could not load.")
    assert "failed: The pipeline could not load." in render.render_genai_line(failed, spec, GenerationSettings())


def test_the_timeline_shows_genai_only_when_it_ran():
    lanes = {AUTOREGRESSIVE: LaneRun(), SPECULATIVE: LaneRun()}
    assert set(render.timeline_series(lanes)) == {AUTOREGRESSIVE, SPECULATIVE}
    lanes[GENAI] = LaneRun(events=[token("a", TARGET, t=0.5)])
    assert render.timeline_series(lanes)[GENAI] == [(0.0, 0), (0.5, 1)]


def test_a_run_that_drafted_nothing_shows_one_alpha_and_no_numeric_noise():
    import re

    from specdemo.ui import charts

    ar = lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, target_calls=8, stop_reason="eos")
    spec = lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=5.0, target_calls=8, rounds=0, alpha_hat=0.0,
                     stop_reason="eos")
    html = results_of({AUTOREGRESSIVE: ar, SPECULATIVE: spec}, ONE_AFTER_ANOTHER, GenerationSettings(k_policy=KPolicy.auto()))
    assert "α̂ = 0.00" not in html and "α̂ –" in html and ">–</div><div class=\"sd-label\">α̂ (acceptance)" in html
    for page_part in (html, charts.acceptance_by_position([0.0] * 12), charts.would_have_given(None, 0.0, 0.0)):
        assert not re.search(r"\d\.\d{5,}", page_part)  # no "0.000000" anywhere


def parted_lanes(ar_margin: float, spec_margin: float):
    """Two greedy lanes that agree on ' def' and part at the second token (' imperative' vs ' a')."""
    ar = lane_with([token(" def", TARGET, margin=3.0), token(" imperative", TARGET, margin=ar_margin)],
                   mode="autoregressive", tokens_per_s=5.0, stop_reason="max_new_tokens")
    spec = lane_with([token(" def", TARGET, margin=3.0), token(" a", CORRECTED, margin=spec_margin)],
                     mode="speculative", tokens_per_s=9.0, stop_reason="max_new_tokens")
    return {AUTOREGRESSIVE: ar, SPECULATIVE: spec}


def judged(lanes, noise=None):
    """Where the lanes part, as the run judges it once (Record.parting) and hands the page."""
    return parting(lanes[AUTOREGRESSIVE].events, lanes[SPECULATIVE].events, noise)


def test_lanes_that_part_at_a_near_tie_show_the_margins_measured_there():
    results = results_of(parted_lanes(0.19, 0.07), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.19, 0.07)))
    assert "part at token 2 (&#x27; imperative&#x27; autoregressive, &#x27; a&#x27; speculative)" in results
    assert "0.19 logits in the autoregressive lane and 0.07 in the speculative one" in results and "a near-tie" in results
    assert "same 2 tokens" not in results and "defect" not in results


def test_a_parting_is_judged_against_the_noise_this_compile_showed():
    from specdemo.results.fidelity import BatchingNoise

    wide = results_of(parted_lanes(0.19, 0.07), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.19, 0.07), BatchingNoise(0.12, 96, (2, 13))))
    assert "within the 0.24-logit band of twice the largest gap change" in wide and "(0.12 logits over 96 positions" in wide
    assert "a near-tie, where" in wide
    narrow = results_of(parted_lanes(0.19, 0.07), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.19, 0.07), BatchingNoise(0.05, 96, (2, 13))))
    assert "beyond the 0.10-logit band" in narrow and "not a near-tie but a defect" in narrow
    unmeasured = results_of(parted_lanes(0.19, 0.07), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.19, 0.07)))
    assert "0.5-logit near-tie band (a constant" in unmeasured  # never presented as this compile's noise


def test_lanes_that_part_where_the_margin_was_wide_are_called_a_defect():
    results = results_of(parted_lanes(1.4, 0.9), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(1.4, 0.9)))
    assert "1.40 logits" in results and "not a near-tie but a defect" in results and "a near-tie, where" not in results


def test_sampled_lanes_that_happen_to_write_the_same_text_say_so():
    lanes = {AUTOREGRESSIVE: lane_with([token("a", TARGET)], mode="autoregressive", tokens_per_s=5.0, stop_reason="eos"),
             SPECULATIVE: lane_with([token("a", TARGET)], mode="speculative", tokens_per_s=9.0, stop_reason="eos")}
    results = results_of(lanes, ONE_AFTER_ANOTHER, GenerationSettings(temperature=0.7))
    assert "happen to be the same 1 tokens" in results and "so their texts differ" not in results


def test_a_compile_whose_batched_calls_match_its_single_steps_still_has_true_ties():
    from specdemo.results.fidelity import BatchingNoise

    exact = BatchingNoise(0.0, 96, (2, 13))  # as measured on the Zen 5's tuned f32 INT8 target
    tie = results_of(parted_lanes(0.004, 0.01), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.004, 0.01), exact))
    assert "within the 0.02-logit band" in tie and "a near-tie, where" in tie
    wide = results_of(parted_lanes(0.19, 0.07), ONE_AFTER_ANOTHER, GenerationSettings(),
                                 parted=judged(parted_lanes(0.19, 0.07), exact))
    assert "not a near-tie but a defect" in wide
