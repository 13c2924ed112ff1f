"""Tuning the compile settings per machine: on fake models whose speed and fidelity depend on the setting, the tuner
races only what can win on the CPU class, picks the fastest faithful setting and refuses an unfaithful one; the chosen
settings reach every compile (ours and GenAI's). Whether a choice keeps greedy equality: test_exactness.py."""

from dataclasses import replace

import pytest

from specdemo.host import compat
from specdemo.learning import candidates, identity, race, tune
from specdemo.learning.profile import machine_profile
from specdemo.learning.profile.choices import DEFAULT, Setting, model_key
from specdemo.run import genai
from specdemo.settings import DEFAULT_TARGET as FAITHFUL_TARGET
TARGET = replace(FAITHFUL_TARGET, precision="int8")  # the default target at one of its layouts, as tune is given it

# Three CPU classes, by their flags: an AMX Xeon (Sapphire Rapids), an AMD Zen 4 (AVX-512 with VNNI and BF16, no
# AMX) and an AVX2-only AMD EPYC (Zen 2 or 3: no VNNI at all).
AMX_XEON = candidates.CPU(frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8",
                               "avx512_fp16"}), 2)
ZEN4 = candidates.CPU(frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), 2)
AVX2_EPYC = candidates.CPU(frozenset({"avx2"}), 2)
# The weights the rules read: the 1.5B target's INT8 (per channel), the 0.5B draft's INT4 (NNCF's groups of 128), the
# target's gguf-mixed (Q4_K in groups of 32, Q6_K per channel) and gguf (Q6_K in groups of 16) layouts.
INT8_TARGET = candidates.Layout(True, frozenset(), frozenset({1536, 8960}), 0.005)
INT4_DRAFT = candidates.Layout(True, frozenset({128}), frozenset({896, 4864}), 0.012)
GGUF_MIXED_TARGET = candidates.Layout(True, frozenset({32}), frozenset({1536, 8960}), 0.005)
GGUF_TARGET = candidates.Layout(True, frozenset({16, 32}), frozenset({1536, 8960}), 0.005)
F16_TARGET = candidates.Layout(False, frozenset(), frozenset(), 0.003)  # fp16 weights: no dynamic quantization


def fake_seconds(settings, other=None) -> float:
    """A fake machine: the larger the group the faster (256 fastest); bf16 faster still but (below) unfaithful, f16
    a little less fast; u8 KV slower."""
    group = {-1: 0.048, 0: 0.060, 16: 0.050, 32: 0.048, 64: 0.042, 128: 0.038, 256: 0.036}[
        settings.dynamic_quantization_group_size]  # -1: the plugin's, 32
    precision = {"": 1.0, "f32": 1.0, "bf16": 0.8, "f16": 0.85}[settings.inference_precision]
    return group * precision * (1.1 if settings.kv_cache_precision == "u8" else 1.0)


def fake_fidelity(settings, probes) -> float:
    """bf16 rounds logits, and group 256 quantizes too coarsely: greedy choices flip."""
    return 0.93 if settings.inference_precision == "bf16" or settings.dynamic_quantization_group_size == 256 else 1.0


def timed(seconds):
    """A race's verdict on a machine without noise: every pair of samples as `seconds(model)` says."""
    return lambda incumbent, challenger, other: race.verdict([seconds(incumbent)] * race.MIN_PAIRS,
                                                             [seconds(challenger)] * race.MIN_PAIRS)


def search(cpu=AMX_XEON, layout=INT8_TARGET, **kwargs):
    log = []
    kwargs = {"compile": lambda settings: settings, "fidelity": fake_fidelity, "timer": timed(fake_seconds), **kwargs}
    trials, _ = tune.Search("target", TARGET, None, [], log.append, **kwargs).run(cpu, layout)
    return trials, log


def test_the_tuner_keeps_the_fastest_faithful_setting():
    """Group 256 is fastest but unfaithful: the next largest group, 128, is faithful and faster than the defaults."""
    trials, _ = search()
    chosen = [t for t in trials if t.chosen]
    assert len(chosen) == 1 and chosen[0].setting == Setting(128, "", "")
    assert chosen[0].relative == pytest.approx(0.038 / 0.048)


def test_a_gain_within_the_noise_margin_keeps_the_incumbent():
    trials, _ = search(cpu=ZEN4, layout=INT4_DRAFT, fidelity=lambda model, probes: 1.0,
                       timer=timed(lambda m: 0.0195 if m.dynamic_quantization_group_size == 128 else 0.02))
    assert next(t for t in trials if t.chosen).setting == DEFAULT  # 2.5 % faster is noise here


def test_a_group_that_is_not_faster_ends_its_dimension():
    """Larger groups do less work a row: where the largest allowed is no faster than the defaults, the smaller ones are
    not raced at all."""
    trials, _ = search(cpu=ZEN4, fidelity=lambda model, probes: 1.0, timer=timed(lambda m: 0.048))
    assert [t.setting.dynamic_quantization_group_size for t in trials] == [-1, 256]


def test_a_faster_setting_that_changes_greedy_choices_is_refused():
    trials, log = search(layout=F16_TARGET)
    bf16 = next(t for t in trials if t.setting.inference_precision == "bf16")
    assert not bf16.faithful and not bf16.chosen and bf16.agreement == pytest.approx(0.93)
    assert next(t for t in trials if t.chosen).setting.inference_precision == "f16"  # the next one, faithful
    assert any("keeps 93.0% of the reference's greedy choices" in line for line in log)


def test_a_faster_setting_whose_verify_calls_part_more_often_than_the_defaults_is_passed_over():
    """fp16 weights on an AMX Xeon: bf16 keeps every greedy choice here and is fastest, but its verify calls part from
    its single steps at 9 per 1,000 positions where the defaults part at 2: the faithful configuration's target takes
    f16, which parts no more than the defaults; without the identity judge bf16 would win."""
    from specdemo.results.fidelity import BatchingNoise

    def parting(settings) -> BatchingNoise:
        return BatchingNoise(0.3, 1000, (2, 13), flips=9 if settings.inference_precision == "bf16" else 2)

    judged = []
    fidelity = lambda model, probes: 1.0  # noqa: E731
    trials, log = search(layout=F16_TARGET, fidelity=fidelity, parting=lambda model: judged.append(model) or parting(model))
    chosen = next(t for t in trials if t.chosen)
    assert chosen.setting == Setting(-1, "f16", "") and chosen.parting_rate == pytest.approx(2.0)
    bf16 = next(t for t in trials if t.setting.inference_precision == "bf16")
    assert bf16.faithful and bf16.parting_rate == pytest.approx(9.0) and not bf16.chosen
    assert any("at 9.0 per 1,000 positions" in line for line in log)
    # measured for settings that would replace the one kept, and once for the defaults, where the first parts more
    # than once
    assert judged == [Setting(-1, "bf16", "").apply(TARGET), DEFAULT.apply(TARGET),
                      Setting(-1, "f16", "").apply(TARGET)]
    without, _ = search(layout=F16_TARGET, fidelity=fidelity)
    assert next(t for t in without if t.chosen).setting.inference_precision == "bf16"


def test_a_winner_that_parts_at_most_once_is_kept_without_measuring_the_defaults():
    """Up to one parting passes against any defaults (the counting noise allows one): ~1 min spared."""
    from specdemo.results.fidelity import BatchingNoise

    judged = []
    trials, _ = search(cpu=ZEN4, fidelity=lambda model, probes: 1.0,
                       parting=lambda model: judged.append(model) or BatchingNoise(0.3, 320, (2, 13), flips=1))
    assert next(t for t in trials if t.chosen).setting == Setting(256, "", "")
    assert judged == [Setting(256, "", "").apply(TARGET)]


def test_only_the_fastest_configurations_target_may_trade_identity_for_speed():
    from specdemo.settings import CONFIGURATIONS

    assert identity.keeps_identity(CONFIGURATIONS["faithful"][0]) and not identity.keeps_identity(CONFIGURATIONS["fastest"][0])


def raced(cpu, layout, current=DEFAULT) -> dict[str, list]:
    """What each dimension races against `current` on `cpu` with `layout`, as the values of that dimension."""
    return {d: [getattr(s, d) for s in candidates.challengers(current, d, cpu, layout)]
            for d in candidates.DIMENSIONS}


def test_an_amx_xeon_races_the_largest_groups_the_weights_allow_and_bf16_only_where_nothing_is_quantized():
    """bf16 switches dynamic quantization off: on this Xeon it took 2.0 times as long for the INT8 target, 1.7 times
    for the INT4 draft. Over fp16 weights there is nothing to switch off."""
    assert raced(AMX_XEON, INT8_TARGET) == {"dynamic_quantization_group_size": [256, 128, 64],
                                            "inference_precision": [], "kv_cache_precision": [], "num_threads": []}
    assert raced(AMX_XEON, F16_TARGET) == {"dynamic_quantization_group_size": [], "inference_precision": ["bf16", "f16"],
                                           "kv_cache_precision": [], "num_threads": []}


def test_a_zen4_races_group_sizes_and_bf16_only_where_nothing_is_quantized():
    assert raced(ZEN4, INT8_TARGET) == {"dynamic_quantization_group_size": [256, 128, 64], "inference_precision": [],
                                        "kv_cache_precision": [], "num_threads": []}
    assert raced(ZEN4, F16_TARGET)["inference_precision"] == ["bf16"]  # no avx512_fp16: no f16


def test_an_avx2_only_epyc_has_nothing_to_race_and_keeps_the_defaults_untimed():
    """No VNNI: dynamic quantization never runs, so its group is moot; no bf16; two cores; a short context."""
    assert not any(raced(AVX2_EPYC, INT8_TARGET).values()) and candidates.nothing_to_race(AVX2_EPYC, INT8_TARGET)
    assert candidates.nothing_to_race(AVX2_EPYC, INT4_DRAFT)
    assert not candidates.nothing_to_race(ZEN4, INT8_TARGET)
    # an AVX2 CPU with AVX-VNNI (Alder Lake and later) does run dynamic quantization
    assert raced(candidates.CPU(frozenset({"avx2", "avx_vnni"}), 2), INT8_TARGET)["dynamic_quantization_group_size"]


def test_a_group_must_divide_the_weights_own_groups_and_rows():
    assert raced(ZEN4, INT4_DRAFT)["dynamic_quantization_group_size"] == [128, 64]  # 256 splits NNCF's 128 and 896
    assert raced(ZEN4, GGUF_MIXED_TARGET)["dynamic_quantization_group_size"] == []  # 32, the default, is the largest
    assert raced(ZEN4, GGUF_TARGET)["dynamic_quantization_group_size"] == [16]  # Q6_K's 16: the default 32 splits it
    uncompressed = candidates.Layout(False, frozenset(), frozenset(), 0.005)  # f16 weights: dynamic quantization never runs
    assert raced(ZEN4, uncompressed)["dynamic_quantization_group_size"] == []
    # under bf16 inference (chosen by hand) there is no dynamic quantization to tune
    assert raced(AMX_XEON, INT8_TARGET, Setting(32, "bf16", "f32"))["dynamic_quantization_group_size"] == []


def test_a_kv_cache_precision_is_raced_only_where_the_cache_is_a_share_of_the_bytes_a_call_reads():
    long_context = replace(INT8_TARGET, kv_share=0.05)
    assert raced(ZEN4, long_context)["kv_cache_precision"] == ["u8"]
    assert raced(AMX_XEON, long_context)["kv_cache_precision"] == ["u8", "f16"]  # f16 arithmetic: avx512_fp16
    assert raced(AMX_XEON, INT8_TARGET)["kv_cache_precision"] == []


def test_threads_are_raced_only_where_there_are_cores_to_spare():
    assert raced(replace(ZEN4, cores=8), INT8_TARGET)["num_threads"] == [7]


def test_the_layout_is_read_from_the_irs_constants_and_config(tmp_path):
    xml = "\n".join(['<layer id="1" type="Const"><data element_type="u4" shape="896, 7, 128" offset="0" size="1"/>',
                     '<layer id="2" type="Const"><data element_type="u4" shape="896, 7, 1" offset="0" size="1"/>',
                     '<layer id="3" type="Const"><data element_type="u8" shape="151936, 896" offset="0" size="1"/>',
                     '<layer id="4" type="Const"><data element_type="u8" shape="4864, 1" offset="0" size="1"/>',
                     '<layer id="5" type="Const"><data element_type="f16" shape="896, 7, 1" offset="0" size="1"/>'])
    (tmp_path / "openvino_model.xml").write_text(xml)
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,'
                                          ' "hidden_size": 896}')
    (tmp_path / "openvino_model.bin").write_bytes(b"\0" * 1_000_000)
    layout = candidates.Layout.of(tmp_path)
    assert layout.compressed and layout.groups == {128} and layout.rows == {896}
    assert layout.kv_share == pytest.approx(2 * 4 * 24 * 2 * 64 * race.CONTEXT / 1_000_000)


def test_the_defaults_are_the_settings_of_an_untuned_compile():
    """A pair tune keeps at the defaults is the very pair the page compiled and measured before the tune: the same
    settings, so the same cost curve, batching noise and acceptance keys (none measured again)."""
    from specdemo.host import compat

    assert DEFAULT.apply(TARGET) == TARGET
    assert compat.compile_config(DEFAULT.apply(TARGET), None) == compat.compile_config(TARGET, None)
    assert DEFAULT.describe() == "dyn. quant. default, f32, KV f32"


def test_a_cpu_class_is_named_by_its_flags():
    assert AMX_XEON.describe() == "AMX"
    assert ZEN4.describe() == "AVX-512 with VNNI and BF16, no AMX"
    assert AVX2_EPYC.describe() == "AVX2 without VNNI"


def test_the_chosen_settings_reach_our_compiles_and_genais(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    trials = [tune.Trial("target", Setting(128, "f32", "u8"), seconds=0.03, relative=0.75, faithful=True, chosen=True),
              tune.Trial("target", DEFAULT, seconds=0.04, relative=1.0, faithful=True)]
    machine_profile().keep_tune(trials, {"target": TARGET})
    tuned = machine_profile().resolve(TARGET)
    assert (tuned.dynamic_quantization_group_size, tuned.kv_cache_precision) == (128, "u8")
    assert compat.compile_config(tuned, None)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 128
    assert genai.compile_properties(TARGET)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 128  # GenAI's lane too
    assert machine_profile().resolve(replace(TARGET, kv_cache_precision="f16")).kv_cache_precision == "f16"
    when = machine_profile().tune()["models"][model_key(TARGET)]["tuned_at"][11:16]
    assert machine_profile().gain(TARGET) == f"tuned at {when}: 25% faster than the defaults"

    from specdemo.run import engine
    from specdemo.models import loading
    from specdemo.settings import RunSettings

    seen = []
    monkeypatch.setattr(loading.sources, "prepare", lambda settings, progress=None: seen.append(settings) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.Engine.load(RunSettings(TARGET))
    assert [s for s in seen if s.source == TARGET.source][0].dynamic_quantization_group_size == 128  # our engine's


def test_each_model_of_the_bench_genai_peer_gets_its_own_tuned_settings(tmp_path, monkeypatch):
    """A target tuned to group 256 must not hand its group to an INT4 draft (GenAI's draft would run its slow path)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from specdemo.bench.harness import genai_properties
    from specdemo.settings import DEFAULT_DRAFT

    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    draft_settings = replace(DEFAULT_DRAFT, precision="int4")  # an empty home's auto draft is the GGUF's own blocks
    trials = [tune.Trial("target", Setting(256, "f32", "f32"), chosen=True),
              tune.Trial("draft", Setting(128, "f32", "f16"), chosen=True)]
    machine_profile().keep_tune(trials, {"target": TARGET, "draft": draft_settings})
    target, draft = SimpleNamespace(settings=TARGET), SimpleNamespace(settings=draft_settings)
    ours, theirs = genai_properties(target, draft)
    assert ours["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 256 and theirs["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 128
    assert theirs["KV_CACHE_PRECISION"] == "f16"
    assert genai_properties(target, draft, defaults=True) == ({}, {})


def test_another_configurations_target_is_searched_beside_the_draft_as_tuned(tmp_path, monkeypatch):
    """`tune --target-only` (the fastest configuration's INT4 target, after the default tune): the draft, tuned and
    planned already, is neither searched nor planned again, and the target is timed beside its tuned compile; without
    a tuned draft both are searched."""
    from types import SimpleNamespace

    from specdemo.learning import draft_choice
    from specdemo.settings import DEFAULT_DRAFT

    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    int4_target, draft = replace(TARGET, precision="int4"), replace(DEFAULT_DRAFT, precision="int4")
    searched, partners = [], []

    def fake_run(search, cpu, layout):
        searched.append((search.role, search.base.precision))
        partners.append(search.other)
        return [tune.Trial(search.role, Setting(64, "f32", "f32"), faithful=True, chosen=True)], search.base

    monkeypatch.setattr(tune.Search, "run", fake_run)
    def fake_compile(settings, tokenizer=None):
        assert settings.head_tokens <= 0 or tokenizer is not None, "a trimmed head needs the tokenizer to compile"
        return settings

    monkeypatch.setattr(tune, "compile_model", fake_compile)
    monkeypatch.setattr(tune, "probes_of", lambda model, tokenizer, examples: [])
    monkeypatch.setattr(tune.sources, "prepare", lambda settings, progress=None: tmp_path)
    monkeypatch.setattr(candidates.CPU, "here", staticmethod(lambda: ZEN4))
    monkeypatch.setattr(candidates.Layout, "of", staticmethod(lambda folder: INT8_TARGET))
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda folder: SimpleNamespace())
    plans = []
    monkeypatch.setattr(tune, "plan_draft", lambda *args, incumbent: plans.append((args[1], incumbent)) or ["a plan"])

    trials, plan = tune.tune(int4_target, draft, log=lambda m: None, again=False)
    assert searched == [("target", "int4"), ("draft", "int4")] and plan == ["a plan"]  # nothing tuned yet: both
    assert plans == [(int4_target, draft)]  # the plan measures against the compiles the searches kept

    machine_profile().keep_tune([tune.Trial("draft", Setting(128, "f32", "u8"), chosen=True)], {"draft": draft},
                                [draft_choice.DraftOption("int4", 16_000, chosen=True)])  # the plan trimmed the head
    searched.clear(), partners.clear()
    trials, plan = tune.tune(int4_target, draft, log=lambda m: None, again=False)
    assert searched == [("target", "int4")] and plan == []
    assert (partners[0].dynamic_quantization_group_size, partners[0].kv_cache_precision) == (128, "u8")  # the tuned draft
    searched.clear()
    tune.tune(int4_target, draft, log=lambda m: None)  # `tune` without --target-only searches both again
    assert searched == [("target", "int4"), ("draft", "int4")]


def test_a_cpu_with_nothing_to_race_keeps_the_defaults_without_compiling_a_reference(tmp_path, monkeypatch):
    """An AVX2-only EPYC: no reference, no probes, no search; the draft plan still runs (its choice is the CPU's)."""
    from types import SimpleNamespace

    from specdemo.settings import DEFAULT_DRAFT

    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    compiled = []
    monkeypatch.setattr(tune, "compile_model", lambda settings, tokenizer=None: compiled.append(settings) or settings)
    monkeypatch.setattr(tune.Search, "run", lambda *args, **kwargs: pytest.fail("nothing should be raced"))
    monkeypatch.setattr(tune.sources, "prepare", lambda settings, progress=None: tmp_path)
    monkeypatch.setattr(candidates.CPU, "here", staticmethod(lambda: AVX2_EPYC))
    monkeypatch.setattr(candidates.Layout, "of", staticmethod(lambda folder: INT8_TARGET))
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda folder: SimpleNamespace())
    monkeypatch.setattr(tune, "plan_draft", lambda *args, incumbent: ["a plan"])
    trials, plan = tune.tune(TARGET, DEFAULT_DRAFT, log=lambda m: None)
    assert [(t.role, t.setting, t.chosen) for t in trials] == [("target", DEFAULT, True), ("draft", DEFAULT, True)]
    assert plan == ["a plan"] and compiled == [DEFAULT.apply(TARGET)]  # only the target the plan measures against


def test_a_target_race_sees_a_compile_whose_verify_calls_jump_past_four_tokens():
    """The GGUF's own blocks under dynamic quantization in groups of 32 score 4 tokens cheaply and 5 or more at nearly
    twice the cost (measured on an AMD EPYC Zen 5); a race timing only 4-token verify calls would choose that compile."""
    from tests.fake_models import FakeModel

    cliff = FakeModel(50, "a", seconds=lambda n: 0.050 * (1.2 if n <= 4 else 1.9) if n > 1 else 0.050)
    smooth = FakeModel(50, "b", seconds=lambda n: 0.051 * (1 + 0.08 * (n - 1)) if n > 1 else 0.051)
    draft = FakeModel(50, "d", seconds=lambda n: 0.01)
    verdict = race.race(cliff, smooth, draft, race.sample_target)
    assert verdict.faster and verdict.challenger_s < verdict.incumbent_s
    assert smooth.length == cliff.length == race.CONTEXT  # every sample rolls back to the context


def test_a_parting_more_or_less_than_the_defaults_is_counting_noise_but_three_times_as_many_is_not():
    """Measured on the Zen 5 over 320 positions: the defaults part twice; the GGUF's blocks in groups of 16 (18 %
    faster) three times, bf16 six times."""
    defaults = tune.Trial("target", DEFAULT, parting_rate=1000 * 2 / 320, parting_positions=320)
    judged = lambda flips: tune.Trial("target", DEFAULT, parting_rate=1000 * flips / 320, parting_positions=320)
    assert identity.parts_no_more(judged(3), defaults) and identity.parts_no_more(judged(0), defaults)
    assert not identity.parts_no_more(judged(6), defaults)
    none = tune.Trial("target", DEFAULT, parting_rate=0.0, parting_positions=320)
    assert identity.parts_no_more(judged(1), none) and not identity.parts_no_more(judged(2), none)
    # the defaults not measured: a candidate that parts at most once passes against any defaults, no other does
    assert identity.parts_no_more(judged(1), None) and not identity.parts_no_more(judged(2), None)


class Compile:
    """A stand-in compile that counts how many of its kind are alive at once (a real one holds 1.6 GiB) and how often
    each setting was compiled."""

    alive = most = 0
    made: list = []

    def __init__(self, settings):
        self.settings = settings
        Compile.made.append(settings)
        Compile.alive += 1
        Compile.most = max(Compile.most, Compile.alive)

    def __del__(self):
        Compile.alive -= 1

    def __getattr__(self, name):  # what the setting says, as a real compile's settings
        return getattr(self.settings, name)


def compiles(monkeypatch, parting=None, fidelity=fake_fidelity):
    monkeypatch.setattr(Compile, "most", 0)
    monkeypatch.setattr(Compile, "made", [])
    search = tune.Search("target", TARGET, None, [], lambda m: None, compile=Compile,
                         fidelity=lambda model, probes: fidelity(model.settings, probes),
                         timer=timed(lambda m: fake_seconds(m.settings)), parting=parting)
    trials, held = search.run(AMX_XEON, INT8_TARGET)
    return trials, held


def test_the_search_holds_two_compiles_of_the_model_at_a_time_and_still_keeps_the_fastest(monkeypatch):
    """Six group sizes compiled at once took 11 GiB for the 1.5B INT8 target: the incumbent is held and each challenger
    raced against it alone, then let go; the winner's compile is the one the search hands back."""
    trials, held = compiles(monkeypatch)
    assert Compile.most == 2
    chosen = next(t for t in trials if t.chosen)
    assert chosen.setting == Setting(128, "", "") and chosen.relative == pytest.approx(0.038 / 0.048)
    assert held.settings == chosen.setting.apply(TARGET)


def test_no_setting_is_compiled_twice_so_the_tune_never_waits_for_memory_it_holds_itself(monkeypatch):
    """Issue 41: beside the page, the tune held its incumbent and compiled again the challenger that had just led its
    race, to count its partings; it waited the full 10 min for that memory, skipped it and waited again for the next.
    Now the leader is judged on its own compile while it is held, and the incumbent is held across dimensions: every
    setting is compiled once, and never a third compile beside two."""
    from specdemo.results.fidelity import BatchingNoise

    noise = lambda model: BatchingNoise(0.3, 1000, (2, 13), flips=2)  # noqa: E731
    trials, _ = compiles(monkeypatch, parting=noise, fidelity=lambda settings, probes: 1.0)
    assert len(Compile.made) == len(set(Compile.made)) == len(trials)
    assert Compile.most == 2


def test_a_challengers_time_is_its_ratio_to_the_incumbent_in_their_own_race_so_drift_between_races_cancels():
    """The machine slows down between races (each race 20 % slower than the one before): f16 is 10 % faster than the
    defaults in its own race, though its seconds are more than the defaults' in the first race."""
    races = []

    def drifting(incumbent, challenger, other):
        races.append(challenger)
        slow = 1.2 ** len(races)
        return race.verdict([slow * 0.05] * race.MIN_PAIRS,
                            [slow * (0.9 if challenger.inference_precision == "f16" else 1.0) * 0.05] * race.MIN_PAIRS)

    trials, _ = search(layout=F16_TARGET, fidelity=lambda model, probes: 1.0, timer=drifting)
    assert len(races) == 2  # bf16 ties; then f16
    chosen = next(t for t in trials if t.chosen)
    assert chosen.setting.inference_precision == "f16" and chosen.relative == pytest.approx(0.9)


def test_a_challenger_memory_does_not_allow_is_left_out_and_the_incumbent_one_stops_the_tune_with_a_sentence():
    from specdemo.host import memory

    trials, _ = search(cpu=ZEN4, fidelity=lambda model, probes: 1.0, admit=lambda what: "group 256" not in what)
    skipped = next(t for t in trials if t.setting.dynamic_quantization_group_size == 256)
    assert not skipped.faithful and not skipped.chosen
    assert next(t for t in trials if t.chosen).setting.dynamic_quantization_group_size == 128  # the fastest compiled
    with pytest.raises(memory.Short, match="memory does not allow the target's incumbent compile"):
        search(admit=lambda what: False)
