"""What the page's buttons do, as generators of whole page updates. No gradio here: page.py binds these
to the components and turns SKIP into "leave this output as it is".

Every handler takes the Server (serve/server.py) first: the line, the engines shared by every visitor, the runs Stop
reaches, the background work and what a visitor's runs keep for their next (their drafters' memories, theirs alone).
Per-run state (events, timers) lives in the handler's local variables, so visitors never see each other's outputs.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Iterator

from specdemo.run import genai
from specdemo.results import metrics
from specdemo.models import sources
from specdemo.host import memory
from specdemo.learning.disk import inventory
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, RunSettings
from specdemo.serve import waiting
from specdemo.ui import charts, render
from specdemo.serve.downloads import save_run
from specdemo.serve.server import Server
from specdemo.serve.tuning import BackgroundWork
from specdemo.serve.visitors import Visitor
from specdemo.names import AUTOREGRESSIVE, GENAI, LANES, SPECULATIVE
from specdemo.results.lane import finished
from specdemo.results.record import Record
from specdemo.run.sidebyside import SideBySide
from specdemo.serve.engines import KEPT, Held, Loading, race_threads
from specdemo.serve.lanes import LaneRun, follow, start_lanes
from specdemo.serve.values import MAX_K, RACE, PageValues, as_sentence, check_prompt

SETTLE_S = 0.5  # the browser renders the run's first update before the lanes start, not while they run
SKIP = object()  # an output this update leaves as it is


@dataclass
class View:
    """One update of the page's outputs, in the order of the handlers' `outputs`."""

    status: object = SKIP
    ar_figures: object = SKIP
    ar_text: object = SKIP
    spec_figures: object = SKIP
    spec_text: object = SKIP
    genai_figures: object = SKIP
    genai_text: object = SKIP
    results: object = SKIP
    timeline: object = SKIP
    positions: object = SKIP
    would: object = SKIP
    surface: object = SKIP
    costs_note: object = SKIP
    download: object = SKIP  # the path of the finished run's JSON file (runfile.py), or None
    models: object = SKIP
    run: object = SKIP  # the id of the visitor's run, for their Stop to name (lanes.Runs.begin)

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


OUTPUTS = tuple(f.name for f in fields(View))


def wait_for_models(server: Server) -> Iterator[tuple]:
    """Page load: the preparation's progress in the status line, then the model panel, the cost chart and the cost
    surface, as (status, models, costs frame, costs note, surface). The status line is written by this handler alone
    (no progress overlay drawn over it), so two messages never sit on top of each other."""
    loading = server.engines.loading_for(KEPT, RunSettings(), True, refresh=False)  # a visitor's run may hold the machine now
    while not loading.done.wait(0.5):
        yield render.preparing_status(loading.fraction, loading.message), SKIP, SKIP, SKIP, SKIP
    if loading.error is not None:
        yield f"⚠️ The models could not be prepared: {as_sentence(loading.error)}", SKIP, SKIP, SKIP, SKIP
        return
    engine = loading.value
    ready = "Ready. Pick an example or type an instruction, then press **Generate**."
    background = server.background.current
    models = render.render_models(describe_model(engine.target, background), describe_model(engine.draft, background),
                                  disk_note=render.render_disk(inventory()))
    yield (ready, models, render.cost_frame(engine.costs), render.render_costs(engine.costs, engine.warm_up_s),
           charts.cost_surface(engine.costs, MAX_K))


def generate(server: Server, values: PageValues, visitor: Visitor) -> Iterator[View]:
    """Take a turn on the machine, run the lanes on one instruction and stream the page's outputs. While runs ahead
    hold the machine, the status says how many and for about how long. A refused run yields one View whose status
    starts with ⚠️ and raises nothing."""
    try:
        settings = values.check()
        ticket = server.line.join(settings.max_new_tokens, visitor)
    except ValueError as error:  # QueueFull too
        yield View(status=f"⚠️ {as_sentence(error)}")
        return
    run_id, cancel = server.runs.begin(visitor.session)  # from now on Stop reaches this run, waiting or running
    turn = Turn(server, values, settings, visitor, run_id, cancel, server.engines.held())
    try:
        views = turn.views(ticket)
        first = next(views, None)
        if first is not None:
            first.run = run_id  # the page's Stop names this run from now on
            yield first
        yield from views
    finally:
        turn.held.release()
        # A run that had its turn (the line started its clock) and was not stopped teaches the line its pace.
        server.line.leave(ticket, finished=ticket.started is not None and not cancel.is_set())
        server.runs.end(run_id)


LEFT_QUEUE_STATUS = "You left the queue; nothing was run."


@dataclass
class Turn:
    """One press of Generate, from its place in the line to its last update: what its steps share. One SideBySide owns
    the run itself (tokenized and planned once, taught, walked and recorded once), drafting from this visitor's own
    earlier answers alone; the Turn streams and renders it. The models it loads are `held` until it ends (none is
    released as idle meanwhile)."""

    server: Server
    values: PageValues  # as the page sent them
    settings: GenerationSettings  # the values, checked
    visitor: Visitor
    run_id: str  # told to this visitor's page alone, for their Stop and their download
    cancel: threading.Event  # set by Stop, or when the page goes away
    held: Held

    def views(self, ticket: waiting.Ticket) -> Iterator[View]:
        """Wait for this run's turn in the line, saying its place; then load, run and render it."""
        for ahead, seconds in self.server.line.wait(ticket, self.cancel):
            yield View(status=waiting.describe_place(ahead, seconds))
        if self.cancel.is_set():
            yield View(status=LEFT_QUEUE_STATUS)
            return
        try:
            run, jobs = yield from self._load()
        except (ValueError, sources.ModelSourceError, RuntimeError, memory.Short) as error:
            yield View(status=f"⚠️ {as_sentence(error)}")
            return
        # The lanes hold the machine: background work (a new machine's tune) is stopped meanwhile. Not while loading,
        # which may wait for a conversion that work holds the lock of.
        with self.server.background.machine_held():
            yield from self._run_lanes(run, jobs)

    def _load(self):
        """The run, prepared on the engines its lanes load, and each lane's job (GenAI's fails alone if it must); yields
        the loadings' progress meanwhile."""
        values, engines = self.values, self.server.engines
        reserve = self.server.background.reserve()  # what the background work may still need: optional models leave it
        loadings = engines.lane_loadings(values.mode, values.target_device, values.draft_device, values.configuration,
                                         reserve)
        loaded = yield from _wait_for({lane: self.held.add(loading) for lane, loading in loadings.items()})
        pair = engines.pair_settings(values.target_device, values.draft_device, values.configuration)
        run = SideBySide(loaded, values.instruction, replace(pair, generation=self.settings),
                         self.server.memories.of(self.visitor))
        check_prompt(run.prompt)
        run.prepare()  # the engines were warmed up when loaded: this plans the speculative lane
        jobs = {mode: (lambda cancel, mode=mode: run.lane(mode, cancel)) for mode in LANES}
        if values.genai:
            try:
                jobs[GENAI] = yield from self._genai_job(run, reserve)
            except (RuntimeError, sources.ModelSourceError, memory.Short) as error:  # ours run all the same
                jobs[GENAI] = _failed(error)
        return run, jobs

    def _genai_job(self, run: SideBySide, reserve: int):
        """GenAI's lane: its pipeline for the counterpart of the drafter and the K our speculative lane starts with (the
        run's plan), on the same prompt ids; admitted beside what the background work may still need (`reserve`)."""
        drafter, k = run.genai_counterpart()
        needs_draft = drafter.needs_model
        loading = self.server.engines.genai_loading_for(run.settings, not needs_draft, reserve)
        pipeline = (yield from _wait_for({GENAI: self.held.add(loading)}))[GENAI]
        compiled_as = genai.fitted(run.settings.target, run.settings.draft if needs_draft else None)
        engine, settings = run.speculative, self.settings
        return lambda cancel: genai.stream(pipeline, engine.tokenizer, run.prompt, settings, engine.eos_ids, k, cancel,
                                           drafter.name, compiled_as)

    def _run_lanes(self, run: SideBySide, jobs: dict) -> Iterator[View]:
        mode, settings, cancel = self.values.mode, self.settings, self.cancel
        lanes = {name: LaneRun() for name in jobs}
        first = live_view(lanes, mode, plot=True, whole=True)
        first.results = render.note("Running…")
        first.positions = charts.placeholder("Acceptance by draft position", "Drawn when the run ends.")
        first.would = charts.placeholder("What each K would have given on this answer", "Drawn when the run ends.")
        yield first
        time.sleep(SETTLE_S)
        inbox = queue.SimpleQueue()
        threads = start_lanes(jobs, mode, cancel, inbox)
        # Stop sets `cancel`: the workers end after their current step and the run ends normally, so the last update
        # is always the final view (a closed page instead closes the generator at a yield; generate's finally stops
        # the workers). While the lanes run, the updates carry new tokens and figures only: the timeline is drawn when
        # they are done.
        last_status = first.status
        for _ in follow(lanes, threads, inbox):
            view = live_view(lanes, mode, plot=False)
            if view.status == last_status:
                view.status = SKIP  # the same line again would only make the browser render it again
            last_status = view.status if view.status is not SKIP else last_status
            yield view
        stopped = cancel.is_set()
        results = {name: lanes[name].result() if lanes[name].summary is not None else None for name in LANES}
        if not stopped and settings.greedy and all(finished(r) for r in results.values()):
            yield View(status="Working out what each K would have given on this answer (one pass of the draft model)…")
        record = run.finish(results, stopped)
        view = final_view(lanes, mode, record, run.speculative, self.server.background.current)
        if record.finished:
            view.download = save_run(record, self.run_id, self.server.downloads)
        yield view


def _wait_for(loadings: dict[str, Loading]):
    """Wait for every loading, writing its progress in the status line; the loaded values by lane."""
    for loading in set(loadings.values()):
        while not loading.done.wait(0.25):
            yield View(status=render.preparing_status(loading.fraction, loading.message))
    return {lane: loading.wait() for lane, loading in loadings.items()}


def _failed(error: Exception):
    """A lane's job that fails at once with `error` (its lane shows the sentence)."""
    def job(cancel):
        raise error
        yield  # a generator, like every lane's job
    return job


def live_view(lanes: dict[str, LaneRun], mode: str, plot: bool, whole: bool = False) -> View:
    """The lanes' figures, their new tokens (all of them when `whole`), the timeline when `plot`. Only what changed is
    sent: a text box appends the tokens it receives (render.render_stream)."""
    now = time.perf_counter()
    view = View(status=running_status(lanes, mode))
    for name, lane in lanes.items():
        prefix = {AUTOREGRESSIVE: "ar", SPECULATIVE: "spec", GENAI: "genai"}[name]
        setattr(view, f"{prefix}_figures", render.render_lane_figures(lane, now))
        if lane.changed or whole:
            start = 0 if whole else lane.sent
            setattr(view, f"{prefix}_text", render.render_stream(lane.events[start:], start, reset=whole))
            lane.sent, lane.changed = len(lane.events), False
    if plot:
        view.timeline = charts.timeline(render.timeline_series(lanes), render.LANE_COLOURS)
    return view


def running_status(lanes: dict[str, LaneRun], mode: str) -> str:
    ours_done = all(lanes[name].done for name in LANES)
    if ours_done and GENAI in lanes:
        return "Running OpenVINO GenAI's speculative pipeline, third, with the whole machine."
    if mode == RACE:
        return f"Racing: both lanes run at once, each with {race_threads()} inference thread(s)."
    if not lanes[AUTOREGRESSIVE].done:
        return "Running the autoregressive lane; the speculative lane waits so each has the whole machine."
    return "Running the speculative lane; the autoregressive lane is done."


STOPPED_STATUS = "Stopped. The lanes show what was generated before Stop."


def final_view(lanes: dict[str, LaneRun], mode: str, record: Record, engine: Engine,
               background: BackgroundWork | None = None) -> View:
    """The last update: final texts and figures, the results (the run's Record rendered), the run's charts (what each K
    would have given, acceptance by position, the cost surface with the run's point), the cost note and the model panel
    with KV sizes (and where the `background` work stands)."""
    settings = record.settings.generation
    errors = [f"The {name} lane failed: {lane.error}" for name, lane in lanes.items() if lane.error]
    if errors:
        status = " ".join(errors)
    else:
        status = STOPPED_STATUS if record.stopped else f"Finished ({render.describe_mode(mode)}). Hover a token for its step."
    view = live_view(lanes, mode, plot=True, whole=True)
    view.status = ("⚠️ " if errors else "") + status
    view.results = render.render_results(record, mode, lanes.get(GENAI)) + render.render_failures(record.failures)
    spec = lanes[SPECULATIVE]
    s = spec.summary
    done = record.lanes_finished
    # The prior's chance that draft i is kept when drafted: drafts 1 … i all accepted (the bars' quantity).
    prior = [spec.plan.acceptance_prior.all_accepted(i) for i in range(1, settings.k_max + 1)] if spec.plan else None
    view.positions = charts.acceptance_by_position(s.acceptance_by_position if s else [], prior if done else None)
    speedup = metrics.measured_speedup(record.autoregressive.summary, s) if done else 0.0
    view.would = charts.would_have_given(record.would, s.mean_k if s else 0.0, speedup) if done else charts.placeholder(
        "What each K would have given on this answer", "The run did not finish.")
    drafted = done and s.rounds > 0
    view.surface = charts.cost_surface(engine.costs, settings.k_max, s.alpha_hat if drafted else None,
                                       s.mean_k if drafted else None,
                                       metrics.run_acceptance(spec.rounds, settings.k_max) if drafted else None)
    view.costs_note = render.render_costs(engine.costs, engine.warm_up_s)
    kv = s.kv_cache_bytes if s else {}
    view.models = render.render_models(describe_model(engine.target, background),
                                       describe_model(engine.draft, background) if engine.draft else None,
                                       engine.target.settings.num_threads, kv)
    return view


def describe_model(model, background: BackgroundWork | None = None) -> dict:
    """A model's facts for the panel; on a machine not tuned when it was compiled, where the `background` tune stands."""
    described = model.describe()
    if not described.get("tuned") and background is not None and background.tunes:
        described["tuned"] = background.describe()
    return described


def stop(server: Server, session: str, run_id: str) -> str | None:
    """Stop button: every lane of the visitor's run `run_id` stops after its current step (a run still waiting leaves
    the queue), and the run's own last update says so. The status line until then, or None if that run of this
    session is not going."""
    if not server.runs.cancel(session, run_id):
        return None
    return "Stopping after the current step…"
