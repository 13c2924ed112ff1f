"""A target left to the machine (precision `faithful`, the default target's) runs the full-fidelity layout whose single
step is fastest here: before the race, the quickest to prepare (or one already prepared, so nothing converts); after
it, the race's winner, wherever a target is resolved. The race's rule is checked on synthetic step times of the CPU
classes seen (the layouts' real steps: `bench --only llamacpp`; tests/learning/test_tune.py covers the race's statistics)."""

import random
from dataclasses import replace

import pytest

from specdemo.learning import race, target_choice
from specdemo.learning.candidates import CPU
from specdemo.learning.profile import machine_profile
from specdemo.models import kernels, sources
from specdemo.settings import DEFAULT_TARGET, FAITHFUL, FAITHFUL_PRECISIONS, RunSettings
from specdemo.serve import tuning


def prepared(*precisions: str) -> None:
    for precision in precisions:
        folder = sources.cached_folder(replace(DEFAULT_TARGET, precision=precision))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / sources.COMPLETE_MARKER).write_text("")


def resolved() -> str:
    return machine_profile().resolve_precision(DEFAULT_TARGET).precision


def test_the_default_target_is_left_to_the_machine_and_runs_the_quickest_to_prepare_until_it_has_raced(home):
    assert DEFAULT_TARGET.precision == FAITHFUL and FAITHFUL_PRECISIONS == ("gguf-native", "gguf-mixed", "int8")
    assert resolved() == "gguf-native"  # an empty home lays the file's own blocks for its first start: nothing requantized
    prepared("int8")
    assert resolved() == "int8"  # an older home's INT8 runs at once: nothing to convert
    prepared("gguf-mixed")
    assert resolved() == "gguf-mixed"
    prepared("gguf-native")
    assert resolved() == "gguf-native"


def test_without_specdemo_s_kernels_an_empty_home_starts_on_the_plugin_s_quickest_layout(home, monkeypatch):
    monkeypatch.setattr(kernels, "_built", lambda: None)
    assert resolved() == "gguf-mixed"


def test_genai_s_lane_runs_the_plugin_s_fastest_faithful_layout_where_the_target_runs_our_kernels(home):
    profile = machine_profile()
    assert profile.for_plugin(DEFAULT_TARGET).precision == "gguf-mixed"  # nothing raced or prepared: the quickest
    prepared("gguf-native", "int8")
    assert resolved() == "gguf-native" and profile.for_plugin(DEFAULT_TARGET).precision == "int8"  # nothing to convert
    profile.keep_faithful(DEFAULT_TARGET, "gguf-native", {"gguf-native": 0.060, "gguf-mixed": 0.066, "int8": 0.071})
    assert profile.for_plugin(DEFAULT_TARGET).precision == "gguf-mixed"  # the race's fastest of the plugin's
    profile.keep_faithful(DEFAULT_TARGET, "int8", {"gguf-native": 0.070, "int8": 0.067})
    assert profile.for_plugin(DEFAULT_TARGET).precision == "faithful"  # the plugin runs it already: left as it is
    explicit = replace(DEFAULT_TARGET, precision="gguf-native")
    assert profile.for_plugin(explicit) == explicit  # asked for: GenAI says in a sentence that it cannot load it


def test_the_race_s_choice_runs_wherever_the_target_is_resolved_and_a_page_recompiles(home):
    prepared("gguf-mixed", "int8")
    before = machine_profile().stamp()
    machine_profile().keep_faithful(DEFAULT_TARGET, "int8", {"gguf-mixed": 0.076, "int8": 0.067})
    assert resolved() == "int8" and machine_profile().resolve(DEFAULT_TARGET).precision == "int8"
    assert machine_profile().stamp() > before  # the page's engine is compiled again under the choice
    assert RunSettings(replace(DEFAULT_TARGET, precision="int8")).configuration == "faithful"


def test_a_choice_that_is_not_prepared_gives_way_to_a_layout_that_is(home):
    machine_profile().keep_faithful(DEFAULT_TARGET, "int8", {})
    prepared("gguf-mixed")
    assert resolved() == "gguf-mixed"


def test_a_source_that_is_no_gguf_runs_int8_and_an_explicit_precision_is_kept(home, tmp_path):
    folder = tmp_path / "hf-model"
    folder.mkdir()
    assert machine_profile().resolve_precision(replace(DEFAULT_TARGET, source=str(folder))).precision == "int8"
    assert machine_profile().resolve_precision(replace(DEFAULT_TARGET, precision="int4")).precision == "int4"


class Steps:
    """Synthetic single steps of each layout on one CPU class: a median time and a host's noise."""

    def __init__(self, seconds: dict[str, float], spread: float = 0.03, seed: int = 0):
        self.seconds, self.spread, self.rng = seconds, spread, random.Random(seed)
        self.compiled = []

    def compile(self, settings):
        self.compiled.append(settings.precision)
        return settings.precision

    def timer(self, incumbent: str, challenger: str) -> race.Verdict:
        ours, theirs = [], []
        for i in range(race.MAX_PAIRS):
            drift = self.rng.uniform(0.8, 1.3)  # the shared host: both samples of a pair see it
            ours.append(self.seconds[incumbent] * drift * self.rng.gauss(1, self.spread))
            theirs.append(self.seconds[challenger] * drift * self.rng.gauss(1, self.spread))
            if i + 1 >= race.MIN_PAIRS and race.verdict(ours, theirs).settled:
                break
        return race.verdict(ours, theirs)


# Single steps of the 1.5B target's layouts, ms: the AMX Xeon's measured there (INT8 69.5, gguf-mixed 76.3), gguf-native
# made up 10 % slower than INT8 (its AVX-512 path, where the plugin has AMX); a Zen 4's from its rates against llama.cpp
# (INT8 at 0.57x, gguf-mixed at 0.67x), gguf-native made up at 0.9x; a Zen 3's (AVX2 only) from issue 47's rates
# (gguf-mixed 0.50x, INT8 0.48x), gguf-native made up at 0.9x; an AVX2-only machine where all three tie (the rule must
# then keep what runs). Made-up figures are no measurement: they hold the rule, not the kernels' speed.
CPU_CLASSES = {"amx-xeon": ({"int8": 69.5, "gguf-mixed": 76.3, "gguf-native": 76.5}, "int8"),
               "zen4": ({"int8": 1 / 0.57, "gguf-mixed": 1 / 0.67, "gguf-native": 1 / 0.9}, "gguf-native"),
               "zen3": ({"int8": 1 / 0.48, "gguf-mixed": 1 / 0.50, "gguf-native": 1 / 0.9}, "gguf-native"),
               "avx2-tie": ({"int8": 120.0, "gguf-mixed": 120.0, "gguf-native": 120.0}, "gguf-native")}
# Flags of the CPU classes seen (the rule that decides whether there is a race at all reads these; the race's own rule,
# on the step times above, is held on a CPU where it runs).
FLAGS = {"amx-xeon": {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"},
         "zen4": {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"},
         "xeon-207": {"avx2", "fma", "avx512f", "avx512_vnni"},
         "zen3": {"avx2", "fma"},
         "alder-lake": {"avx2", "fma", "avx_vnni"}}
RACES = {"amx-xeon": True, "zen4": False, "xeon-207": False, "zen3": False, "alder-lake": True}
AMX = CPU(frozenset(FLAGS["amx-xeon"]), 2)


@pytest.mark.parametrize("cpu", CPU_CLASSES)
def test_the_race_keeps_the_layout_whose_single_step_is_clearly_faster_on_each_cpu_class(home, cpu):
    seconds, winner = CPU_CLASSES[cpu]
    steps = Steps(seconds)
    log = []
    assert target_choice.choose(DEFAULT_TARGET, log.append, compile=steps.compile, timer=steps.timer, cpu=AMX) == winner
    assert steps.compiled == ["gguf-native", "gguf-mixed", "int8"]  # the running layout first, each compiled once
    assert machine_profile().faithful_choice(DEFAULT_TARGET)["precision"] == winner
    assert any("single step and verification take" in line for line in log)


@pytest.mark.parametrize("cpu", FLAGS)
def test_the_plugin_s_layouts_race_ours_only_where_the_plugin_has_an_8_bit_unit_ours_lack(home, cpu):
    steps, log = Steps(CPU_CLASSES["amx-xeon"][0]), []
    chosen = target_choice.choose(DEFAULT_TARGET, log.append, compile=steps.compile, timer=steps.timer,
                                  cpu=CPU(frozenset(FLAGS[cpu]), 2))
    if RACES[cpu]:
        assert steps.compiled == ["gguf-native", "gguf-mixed", "int8"] and chosen == "int8"
    else:  # nothing compiled, nothing converted: the choice kept at once, and said
        assert steps.compiled == [] and chosen == "gguf-native"
        assert "gguf-native stays without a race" in log[-1]
        assert machine_profile().faithful_choice(DEFAULT_TARGET)["precision"] == "gguf-native"


def test_a_machine_without_specdemo_s_kernels_races_the_other_layouts_and_says_why(home, monkeypatch):
    monkeypatch.setattr(kernels, "_built", lambda: None)
    monkeypatch.setattr(kernels, "unavailable", lambda: "specdemo's kernels are not installed")
    steps, log = Steps({"int8": 69.5, "gguf-mixed": 76.3}), []
    assert target_choice.choose(DEFAULT_TARGET, log.append, compile=steps.compile, timer=steps.timer) == "int8"
    assert steps.compiled == ["gguf-mixed", "int8"]
    assert "target: gguf-native is not raced: specdemo's kernels are not installed" in log
    machine_profile().keep_faithful(DEFAULT_TARGET, "gguf-native", {})  # chosen before the kernels went away
    prepared("gguf-native", "gguf-mixed")
    assert resolved() == "gguf-mixed"


def test_memory_that_does_not_allow_the_race_keeps_the_running_layout_and_decides_nothing(home):
    log = []
    assert target_choice.choose(DEFAULT_TARGET, log.append, compile=lambda settings: None, timer=None,
                                cpu=AMX) == "gguf-native"
    assert machine_profile().faithful_choice(DEFAULT_TARGET) is None and "memory" in log[-1]


def test_a_tuned_machine_whose_faithful_layouts_were_never_raced_tunes_again(home, monkeypatch):
    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    prepared(*FAITHFUL_PRECISIONS)
    target = machine_profile().resolve_precision(DEFAULT_TARGET)
    setting = {"dynamic_quantization_group_size": -1, "inference_precision": "", "kv_cache_precision": "",
               "num_threads": 0}
    from specdemo.learning.profile import choices

    machine_profile().store.update("tune", lambda tune: {"models": {choices.model_key(target): {"setting": setting}}})
    assert tuning.TUNING in [label for label, _ in tuning.background_steps(RunSettings(), 1)]
    machine_profile().keep_faithful(DEFAULT_TARGET, target.precision, {})
    assert tuning.TUNING not in [label for label, _ in tuning.background_steps(RunSettings(), 1)]


def test_the_bench_s_genai_peers_load_the_plugin_s_layout_where_our_lanes_run_our_kernels(home):
    from pathlib import Path
    from types import SimpleNamespace

    from specdemo.bench.harness import Context
    from specdemo.bench.settings import FULL

    prepared("gguf-native", "gguf-mixed")
    ours = SimpleNamespace(settings=replace(DEFAULT_TARGET, precision="gguf-native"), folder=Path("ours"))
    lines = []
    ctx = Context(engine=SimpleNamespace(target=ours), settings=RunSettings(), bench=FULL, log=lines.append)
    peer = ctx.genai_target()
    assert peer.settings.precision == "gguf-mixed"  # GenAI's pipelines cannot load BlockMatMul
    assert peer.folder == sources.cached_folder(peer.settings) and ctx.genai_target() is peer  # prepared once
    assert lines == ["OpenVINO GenAI's pipelines run the target at gguf-mixed: they cannot load specdemo's kernels, "
                     "which our lanes run (gguf-native)"]
    plain = SimpleNamespace(settings=replace(DEFAULT_TARGET, precision="int8"), folder=Path("ours"))
    assert Context(engine=SimpleNamespace(target=plain), settings=RunSettings(), bench=FULL,
                   log=lines.append).genai_target().folder == Path("ours")  # the plugin's own: the very same folder


def test_the_bench_s_genai_speculative_peer_loads_int4_where_a_first_start_s_draft_runs_our_kernels(home):
    from pathlib import Path
    from types import SimpleNamespace

    from specdemo.bench.harness import Context
    from specdemo.bench.settings import FULL
    from specdemo.settings import DEFAULT_DRAFT, DRAFT_PRECISION

    int4 = replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION, head_tokens=0)
    sources.cached_folder(int4).mkdir(parents=True)
    (sources.cached_folder(int4) / sources.COMPLETE_MARKER).write_text("")
    ours = SimpleNamespace(settings=replace(DEFAULT_DRAFT, precision="gguf-native", head_tokens=0), folder=Path("ours"))
    lines = []
    peer = Context(engine=SimpleNamespace(draft=ours), settings=RunSettings(), bench=FULL, log=lines.append).genai_draft()
    assert (peer.settings.precision, peer.folder) == (DRAFT_PRECISION, sources.cached_folder(int4))
    assert lines == ["OpenVINO GenAI's pipelines run the draft at int4: they cannot load specdemo's kernels, which our "
                     "lanes run (gguf-native)"]
