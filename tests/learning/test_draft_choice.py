"""The draft plan: each candidate draft (LM-head size, weight precision) measured and priced on this machine's costs;
a cheaper draft wins where its lost acceptance costs less than its saved steps; another precision is chosen only for a
draft whose precision is left to the plan (auto, the default draft's)."""

from dataclasses import replace

import pytest

from specdemo.learning import builtin, draft_choice, race, tune
from specdemo.learning.draft_choice import DraftOption, candidates, price
from specdemo.learning.profile import Profile, choices
from specdemo.models import kernels, sources, split_head
from specdemo.settings import AUTO, DEFAULT_DRAFT, DRAFT_PRECISION, FIRST_DRAFT_PRECISIONS, ModelSettings
from tests.fake_models import FakeModel
from tests.decoding.test_planner import machine

AMX = machine(0.02, draft_steps=0.26, n_max=13)  # memory-bound target, a cheap draft
AVX2 = machine(0.30, draft_steps=0.50, n_max=13)  # compute-bound target, a draft step half a target step


def option(head: int, alpha: float, step_s: float, precision: str = "int4", applies: bool = True) -> DraftOption:
    """A candidate with plenty of evidence of acceptance `alpha` at every position."""
    return DraftOption(precision, head, rows=head or 151_936, step_s=step_s, tested=[10_000] * 12,
                       accepted=[int(alpha * 10_000)] * 12, applies=applies)


def test_a_trimmed_head_wins_where_draft_steps_are_dear():
    full, trimmed = option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375)  # 25 % cheaper, acceptance 0.94 -> 0.90
    assert price([full, trimmed], AVX2) is trimmed
    assert trimmed.chosen and not full.chosen
    assert trimmed.predicted_speedup >= 1.03 * full.predicted_speedup


def test_a_cheap_head_that_loses_much_acceptance_is_not_chosen():
    full, trimmed = option(0, 0.94, 0.026), option(8_000, 0.80, 0.0156)  # 40 % cheaper, acceptance 0.94 -> 0.80
    assert price([full, trimmed], AMX) is full
    assert trimmed.predicted_speedup < full.predicted_speedup and trimmed.k < full.k


def test_a_gain_within_the_margin_keeps_the_full_head():
    full, trimmed = option(0, 0.94, 0.026), option(32_000, 0.94, 0.0255)  # 2 % cheaper steps, the same acceptance
    assert price([full, trimmed], AMX) is full
    assert full.predicted_speedup < trimmed.predicted_speedup < 1.03 * full.predicted_speedup


def test_two_heads_that_both_beat_the_full_head_but_tie_with_each_other_give_the_larger_head_on_every_home():
    """Two quiet homes on one machine priced the 32k and 16k heads a few % apart, each its own way round (issue 48):
    within MARGIN of each other the larger head (the earlier candidate) runs, whichever the races' noise put ahead."""
    for step_32k, step_16k in ((0.0380, 0.0360), (0.0375, 0.0380)):  # the noise one way (16k ahead), then the other
        full = option(0, 0.94, 0.050)
        head_32k, head_16k = option(32_000, 0.91, step_32k), option(16_000, 0.90, step_16k)
        assert price([full, head_32k, head_16k], AVX2) is head_32k
        assert abs(head_16k.predicted_speedup / head_32k.predicted_speedup - 1) < draft_choice.MARGIN
        assert head_32k.predicted_speedup >= 1.03 * full.predicted_speedup
    full, head_32k, head_16k = option(0, 0.94, 0.050), option(32_000, 0.91, 0.0380), option(16_000, 0.90, 0.0300)
    assert price([full, head_32k, head_16k], AVX2) is head_16k  # clear of MARGIN: the smaller head wins on its price


def test_another_precision_is_chosen_only_where_the_precision_is_left_to_the_plan():
    full, int8 = option(0, 0.94, 0.050), option(0, 0.96, 0.030, precision="int8", applies=False)
    assert price([full, int8], AVX2, "int4") is full  # an explicit int4 draft keeps int4
    assert int8.predicted_speedup > 1.03 * full.predicted_speedup  # the table says what it would give
    assert any("--draft-precision auto" in line for line in draft_choice.table([full, int8]))
    full.chosen = int8.chosen = False
    assert price([full, int8], AVX2, AUTO) is int8


def test_where_int8_steps_cost_more_than_its_acceptance_buys_int4_stays():
    """The Zen 5 case (issue 18): the INT8 draft's step 1.5x the INT4's, acceptance a little higher."""
    full, int8 = option(0, 0.92, 0.012), option(0, 0.94, 0.018, precision="int8")
    assert price([full, int8], AMX, AUTO) is full


def test_candidates_start_from_the_full_head_and_add_a_precision_only_when_prepared():
    heads = [s.head_tokens for s in candidates(DEFAULT_DRAFT, lambda s: False)]
    assert heads[0] == 0 and set(heads) == set(draft_choice.HEADS)
    assert {s.precision for s in candidates(DEFAULT_DRAFT, lambda s: False)} == {DRAFT_PRECISION}  # auto: int4 first
    with_int8 = candidates(DEFAULT_DRAFT, lambda s: s.precision == "int8")
    assert [(s.precision, s.head_tokens) for s in with_int8][-1] == ("int8", 0)


def test_acceptance_is_measured_exactly_against_the_target_on_the_examples():
    """A draft identical to the target agrees on every tested draft; one that is not, on few."""
    vocab = 50
    target = FakeModel(vocab, "target", scale=3.0)

    def compile(settings: ModelSettings):
        model = FakeModel(vocab, "target" if settings.head_tokens == 0 else "other", scale=3.0)
        model.head_tokens = settings.head_tokens or vocab
        return model

    examples = [{"prompt": [1, 2, 3], "answer": [4, 5, 6, 7, 8, 9, 10, 11, 12]}]
    timed = []
    options, _ = draft_choice.measure(target, DEFAULT_DRAFT, examples, lambda e: (e["prompt"], e["answer"]),
                                      lambda s: False, compile, lambda a, b, t: timed.append((a, b)) or
                                      race.verdict([0.02] * 4, [0.02] * 4), None, lambda message: None)
    assert len(timed) == len(draft_choice.HEADS) - 1  # the incumbent raced against each other candidate alone
    assert all(a is timed[0][0] for a, _ in timed)
    same, *others = options
    assert same.head_tokens == 0 and same.acceptance_rate() == 1.0 and sum(same.tested) > 0
    assert all(o.acceptance_rate() < 0.5 for o in others)


def test_a_trimmed_head_s_step_counts_its_other_rows_at_what_the_full_head_costs_more():
    """A head of blocks trimmed to 32k takes its other rows where unsure (runtime.greedy_ids): a quarter of its steps
    pay what the full head of that precision steps slower, and the plan prices the step with them."""
    full = replace(option(0, 0.95, 0.010, precision="gguf-q4"), step_s=0.0093)
    trimmed = replace(option(32_000, 0.95, 0.010, precision="gguf-q4"), step_s=0.0071, rest_share=0.25)
    plugin = replace(option(32_000, 0.90, 0.010), step_s=0.0120)  # no other rows: as raced
    draft_choice.with_rest([full, trimmed, plugin])
    assert trimmed.step_s == pytest.approx(0.0071 + 0.25 * 0.0022) and full.step_s == 0.0093 and plugin.step_s == 0.0120
    alone = replace(option(16_000, 0.95, 0.010, precision="gguf-native"), step_s=0.008, rest_share=0.5)
    draft_choice.with_rest([alone])  # its full head not measured: the other rows at its own step again
    assert alone.step_s == pytest.approx(0.012)
    kept = draft_choice.from_dict(draft_choice.to_dict(trimmed))
    assert kept.rest_share == 0.25


def planned(profile: Profile, *options: DraftOption) -> None:
    """A draft plan over `options` for the default draft in `profile`, as tune leaves it."""
    price(list(options), AVX2, AUTO)
    profile.keep_tune([tune.Trial("draft", choices.DEFAULT, chosen=True)], {"target": DEFAULT_DRAFT, "draft": DEFAULT_DRAFT},
                      list(options))


def prepare_stand_in(settings: ModelSettings) -> None:
    folder = sources.cached_folder(settings)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / sources.COMPLETE_MARKER).write_text("")


def test_tune_applies_the_planned_head_only_where_it_is_left_open(home, tmp_path):
    profile = Profile(tmp_path / "machine")
    planned(profile, option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375))
    assert DEFAULT_DRAFT.head_tokens == -1
    assert profile.resolve(DEFAULT_DRAFT).head_tokens == 16_000
    assert profile.resolve(replace(DEFAULT_DRAFT, head_tokens=0)).head_tokens == 0  # explicit wins
    assert profile.resolve(replace(DEFAULT_DRAFT, precision="int8")).head_tokens == 0  # no int8 option priced
    assert profile.resolve(replace(DEFAULT_DRAFT, device="GPU")).head_tokens == 0  # planned on the CPU only
    assert Profile(tmp_path / "untuned").resolve(DEFAULT_DRAFT).head_tokens == 0  # no plan yet: the full head


AMX_FLAGS = ["avx2", "avx512f", "avx512_vnni", "amx_int8"]  # the plugin multiplies 8 bits on a unit ours leave unused


def flags_of(monkeypatch, flags: list[str]) -> None:
    monkeypatch.setattr(choices.machine, "cpu_features", lambda: flags)


def test_before_int4_is_prepared_a_gguf_draft_runs_the_files_own_blocks_then_int4_until_there_is_a_plan_on_amx(
        home, tmp_path, monkeypatch):
    flags_of(monkeypatch, AMX_FLAGS)
    untuned = Profile(tmp_path / "untuned")
    assert FIRST_DRAFT_PRECISIONS == ("gguf-native", "gguf-mixed")
    assert untuned.resolve(DEFAULT_DRAFT).precision == "gguf-native"  # a first start: the blocks copied, no NNCF
    assert not untuned.from_plan(DEFAULT_DRAFT)  # no plan yet: the page does not call it the plan's choice
    assert untuned.resolve(replace(DEFAULT_DRAFT, source="Qwen/Qwen2.5-0.5B")).precision == DRAFT_PRECISION  # no GGUF
    prepare_stand_in(replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION, head_tokens=0))  # the background's INT4
    assert untuned.resolve(DEFAULT_DRAFT).precision == DRAFT_PRECISION


@pytest.mark.parametrize("flags", [["avx2"], ["avx2", "avx512f", "avx512_vnni"]], ids=["avx2", "avx512-vnni"])
def test_where_the_plugin_has_no_8_bit_unit_beyond_ours_an_unplanned_draft_stays_on_our_kernels(home, tmp_path,
                                                                                               monkeypatch, flags):
    # On the Zen 3 the plugin's INT4 draft stepped at 0.7-1.0x the target's step: a page between INT4 prepared and its
    # plan drafted nothing. The file's own blocks on our kernels stay until the plan prices both.
    flags_of(monkeypatch, flags)
    untuned = Profile(tmp_path / "untuned")
    prepare_stand_in(replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION, head_tokens=0))
    assert untuned.resolve(DEFAULT_DRAFT).precision == "gguf-native"
    assert untuned.for_plugin(DEFAULT_DRAFT).precision == DRAFT_PRECISION  # GenAI cannot load ours
    assert untuned.resolve(replace(DEFAULT_DRAFT, source="Qwen/Qwen2.5-0.5B")).precision == DRAFT_PRECISION  # no GGUF


def test_without_specdemo_s_kernels_a_first_start_s_draft_runs_the_plugin_s_layout_of_the_files_blocks(home, tmp_path,
                                                                                                        monkeypatch):
    monkeypatch.setattr(kernels, "_built", lambda: None)
    assert Profile(tmp_path / "untuned").resolve(DEFAULT_DRAFT).precision == "gguf-mixed"


def test_genai_s_lane_runs_a_first_start_s_draft_at_int4_and_a_planned_one_as_ours(home, tmp_path, monkeypatch):
    flags_of(monkeypatch, AMX_FLAGS)  # where INT4 runs before a plan
    profile = Profile(tmp_path / "machine")
    assert profile.for_plugin(DEFAULT_DRAFT).precision == DRAFT_PRECISION  # ours runs gguf-native, which GenAI cannot load
    explicit = replace(DEFAULT_DRAFT, precision="gguf-mixed")
    assert profile.for_plugin(explicit) == explicit
    prepare_stand_in(replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION, head_tokens=0))
    assert profile.for_plugin(DEFAULT_DRAFT) == DEFAULT_DRAFT  # ours runs INT4 now: the same settings


def test_the_planned_precision_runs_where_left_open_and_its_weights_are_prepared(home, tmp_path):
    profile = Profile(tmp_path / "machine")
    planned(profile, option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375), option(0, 0.97, 0.030, precision="int8"))
    int8 = replace(DEFAULT_DRAFT, precision="int8")
    assert profile.resolve(DEFAULT_DRAFT).precision == "int4"  # int8 chosen, but not prepared here
    assert profile.resolve(DEFAULT_DRAFT).head_tokens == 16_000  # int4's own best head
    assert not profile.from_plan(DEFAULT_DRAFT)  # the page says int4 is the plan's choice only once it is
    prepare_stand_in(int8)
    chosen = profile.resolve(DEFAULT_DRAFT)
    assert (chosen.precision, chosen.head_tokens) == ("int8", 0)
    assert profile.from_plan(DEFAULT_DRAFT) and not profile.from_plan(int8)  # an explicit precision is the settings'
    assert profile.resolve(replace(DEFAULT_DRAFT, precision="int4")).precision == "int4"  # explicit wins
    assert profile.resolve_precision(DEFAULT_DRAFT) == replace(DEFAULT_DRAFT, precision="int8")
    # int8 compiles with the draft's tuned setting, under which the plan measured it
    assert profile.chosen(int8) == choices.DEFAULT


def test_an_auto_precision_names_no_folder_until_resolved():
    with pytest.raises(ValueError, match="resolved"):
        sources.cached_folder(DEFAULT_DRAFT)
    with pytest.raises(ValueError, match="only the draft"):
        from specdemo.settings import RunSettings

        RunSettings(target=replace(DEFAULT_DRAFT, source="qwen2.5-coder-1.5b"))


def test_the_plan_is_kept_beside_the_compile_settings(tmp_path):
    profile = Profile(tmp_path / "machine")
    full, trimmed = option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375)
    planned(profile, full, trimmed)
    entry = profile.tune()["drafts"][choices.draft_key(DEFAULT_DRAFT)]
    assert (entry["precision"], entry["head_tokens"]) == ("int4", 16_000)
    assert [o["chosen"] for o in entry["options"]] == [False, True] and entry["options"][1]["predicted_speedup"] == \
        pytest.approx(trimmed.predicted_speedup)


def test_a_plan_that_did_not_price_a_prepared_precision_is_made_again(home, tmp_path):
    profile = Profile(tmp_path / "machine")
    assert profile.needs_plan(DEFAULT_DRAFT)  # no plan yet
    planned(profile, option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375))
    assert not profile.needs_plan(DEFAULT_DRAFT)  # int8 is not prepared: nothing more to price
    prepare_stand_in(replace(DEFAULT_DRAFT, precision="int8"))
    assert profile.needs_plan(DEFAULT_DRAFT)  # an auto draft could run int8 now
    assert not profile.needs_plan(replace(DEFAULT_DRAFT, precision="int4"))  # its own precision was priced
    assert not profile.needs_plan(replace(DEFAULT_DRAFT, precision="int4", head_tokens=0))  # nothing left open


@pytest.mark.parametrize("before", ["answers", "head_rule"])  # code alone; a split head's other rows where unsure only
def test_a_plan_measured_on_other_built_in_answers_or_under_another_split_head_rule_is_made_again(home, tmp_path,
                                                                                                   before):
    profile = Profile(tmp_path / "machine")
    planned(profile, option(0, 0.94, 0.050), option(16_000, 0.90, 0.0375))
    assert not profile.needs_plan(DEFAULT_DRAFT)
    entry = profile.tune()["drafts"][choices.draft_key(DEFAULT_DRAFT)]
    assert entry["answers"] == list(builtin.DRAFT_PLAN_ANSWERS) and entry["head_rule"] == list(split_head.RULE)
    del entry[before]  # a plan from before
    profile.store.update("tune", lambda tune: {**tune, "drafts": {choices.draft_key(DEFAULT_DRAFT): entry}})
    assert profile.needs_plan(DEFAULT_DRAFT)
    assert not profile.needs_plan(replace(DEFAULT_DRAFT, precision="int4", head_tokens=0))  # nothing left open


def test_the_draft_plan_measures_acceptance_beyond_english_code():
    answers = builtin.draft_plan_answers()
    assert builtin.code_answers()[0] in answers and builtin.prose_answers()[0] in answers
    text = "".join(a["instruction"] + a["answer"] for a in answers)
    # Latin with accents, Han, Cyrillic: scripts a head trimmed on Python's standard library mostly lacks
    assert any("\u00c0" <= c <= "\u00ff" for c in text) and any("\u4e00" <= c <= "\u9fff" for c in text) \
        and any("\u0400" <= c <= "\u04ff" for c in text)
    assert all(a["instruction"].strip() and len(a["answer"]) > 100 for a in answers)


def busy(option: DraftOption) -> DraftOption:
    option.provisional = "measured while the host was busy: steal 0 %, other processes 50 % of the CPU time"
    return option


def test_a_plan_priced_on_a_busy_host_is_made_again_until_one_is_clean_or_a_few_were_busy(home, tmp_path):
    profile = Profile(tmp_path / "machine")
    planned(profile, busy(option(0, 0.94, 0.050)))
    assert profile.needs_plan(DEFAULT_DRAFT)  # provisional: the next start's background work plans again
    planned(profile, option(0, 0.94, 0.050))
    assert not profile.needs_plan(DEFAULT_DRAFT)  # a clean plan stands
    for _ in range(choices.BUSY_PLANS - 1):
        planned(profile, busy(option(0, 0.94, 0.050)))
        assert profile.needs_plan(DEFAULT_DRAFT)
    planned(profile, busy(option(0, 0.94, 0.050)))
    assert not profile.needs_plan(DEFAULT_DRAFT)  # busy every time: kept, provisional, as `tune --draft-plan` says


def test_a_draft_plan_alone_keeps_the_tunes_record(tmp_path):
    profile = Profile(tmp_path / "machine")
    planned(profile, option(0, 0.94, 0.050))
    before = profile.tune()["trials"]
    again = option(0, 0.94, 0.050)
    price([again], AVX2)
    profile.keep_tune([], {"target": DEFAULT_DRAFT, "draft": DEFAULT_DRAFT}, [again])
    assert profile.tune()["trials"] == before and before


def test_the_plan_holds_two_drafts_at_a_time_and_chains_their_steps_through_the_incumbent():
    """Every draft compiled at once beside the target: now the incumbent (int4, full head) is held and each other draft
    raced against it alone; the machine slowing between races (twice as slow in the second) cancels in the steps."""
    import weakref

    target, alive, most, races = FakeModel(50, "target"), [0], [0], []

    def compile(settings: ModelSettings):
        model = FakeModel(50, "draft")
        model.head_tokens = settings.head_tokens or 50
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        weakref.finalize(model, lambda: alive.__setitem__(0, alive[0] - 1))
        return model

    def timer(incumbent, challenger, other):
        races.append(challenger.head_tokens)
        return race.verdict([len(races) * 0.02] * 4, [len(races) * (0.02 if challenger.head_tokens == 50 else 0.01)] * 4)

    examples = [{"prompt": [1, 2, 3], "answer": [4, 5, 6, 7, 8]}]
    options, incumbent = draft_choice.measure(target, DEFAULT_DRAFT, examples, lambda e: (e["prompt"], e["answer"]),
                                              lambda s: False, compile, timer, None, lambda message: None)
    assert most[0] == 2 and len(races) == len(options) - 1 and incumbent.head_tokens == 50
    assert options[0].step_s == pytest.approx(0.02) and all(o.step_s == pytest.approx(0.01) for o in options[1:])


def test_a_held_incumbent_is_not_compiled_again_and_the_targets_choices_are_computed_once():
    """tune hands the plan the draft its search kept; the target's greedy choices on each example are the same for
    every candidate, so they are computed once (they were once per candidate: five passes of the 1.5B target)."""
    vocab = 50
    target = FakeModel(vocab, "target", scale=3.0)
    held = FakeModel(vocab, "target", scale=3.0)
    held.head_tokens = vocab
    compiled, calls = [], []
    forward = target.forward
    target.forward = lambda ids, logits_to_keep=1: calls.append(len(ids)) or forward(ids, logits_to_keep)

    def compile(settings: ModelSettings):
        compiled.append(settings.head_tokens)
        model = FakeModel(vocab, "other", scale=3.0)
        model.head_tokens = settings.head_tokens
        return model

    examples = [{"prompt": [1, 2, 3], "answer": [4, 5, 6, 7, 8, 9, 10]}]
    options, incumbent = draft_choice.measure(target, DEFAULT_DRAFT, examples, lambda e: (e["prompt"], e["answer"]),
                                              lambda s: False, compile, lambda a, b, t: race.verdict([0.02] * 4,
                                                                                                     [0.02] * 4),
                                              None, lambda message: None, incumbent=held)
    assert incumbent is held and 0 not in compiled and options[0].acceptance_rate() == 1.0
    assert calls == [3, 6]  # one teacher-forced pass of the target: the prompt, then the answer (a piece of 16 at most)


# ---- only what could change the plan is measured (issue 48)

QWEN_05B = {"hidden_size": 896, "vocab_size": 151_936, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "intermediate_size": 4864}  # the default draft's config.json
ROWS = QWEN_05B["vocab_size"]


def curve(verify_steps_per_token: float, draft_steps: float):
    """A synthetic machine whose draft scales like its target: a draft call on 2 tokens costs what the target's does
    over its single step."""
    costs = machine(verify_steps_per_token, draft_steps=draft_steps, n_max=13)
    return replace(costs, draft_s=(costs.d(1), costs.d(1) * costs.t(2) / costs.t(1)))


COMPUTE_BOUND = curve(0.50, 0.50)  # an AVX2-only CPU on 2 cores: 5 tokens cost 3.0 steps, a draft step 0.5
MEMORY_BOUND = curve(0.075, 0.20)  # 5 tokens cost 1.3 steps, a draft step 0.2


def held_draft() -> FakeModel:
    """The incumbent's compile, as tune holds it for the cost curve: a full head of the default draft's rows."""
    model = FakeModel(50, "target", scale=3.0)
    model.head_tokens = ROWS
    return model


def never(*args):
    pytest.fail("measured a draft that could not pay")


def planned_on(costs, compile=never, timer=never, encode=never, log=lambda message: None,
               prepared=lambda s: s.precision in draft_choice.PRECISIONS):
    """The draft plan's measurement of the default draft (INT8 prepared) against a stand-in target on `costs`."""
    return draft_choice.measure(FakeModel(50, "target", scale=3.0), DEFAULT_DRAFT, [{"prompt": [1, 2, 3], "answer": [4, 5, 6, 7]}],
                                encode, prepared, compile, timer, never, log, incumbent=held_draft(), costs=costs,
                                share=draft_choice.head_share(QWEN_05B))


def test_the_lm_head_of_the_default_draft_is_a_quarter_of_its_weights():
    assert draft_choice.head_share(QWEN_05B) == pytest.approx(0.28, abs=0.01)
    assert draft_choice.head_share({}) == 1.0  # unknown: a trimmed head is priced as free, so it is measured


def test_a_draft_step_is_priced_no_cheaper_than_its_bytes_allow():
    int4 = replace(DEFAULT_DRAFT, precision="int4", head_tokens=0)
    assert draft_choice.step_floor(replace(int4, precision="int8"), int4, ROWS, 0.28) == 1.0  # INT8: never cheaper
    assert draft_choice.step_floor(int4, replace(int4, precision="int8"), ROWS, 0.28) == 0.5  # INT4 beside INT8: half
    assert draft_choice.step_floor(replace(int4, head_tokens=8_000), int4, ROWS, 0.28) == pytest.approx(1 - 0.28 * (1 - 8_000 / ROWS))


def test_the_file_s_blocks_in_4_bits_are_priced_with_every_head_where_prepared_by_their_bytes_beside_ours(monkeypatch):
    """gguf-q4 (requantize.py) runs on our kernels as gguf-native does: its heads are candidates once prepared, and
    beside the file's own blocks its step is floored by its bits (4.5 of Q8_0's 8.5), as INT4's is beside INT8's."""
    monkeypatch.setattr(kernels, "runnable", lambda precisions: tuple(precisions))
    assert draft_choice.to_prepare(DEFAULT_DRAFT) == ("int4", "gguf-q4", "int8")  # gguf-native: the first start's
    pool = [(s.precision, s.head_tokens) for s in candidates(DEFAULT_DRAFT, lambda s: True)]
    assert [c for c in pool if c[0] == "gguf-q4"] == [("gguf-q4", h) for h in draft_choice.HEADS]
    assert "gguf-q4" not in {s.precision for s in candidates(DEFAULT_DRAFT, lambda s: s.precision != "gguf-q4")}
    native = replace(DEFAULT_DRAFT, precision=kernels.NATIVE, head_tokens=0)
    assert draft_choice.step_floor(replace(native, precision="gguf-q4"), native, ROWS, 0.28) == pytest.approx(4.5 / 8.5)
    monkeypatch.setattr(kernels, "runnable", lambda ps: tuple(p for p in ps if p not in kernels.ON_KERNELS))
    assert draft_choice.to_prepare(DEFAULT_DRAFT) == ("int4", "int8")  # where our kernels do not run


def test_a_draft_on_our_kernels_is_measured_beside_the_plugin_s_int4_never_priced_by_its_bits(monkeypatch):
    """On the Zen 3 the plugin's INT4 draft stepped at 0.95-1.0 of the target's step and the file's own blocks on our
    kernels at 0.44-0.54: where no INT4 head could pay, the gguf-native draft and its heads are still measured."""
    monkeypatch.setattr(kernels, "runnable", lambda precisions: tuple(precisions))
    int4 = replace(DEFAULT_DRAFT, precision="int4", head_tokens=0)
    assert draft_choice.step_floor(replace(int4, precision=kernels.NATIVE), int4, ROWS, 0.28) == 0.0
    assert draft_choice.step_floor(int4, replace(int4, precision=kernels.NATIVE), ROWS, 0.28) == 0.0
    pool = candidates(DEFAULT_DRAFT, lambda s: True)
    assert [(s.precision, s.head_tokens) for s in pool if s.precision == kernels.NATIVE] == \
        [(kernels.NATIVE, h) for h in draft_choice.HEADS]
    assert not any(s.precision == kernels.NATIVE for s in candidates(int4, lambda s: True))  # an explicit INT4 keeps it
    assert not any(s.precision == kernels.NATIVE for s in candidates(DEFAULT_DRAFT, lambda s: s.precision != kernels.NATIVE))
    compiled = []

    def compile(settings: ModelSettings):
        compiled.append((settings.precision, settings.head_tokens))
        return held_draft()

    options, _ = planned_on(COMPUTE_BOUND, compile, lambda a, b, t: race.verdict([0.02] * 4, [0.009] * 4),
                            lambda e: (e["prompt"], e["answer"]), prepared=lambda s: True)
    # INT4's heads and INT8 could not pay; the file's blocks on our kernels, as they are and in 4 bits, are measured
    assert compiled == [(p, h) for p in kernels.ON_KERNELS for h in draft_choice.HEADS]
    best = price(options, COMPUTE_BOUND)
    assert best.precision == kernels.NATIVE and best.predicted_speedup > 1


def test_where_no_draft_could_pay_at_its_best_the_plan_measures_nothing_and_keeps_the_incumbent_at_k_0():
    options, _ = planned_on(COMPUTE_BOUND)
    assert len(options) == len(draft_choice.HEADS) + 1 and not any(o.measured for o in options)
    assert all(o.best_case < 1 + draft_choice.MARGIN for o in options)
    best = price(options, COMPUTE_BOUND)
    assert best is options[0] and (best.k, best.predicted_speedup) == (0, 1.0)
    assert draft_choice.left_out(options).startswith("The draft plan measured nothing: no draft could pay")


def test_on_a_memory_bound_cpu_every_candidate_is_measured():
    compiled = []

    def compile(settings: ModelSettings):
        compiled.append((settings.precision, settings.head_tokens))
        return held_draft()

    options, _ = planned_on(MEMORY_BOUND, compile, lambda a, b, t: race.verdict([0.02] * 4, [0.018] * 4),
                            lambda e: (e["prompt"], e["answer"]))
    assert all(o.measured for o in options) and len(compiled) == len(options) - 1
    assert draft_choice.left_out(options) == ""


def test_a_challenger_whose_best_case_cannot_beat_the_measured_incumbent_by_the_margin_is_not_measured():
    """On a memory-bound CPU an incumbent that agrees with the target everywhere pays nearly its best case: INT8, whose
    step is no cheaper and whose acceptance no higher at best, cannot beat it by MARGIN; the trimmed heads can."""
    said, compiled = [], []

    def compile(settings: ModelSettings):
        compiled.append(settings.precision)
        return held_draft()

    options, _ = planned_on(MEMORY_BOUND, compile, lambda a, b, t: race.verdict([0.02] * 4, [0.018] * 4),
                            lambda e: (e["prompt"], list(range(4, 60))), said.append)
    int8 = options[-1]
    assert int8.precision == "int8" and not int8.measured and "int8" not in compiled
    assert all(o.measured for o in options[:-1])
    assert said[-1] == f"  draft int8, full head: not measured: at best {int8.best_case:.2f}× at any acceptance it could " \
                       "reach on this machine's curve"


def test_a_plan_that_measured_nothing_is_kept_and_not_made_again(home, tmp_path):
    profile = Profile(tmp_path / "machine")
    options, _ = planned_on(COMPUTE_BOUND)
    for precision in draft_choice.PRECISIONS:
        prepare_stand_in(replace(DEFAULT_DRAFT, precision=precision))
    price(options, COMPUTE_BOUND, AUTO)
    profile.keep_tune([tune.Trial("draft", choices.DEFAULT, chosen=True)], {"target": DEFAULT_DRAFT, "draft": DEFAULT_DRAFT},
                      options)
    kept = profile.planned_options(DEFAULT_DRAFT)
    assert not any(o.measured for o in kept) and kept[0].chosen
    assert not profile.needs_plan(DEFAULT_DRAFT)
    assert (profile.resolve(DEFAULT_DRAFT).precision, profile.resolve(DEFAULT_DRAFT).head_tokens) == ("int4", 0)


def test_tune_says_in_one_sentence_what_it_did_not_measure(capsys):
    from specdemo.cli.tune_command import print_draft_plan

    options, _ = planned_on(COMPUTE_BOUND)
    price(options, COMPUTE_BOUND)
    print_draft_plan(options)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == draft_choice.left_out(options) and printed[-1].count(". ") == 0
    assert sum("not measured: at best" in line for line in printed) == len(options)
