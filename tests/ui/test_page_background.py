"""The line under the page's status: where the background work stands, read from its log as it grows (which step of
how many, within tune the setting searched and how many candidates are checked, a wait for memory), what it has done
and applied; sent to the browser only when it changes, and not at all where there is no work."""

import asyncio
import html
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from specdemo.serve import progress, tuning
from specdemo.serve.engines import KEPT, Engines
from specdemo.serve.server import Server
from specdemo.settings import RunSettings
from specdemo.ui import background, render


def work(log: Path, index: int = 2, state: str = "running", held: bool = False, finished=(), skipped=()):
    """A stand-in for tuning.BackgroundWork as the follower reads it."""
    steps = [("preparing the draft at int8, for the draft plan", []), (tuning.TUNING, []),
             ("preparing the fastest configuration's models", []), (tuning.configuration_tune("fastest"), [])]
    return SimpleNamespace(index=index, steps=steps, step=steps[index - 1][0], state=state, held=held,
                           finished=list(finished), skipped=list(skipped), log_path=log, started=0.0, seconds=120.0,
                           passed_over=[])


def serving(current=None, load=lambda: None) -> Server:
    """A server whose default pair has loaded (as what `load()` gives) and whose background work, settled, is
    `current`."""
    server = Server(engines=Engines(load_engine=lambda settings, with_draft: lambda report: load()))
    server.engines.loading_for(KEPT, RunSettings()).wait()
    server.background.start_if_needed(steps=[])  # settled: nothing started
    server.background.current = current
    return server


TUNE_LOG = """[  12 s] target: the reference (f32, no dynamic quantization), for fidelity
[  60 s] target: dynamic-quantization group size, 6 settings, each raced against group 32, f32, KV f32
[  90 s]   target group 32, f32, KV f32: keeps 100.0% of the reference's greedy choices
[ 120 s]   target group 0, f32, KV f32: keeps 100.0% of the reference's greedy choices
"""


def test_within_tune_the_line_names_the_setting_searched_and_how_many_candidates_are_checked(tmp_path):
    log = tmp_path / "background.log"
    log.write_text(TUNE_LOG)
    follower = progress.Follower()
    now = follower.read(work(log))
    assert (now.index, now.count, now.step) == (2, 4, tuning.TUNING)
    assert now.detail == "target: dynamic-quantization group size, 2 of 6 settings checked"
    with open(log, "a") as more:  # the log grows: only the new lines are read
        more.write("[ 130 s] memory: compiling the target at group 16, f32, KV f32 waits: it needs about 1.9 GiB")
        more.write(" and there is 1.2 GiB left\n")
    assert follower.read(work(log)).detail.endswith("2 of 6 settings checked; compiling the target at group 16, f32, "
                                                    "KV f32 waits: it needs about 1.9 GiB and there is 1.2 GiB left")


def test_a_conversions_stage_is_the_line_and_a_new_step_forgets_the_last_ones(tmp_path):
    log = tmp_path / "background.log"
    log.write_text(TUNE_LOG)
    follower = progress.Follower()
    follower.read(work(log, index=2))
    with open(log, "a") as more:
        more.write("[   9 s] qwen2.5-coder-1.5b: dequantizing the GGUF weights (12%, about 66 s left)\n")
    assert follower.read(work(log, index=3)).detail == "qwen2.5-coder-1.5b: dequantizing the GGUF weights (12%, about 66 s left)"


def test_the_line_says_the_step_how_far_what_is_done_and_applied_and_a_pause_for_a_visitor():
    now = progress.Progress(2, 4, tuning.TUNING, "target: KV-cache precision, 1 of 3 settings checked", "running", True,
                            ("preparing the draft at int8, for the draft plan",), (), 600.0)
    line = html.unescape(render.render_background(now, "the default target tuned at 17:20: 18% faster than the defaults"))
    assert "step 2 of 4 (10 min so far, at low priority): tuning this machine: target: KV-cache precision, 1 of 3" in line
    assert "Paused while a visitor's run holds the machine." in line
    assert "Done: preparing the draft at int8, for the draft plan." in line and "Applied: the default target tuned" in line
    assert render.render_background(None) == ""


def test_the_follower_sends_a_line_only_when_it_changes_and_ends_with_the_work(tmp_path, monkeypatch):
    log = tmp_path / "background.log"
    log.write_text(TUNE_LOG)
    states = iter([work(log), work(log), work(log, index=3), work(log, index=4, state="done")])
    current = SimpleNamespace(now=next(states))
    current.progress = lambda: progress.Follower().read(current.now)

    sleep = asyncio.sleep

    def advance(*args):
        current.now = next(states, current.now)
        return sleep(0)

    server = serving(current)
    monkeypatch.setattr(background.asyncio, "sleep", advance)

    async def lines():
        return [line async for line in background.follow(server)]

    sent = asyncio.run(lines())
    assert len(sent) == 3  # step 2 (twice the same: sent once), step 3, done
    assert "step 2 of 4" in sent[0] and "step 3 of 4" in sent[1] and "Background work done" in sent[2]


def test_no_background_work_sends_nothing():
    server = serving(current=None)

    async def lines():
        return [line async for line in background.follow(server)]

    assert asyncio.run(lines()) == []


def test_following_the_work_does_not_keep_the_engine_a_tune_replaces():
    """The follower runs as long as the background work: holding the pair's loading would keep its engine (2 GiB) alive
    after the tune's engine replaced it."""
    import gc
    import weakref

    class Engine:
        pass

    engine = Engine()
    handed = [engine]  # to the pair's loading, which alone holds it then
    server = serving(load=handed.pop)
    gone = weakref.ref(engine)

    async def freed_while_following() -> bool:
        follower = background.follow(server, poll_s=0.001)
        server.background.current = SimpleNamespace(progress=lambda: replaced())
        await follower.__anext__()  # the follower waits for the work's next change, still running
        gc.collect()
        return gone() is None

    def replaced():
        nonlocal engine
        engine = None
        server.engines.loadings.pop(KEPT)  # the tune's engine took the old one's place
        gc.collect()
        return progress.Progress(2, 4, tuning.TUNING, "", "running", False, (), (), 1.0)

    assert asyncio.run(freed_while_following())


def test_the_line_says_which_drafts_the_plan_did_not_measure_as_they_could_not_pay_here(home):
    from specdemo.learning import tune
    from specdemo.learning.draft_choice import price
    from specdemo.learning.profile import choices, machine_profile
    from specdemo.settings import DEFAULT_DRAFT
    from tests.learning.test_draft_choice import COMPUTE_BOUND, planned_on

    options, _ = planned_on(COMPUTE_BOUND)  # nothing could pay: nothing measured
    price(options, COMPUTE_BOUND)
    machine_profile().keep_tune([tune.Trial("draft", choices.DEFAULT, chosen=True)],
                                {"target": DEFAULT_DRAFT, "draft": DEFAULT_DRAFT}, options)
    done = progress.Progress(4, 4, tuning.configuration_tune("fastest"), "", "done", False, (tuning.TUNING,), (), 600.0)
    assert background.not_measured(done) == ("measuring any draft for the draft plan",)
    line = html.unescape(render.render_background(replace(done, passed_over=background.not_measured(done))))
    assert "Not run, as it could not pay here: measuring any draft for the draft plan." in line
