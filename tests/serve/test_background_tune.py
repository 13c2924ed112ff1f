"""A new machine's background work after the first start (tune, the other configurations' models): only what the
machine still needs and memory allows, started once, at the lowest CPU priority, stopped while visitors' runs hold the
machine, ended with the server, and the model panel says where it stands. The steps themselves are replaced by short
child processes (tests/learning/test_tune.py covers the tuner, tests/integration/test_conversion_interruption.py the conversion)."""

import subprocess
from dataclasses import replace
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from specdemo.host import load, machine
from specdemo.learning.candidates import CPU
from specdemo.learning.profile import choices, machine_profile
from specdemo.models import sources
from specdemo.settings import CONFIGURATIONS, DEFAULT_DRAFT, DEFAULT_TARGET, RunSettings
from specdemo.serve import tuning
from specdemo.serve.work import Background
from specdemo.ui import handlers
from tests.learning.test_draft_choice import busy, option, planned


def child(code: int = 0, seconds: float = 0.0) -> list[str]:
    """A stand-in for a step: prints its priority, sleeps, then exits with the code given."""
    return [sys.executable, "-c", f"import os, sys, time; print('niceness', os.nice(0), flush=True); "
                                  f"time.sleep({seconds}); sys.exit({code})"]


@pytest.fixture
def turned_on(home, monkeypatch) -> Background:
    """This test's own empty SPECDEMO_HOME, background work on (conftest turns it off), and a server's Background with
    none started yet."""
    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    # An AMX Xeon's flags, where every step may run (the plugin's layouts may beat our kernels); the CPU classes where
    # they cannot are held by their own test
    flags_of(monkeypatch, AMX_FLAGS)
    return Background()


def flags_of(monkeypatch, flags) -> None:
    """This CPU's flags, wherever they are read: CPU.here (the plugin's race, tune's candidates) and
    machine.cpu_features (which draft runs before a plan, choices.unplanned_draft)."""
    monkeypatch.setattr(CPU, "here", staticmethod(lambda: CPU(frozenset(flags), 2)))
    monkeypatch.setattr(machine, "cpu_features", lambda: sorted(flags))


AMX_FLAGS = frozenset({"avx2", "avx512f", "avx512_vnni", "amx_int8"})


def finish(background: tuning.BackgroundWork) -> None:
    for _ in range(1200):  # the waiting thread sets the state just after the last step's exit
        if background.state != "running":
            return
        time.sleep(0.05)
    pytest.fail("the background work did not end")


def tuned_here(*precisions: str, targets=(DEFAULT_TARGET,)) -> None:
    """A tune with a choice for each of `targets` (the default one, its faithful layout raced) and, given `precisions`,
    a draft plan that priced them (a full head each), as `python -m specdemo tune` leaves it in the machine profile."""
    setting = {"dynamic_quantization_group_size": 128, "inference_precision": "f32", "kv_cache_precision": "u8",
               "num_threads": 0}
    resolved = [machine_profile().resolve_precision(target) for target in targets]  # a faithful target: its layout
    data = {"models": {choices.model_key(target): {"setting": setting, "relative": 0.8} for target in resolved},
            "faithful": {t.source: {"precision": r.precision} for t, r in zip(targets, resolved) if t != r}}
    if precisions:
        options = [{"precision": p, "head_tokens": 0, "predicted_speedup": 1.5} for p in precisions]
        data["drafts"] = {choices.draft_key(DEFAULT_DRAFT): {"options": options, **choices.MEASURED_UNDER}}
    machine_profile().store.update("tune", lambda tune: data)


def prepared(*models) -> None:
    """Mark models as converted, as a finished conversion leaves them."""
    for model in models:
        folder = sources.cached_folder(machine_profile().resolve_precision(model))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / sources.COMPLETE_MARKER).write_text("")


def test_a_new_machine_needs_the_drafts_nncf_precisions_then_the_tune_then_the_other_configurations_models(turned_on):
    prepared(*CONFIGURATIONS["faithful"])  # the first start prepared the default pair before the page was ready
    assert machine_profile().resolve_precision(DEFAULT_DRAFT).precision == "gguf-native"  # the draft on the file's blocks
    steps = tuning.background_steps(RunSettings(), model_bytes=1)
    assert [label for label, _ in steps] == ["preparing the draft at int4, for the draft plan",
                                             "preparing the draft at gguf-q4, for the draft plan",
                                             "preparing the draft at int8, for the draft plan, and the target at "
                                             "gguf-mixed, for the faithful race", tuning.TUNING,
                                             "preparing the fastest configuration's models",
                                             "tuning the fastest configuration's target"]
    # NNCF's INT4 draft, left out of the first start, is the draft plan's incumbent: prepared in the background first
    assert steps[0][1][-2:] == ["--draft-precision", "int4"]
    # then the file's blocks in 4 bits on our kernels (they run here), which the plan prices beside the first start's
    assert steps[1][1][-2:] == ["--draft-precision", "gguf-q4"]
    # before the tune, whose draft plan then prices the draft and whose race needs the plugin's faithful layouts (the first
    # start ran the file's own blocks on our kernels): the quicker of them beside the draft, INT8 in the race itself
    assert steps[2][1][-4:] == ["--draft-precision", "int8", "--target-precision", "gguf-mixed"]
    assert steps[3][1][-3:] == ["-m", "specdemo", "tune"] and steps[4][1][-2:] == ["--configuration", "fastest"]
    # its INT4 target, once prepared, searched beside the draft as the tune before it chose
    assert steps[5][1][-4:] == ["tune", "--configuration", "fastest", "--target-only"]


def test_a_machine_tuned_before_its_draft_plan_covered_precisions_plans_the_draft_alone(turned_on):
    tuned_here()  # compile settings chosen, no draft plan in the file
    prepared(*CONFIGURATIONS["faithful"], *CONFIGURATIONS["fastest"], replace(DEFAULT_DRAFT, precision="int4"))
    steps = tuning.background_steps(RunSettings(), 1)
    assert [label for label, _ in steps] == ["preparing the draft at gguf-q4, for the draft plan",
                                             "preparing the draft at int8, for the draft plan",
                                             tuning.PLANNING, "tuning the fastest configuration's target"]
    assert steps[2][1][-2:] == ["tune", "--draft-plan"]
    prepared(replace(DEFAULT_DRAFT, precision="int8"), replace(DEFAULT_DRAFT, precision="gguf-q4"))
    assert [label for label, _ in tuning.background_steps(RunSettings(), 1)][0] == tuning.PLANNING  # still no plan


@pytest.mark.parametrize("cpu", [{"avx2", "avx512f", "avx512_vnni"}, {"avx2", "fma"}])
def test_where_the_plugin_cannot_beat_our_kernels_its_race_and_the_fastest_configuration_are_left_out(turned_on,
                                                                                                     monkeypatch, cpu):
    # a Zen 4 or a Xeon without AMX, a Zen 3: the plugin has no 8-bit unit our kernels lack (target_choice.plugin_may_win)
    flags_of(monkeypatch, cpu)
    prepared(*CONFIGURATIONS["faithful"])
    said = []
    steps = tuning.background_steps(RunSettings(), model_bytes=1, log=said.append)
    assert [label for label, _ in steps] == ["preparing the draft at int4, for the draft plan",
                                             "preparing the draft at gguf-q4, for the draft plan",
                                             "preparing the draft at int8, for the draft plan, and the target at "
                                             "gguf-mixed, for GenAI's lane", tuning.TUNING,
                                             "preparing the fastest configuration's models"]
    assert not tuning.runs(steps[4]) and "no faster than the faithful target on specdemo's kernels" in steps[4][1]
    assert said == [tuning.skip_line(*steps[4])]  # said once, in the terminal and the work's log; its tune not listed


def test_a_draft_with_its_own_precision_needs_no_other(turned_on):
    settings = RunSettings(draft=replace(DEFAULT_DRAFT, precision="int4"))
    steps = tuning.background_steps(settings, 1)
    assert [label for label, _ in steps][0] == tuning.TUNING and tuning.tunes_the_pair(steps)


def test_a_machine_tuned_and_prepared_needs_nothing_and_starts_nothing(turned_on):
    tuned_here("int4", "gguf-q4", "int8", targets=(DEFAULT_TARGET, CONFIGURATIONS["fastest"][0]))
    prepared(*CONFIGURATIONS["faithful"], *(replace(DEFAULT_DRAFT, precision=p) for p in ("int8", "gguf-q4")))
    assert [label for label, _ in tuning.background_steps(RunSettings(), 1)] == ["preparing the fastest configuration's models"]
    assert not tuning.tunes_the_pair(turned_on.needed_steps(model_bytes=1))  # the page learns all of its pair itself
    prepared(*CONFIGURATIONS["fastest"])
    assert tuning.background_steps(RunSettings(), 1) == []
    assert turned_on.start_if_needed(model_bytes=1) is None and turned_on.current is None


def test_the_fastest_configurations_target_is_tuned_too_once_the_default_one_is(turned_on):
    tuned_here("int4", "gguf-q4", "int8")  # the default target tuned and the draft planned; the INT4 target not yet
    prepared(*CONFIGURATIONS["faithful"], *CONFIGURATIONS["fastest"],
             *(replace(DEFAULT_DRAFT, precision=p) for p in ("int8", "gguf-q4")))
    steps = tuning.background_steps(RunSettings(), 1)
    assert [label for label, _ in steps] == ["tuning the fastest configuration's target"]


def test_too_little_memory_skips_the_tune_and_says_so(turned_on):
    said = []
    free = psutil.virtual_memory().available
    steps = tuning.background_steps(RunSettings(), model_bytes=free, log=said.append)  # the tune needs 5× that
    assert tuning.TUNING not in [label for label, _ in steps]
    assert len(said) == 1 and "python -m specdemo tune" in said[0] and "GiB" in said[0]


def test_nothing_starts_when_turned_off(turned_on, monkeypatch):
    monkeypatch.setenv(tuning.TUNE_AT_START, "0")
    assert turned_on.needed_steps(model_bytes=1) == []
    assert turned_on.start_if_needed(model_bytes=1) is None and turned_on.current is None


def test_the_steps_run_in_turn_niced_and_the_end_is_reported(turned_on):
    ended = []
    background = turned_on.start([(tuning.TUNING, child(0)), ("preparing", child(0))], on_end=ended.append)
    assert turned_on.current is background and "applied as soon as it is done" in background.describe()
    assert turned_on.start_if_needed(model_bytes=1) is None  # one per server
    finish(background)
    assert background.state == "done" and ended == [background]
    assert background.log_path.read_text().count("niceness 19") == 2
    assert "applied between visitors' runs" in background.describe() and "restart" not in background.describe()


def test_each_step_that_ends_well_is_reported_as_it_ends_so_a_tune_applies_before_the_rest(turned_on):
    steps, ended = [], []
    background = turned_on.start([(tuning.TUNING, child(0)), ("preparing the fastest configuration's models", child(0, 1.0))],
                              on_end=ended.append, on_step=lambda work, label: steps.append((label, work.state)))
    for _ in range(200):  # the tune's step has ended; the next one is still running
        if steps:
            break
        time.sleep(0.05)
    assert steps == [(tuning.TUNING, "running")] and not ended
    finish(background)
    assert [label for label, _ in steps] == [tuning.TUNING, "preparing the fastest configuration's models"]
    assert ended == [background]


def test_a_failed_step_ends_the_work_and_points_to_its_log(turned_on):
    background = turned_on.start([(tuning.TUNING, child(3)), ("preparing", child(0))])
    finish(background)
    assert background.state == "failed" and background.returncode == 3
    assert background.log_path.read_text().count("niceness") == 1  # the second step never ran
    assert str(background.log_path) in background.describe() and tuning.TUNING in background.describe()


def test_a_visitors_run_stops_the_work_until_the_last_run_ends(turned_on):
    background = turned_on.start([(tuning.TUNING, child(0, 60))])
    process = psutil.Process(started(background).pid)
    try:
        with turned_on.machine_held():
            assert wait_for_status(process, psutil.STATUS_STOPPED)
            with turned_on.machine_held():  # a second run overlapping (a race lane, an API client)
                pass
            assert process.status() == psutil.STATUS_STOPPED  # still held by the first
        assert wait_for_status(process, psutil.STATUS_SLEEPING)
    finally:
        background.process.kill()


def test_work_started_while_a_run_holds_the_machine_starts_stopped(turned_on):
    with turned_on.machine_held():
        background = turned_on.start([(tuning.TUNING, child(0, 60))])
        try:
            process = psutil.Process(started(background).pid)
            assert wait_for_status(process, psutil.STATUS_STOPPED)
        except BaseException:
            background.process.kill()
            raise
    try:
        assert wait_for_status(process, psutil.STATUS_SLEEPING)
    finally:
        background.process.kill()


def test_the_work_outlives_the_thread_that_started_it_but_not_the_server(turned_on, tmp_path):
    """The app starts the work from its loading thread, which ends at once: the work goes on. A server stopped with
    Ctrl-C (or killed) leaves nothing running on the machine."""
    report = tmp_path / "report"
    server = subprocess.run([sys.executable, "-c", f"""
import sys, threading, time
from specdemo.serve import tuning
from specdemo.serve.work import Background
step = [sys.executable, "-c", "import time; time.sleep(60)"]
background = Background()
loading = threading.Thread(target=background.start, args=([(tuning.TUNING, step)],))
loading.start()
loading.join()
time.sleep(1)
open({str(report)!r}, "w").write(f"{{background.current.process.pid}} {{background.current.state}}")
"""], cwd=tuning.ROOT, timeout=60)
    assert server.returncode == 0
    pid, state = report.read_text().split()
    assert state == "running"  # a second after the loading thread ended
    for _ in range(100):
        if not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.05)
    psutil.Process(int(pid)).kill()
    pytest.fail("the background work outlived the server")


class Described:
    """A loaded model as the panel sees it: only its facts."""

    def __init__(self, tuned: str):
        self.tuned = tuned

    def describe(self) -> SimpleNamespace:  # as LoadedModel.describe's Facts, written as JSON
        return SimpleNamespace(to_json=lambda: {"name": "m", "tuned": self.tuned})


def test_the_model_panel_says_where_the_background_tune_stands(turned_on):
    assert handlers.describe_model(Described(""), None)["tuned"] == ""  # the panel: "not tuned: python -m specdemo tune"
    background = turned_on.start([(tuning.TUNING, child(0, 0.5))])
    assert "tuning this machine in the background" in handlers.describe_model(Described(""), turned_on.current)["tuned"]
    compiled_tuned = handlers.describe_model(Described("tuned: 20 % faster"), turned_on.current)
    assert compiled_tuned["tuned"] == "tuned: 20 % faster"
    finish(background)
    assert "applied between visitors' runs" in handlers.describe_model(Described(""), turned_on.current)["tuned"]


def started(background: tuning.BackgroundWork) -> subprocess.Popen:
    """The current step's process, once its thread has started it."""
    for _ in range(200):
        if background.process is not None:
            return background.process
        time.sleep(0.02)
    pytest.fail("no step started")


def wait_for_status(process: psutil.Process, status: str) -> bool:
    for _ in range(100):
        if process.status() == status:
            return True
        time.sleep(0.02)
    return False


def test_a_step_memory_does_not_allow_is_skipped_and_the_next_one_runs(turned_on):
    """A step that waited for memory and gave up exits memory.SKIPPED, its reason in the log: the work goes on with the
    next step (the fastest configuration's models still fit when the tune did not), and the panel says what was left."""
    from specdemo.host import memory

    background = turned_on.start([(tuning.TUNING, child(memory.SKIPPED)), ("preparing the fastest configuration's models",
                                                                         child(0))])
    finish(background)
    assert background.state == "done" and background.skipped == [tuning.TUNING]
    assert background.finished == ["preparing the fastest configuration's models"]
    assert "skipped, memory did not allow it" in background.describe() and "failed" not in background.describe()


def test_each_step_counts_the_page_beside_itself_in_the_memory_bound(turned_on):
    import os

    from specdemo.host import memory

    background = turned_on.start([(tuning.TUNING, [sys.executable, "-c", f"import os; print('root', os.environ['{memory.ROOT_VARIABLE}'])"])])
    finish(background)
    assert f"root {os.getpid()}" in background.log_path.read_text()


# ---- what could not pay here is not run, and said (issue 48)


def test_where_no_draft_can_pay_on_the_quick_curve_the_drafts_int8_is_not_prepared_and_that_is_said(turned_on):
    from tests.learning.test_draft_choice import COMPUTE_BOUND

    prepared(*CONFIGURATIONS["faithful"], replace(DEFAULT_DRAFT, precision="int4"))  # the curve's draft: INT4
    said = []
    steps = tuning.background_steps(RunSettings(), 1, said.append, costs=COMPUTE_BOUND)
    q4, int8, *rest = steps
    # a draft on our kernels is never priced by its bits beside INT4 (draft_choice: ON_OTHER_KERNELS): prepared
    assert q4[0] == "preparing the draft at gguf-q4, for the draft plan" and tuning.runs(q4)
    assert int8[0] == "preparing the draft at int8, for the draft plan" and not tuning.runs(int8)
    assert [label for label, _ in rest][0] == tuning.TUNING  # the faithful race's layout is converted by the tune
    assert said == [tuning.skip_line(*int8)] and "at best 0.9" in said[0] and "any acceptance it could reach" in said[0]


def test_where_a_draft_could_pay_on_the_quick_curve_the_drafts_int8_is_prepared(turned_on):
    from tests.learning.test_draft_choice import MEMORY_BOUND

    prepared(*CONFIGURATIONS["faithful"], replace(DEFAULT_DRAFT, precision="int4"))  # the curve's draft: INT4
    steps = tuning.background_steps(RunSettings(), 1, costs=MEMORY_BOUND)
    assert steps[0][0] == "preparing the draft at gguf-q4, for the draft plan"
    assert steps[1][0].startswith("preparing the draft at int8, for the draft plan") and all(map(tuning.runs, steps))


def test_a_tuned_machine_does_not_plan_its_draft_where_no_draft_could_pay(turned_on, monkeypatch):
    """Unless specdemo's kernels run here: a draft on them is never priced by its bits beside INT4 (draft_choice:
    ON_OTHER_KERNELS), so the plan measures it."""
    from specdemo.models import kernels
    from tests.learning.test_draft_choice import COMPUTE_BOUND, QWEN_05B
    import json

    for ours in (False, True):  # a machine where specdemo's kernels did not build, and one where they run
        monkeypatch.setattr(kernels, "runnable", lambda precisions: tuple(p for p in precisions
                                                                          if ours or p not in kernels.ON_KERNELS))
        tuned_here()  # no draft plan yet
        prepared(*CONFIGURATIONS["faithful"], *CONFIGURATIONS["fastest"], replace(DEFAULT_DRAFT, precision="int4"))
        draft = machine_profile().resolve(DEFAULT_DRAFT)
        (sources.cached_folder(draft) / "config.json").write_text(json.dumps(QWEN_05B))  # its head's share of a step
        steps = dict(tuning.background_steps(RunSettings(), 1, lambda message: None, costs=COMPUTE_BOUND))
        assert tuning.runs((tuning.PLANNING, steps[tuning.PLANNING])) == ours
        assert ("no other draft more" in steps[tuning.PLANNING]) != ours


def test_a_step_not_run_is_said_in_the_log_the_pages_line_and_the_panel(turned_on):
    from specdemo.ui import render

    why = "on this machine's cost curve int8, full head would give at best 0.95× at any acceptance it could reach"
    background = turned_on.start([("preparing the draft at int8, for the draft plan", why),
                               ("preparing the fastest configuration's models", child(0))])
    finish(background)
    assert background.state == "done" and background.log_path.read_text().count("niceness") == 1  # one step ran
    assert tuning.skip_line("preparing the draft at int8, for the draft plan", why) in background.log_path.read_text()
    line = render.render_background(background.progress())
    assert "Not run, as it could not pay here: preparing the draft at int8, for the draft plan." in line
    assert "preparing the draft at int8, for the draft plan: not run, it could not pay here" in background.describe()


def watched(others: float) -> load.HostLoad:
    return load.HostLoad(seconds=5.0, steal=0.0, others=others, load_average=1.0, cores=2)


def test_a_draft_plan_priced_on_a_busy_host_is_made_again_on_the_page_as_soon_as_the_host_is_quiet(home, monkeypatch):
    """The page does not wait for its next start: with no visitor's run and no background work, it watches the host, and
    plans again on the first quiet watch; busy watches plan nothing. A clean plan ends it."""

    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    planned(machine_profile(), busy(option(0, 0.94, 0.050)))
    background, started, said = Background(), [], []
    watches = iter([watched(0.50), watched(0.40), watched(0.03)])

    def start(steps):
        started.append(steps)
        planned(machine_profile(), option(0, 0.94, 0.050))  # `tune --draft-plan` on a quiet host: a clean plan
        return None

    with background.machine_held():  # a visitor's run: the host is not even watched
        thread = background.plan_again_when_quiet(start, DEFAULT_DRAFT, said.append, lambda: next(watches), poll_s=0.01)
        assert background.plan_again_when_quiet(start, DEFAULT_DRAFT, said.append, lambda: next(watches)) is None  # one
        thread.join(0.2)
        assert thread.is_alive() and not started
    thread.join(5)
    assert [label for steps in started for label, _ in steps] == [tuning.PLANNING]
    assert said == ["the draft plan was priced on a busy host (provisional): planning it again now that the host is quiet "
                    "(other processes 3 % of the CPU time, steal 0 % over 5 s)"]
    assert not machine_profile().provisional_plan(DEFAULT_DRAFT)
    assert background.plan_again_when_quiet(start, DEFAULT_DRAFT, said.append, lambda: next(watches)) is None  # clean


def test_a_clean_draft_plan_or_one_busy_too_often_is_not_made_again_on_the_page(home, monkeypatch):

    monkeypatch.setenv(tuning.TUNE_AT_START, "1")
    assert Background().plan_again_when_quiet(lambda steps: None, DEFAULT_DRAFT) is None  # no plan yet: the start's work makes it
    planned(machine_profile(), option(0, 0.94, 0.050))
    assert Background().plan_again_when_quiet(lambda steps: None, DEFAULT_DRAFT) is None
    for _ in range(choices.BUSY_PLANS):
        planned(machine_profile(), busy(option(0, 0.94, 0.050)))
    assert Background().plan_again_when_quiet(lambda steps: None, DEFAULT_DRAFT) is None  # kept, provisional
