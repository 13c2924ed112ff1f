"""What the page's buttons do, as generators of whole page updates. No gradio here: page.py binds these
to the components and turns SKIP into "leave this output as it is".

What happens in a visitor's turn is served by serve/turn.py and said in small values (Waiting, Preparing, Running, …);
this module turns each into the page's update (a View, drawn by render.py and charts.py), and nothing else. Every
handler takes the Server (serve/server.py) first. Per-run state (the lanes' events, what was last sent) lives in the
handler's local variables, so visitors never see each other's outputs.
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass, fields
from typing import Iterator

from specdemo.learning.disk import inventory
from specdemo.names import AUTOREGRESSIVE, GENAI, LANES, SPECULATIVE
from specdemo.results import metrics
from specdemo.results.record import Record
from specdemo.run.engine import Engine
from specdemo.serve import turn, waiting
from specdemo.serve.engines import race_threads
from specdemo.serve.lanes import LaneRun
from specdemo.serve.server import Server
from specdemo.serve.tuning import BackgroundWork
from specdemo.serve.values import MAX_K, RACE, PageValues
from specdemo.serve.visitors import Visitor
from specdemo.ui import charts, render

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
    download: object = SKIP  # the download button, holding the finished run (render.render_download)
    models: object = SKIP
    run: object = SKIP  # the id of the visitor's run, for their Stop to name (lanes.Runs.begin)

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


OUTPUTS = tuple(f.name for f in fields(View))


def wait_for_models(server: Server) -> Iterator[tuple]:
    """Page load: the preparation's progress in the status line, then the model panel, the cost chart and the cost
    surface, as (status, models, costs frame, costs note, surface). The status line is written by this handler alone
    (no progress overlay drawn over it), so two messages never sit on top of each other."""
    for happening in turn.wait_for_models(server):
        match happening:
            case turn.Preparing(fraction, message):
                yield render.preparing_status(fraction, message), SKIP, SKIP, SKIP, SKIP
            case turn.Failed(sentence):
                yield f"⚠️ The models could not be prepared: {sentence}", SKIP, SKIP, SKIP, SKIP
            case turn.Ready(engine):
                yield show_ready(engine, server.background.current)


def show_ready(engine: Engine, background: BackgroundWork | None) -> tuple:
    """Page load's last update: the ready line, the model panel, the cost chart and note, the cost surface."""
    ready = "Ready. Pick an example or type an instruction, then press **Generate**."
    models = render.render_models(describe_model(engine.target, background), describe_model(engine.draft, background),
                                  disk_note=render.render_disk(inventory()))
    return (ready, models, render.cost_frame(engine.costs), render.render_costs(engine.costs, engine.warm_up_s),
            charts.cost_surface(engine.costs, MAX_K))


def generate(server: Server, values: PageValues, visitor: Visitor) -> Iterator[View]:
    """Generate: the visitor's turn (serve/turn.py) as the page's updates, one for each thing that happens but
    Admitted, whose run id rides on the next update (the page's Stop names the run from then on). While the lanes run,
    a status line the same as the last one is left as it is (sending it again would only make the browser render it
    again). A refused run is one View whose status starts with ⚠️. Closing this (the page went away) closes the turn:
    its finally gives up its place in the line and stops its lanes."""
    run_id, shown = SKIP, None
    with closing(turn.take(server, values, visitor)) as happenings:
        for happening in happenings:
            if isinstance(happening, turn.Admitted):
                run_id = happening.run_id
                continue
            view = show(happening, values.mode, server)
            view.run, run_id = run_id, SKIP
            status = view.status
            if isinstance(happening, turn.Working) and status == shown:
                view.status = SKIP
            shown = status
            yield view


LEFT_QUEUE_STATUS = "You left the queue; nothing was run."
WEIGHING_STATUS = "Working out what each K would have given on this answer (one pass of the draft model)…"


def show(happening, mode: str, server: Server) -> View:
    """The page's update for one thing that happened in a turn (all but Admitted)."""
    match happening:
        case turn.Refused(sentence):
            return View(status=f"⚠️ {sentence}")
        case turn.Waiting(ahead, seconds, page_work):
            return View(status=waiting.describe_place(ahead, seconds, page_work))
        case turn.LeftLine():
            return View(status=LEFT_QUEUE_STATUS)
        case turn.Preparing(fraction, message):
            return View(status=render.preparing_status(fraction, message))
        case turn.Running(lanes):
            return first_view(lanes, mode)
        case turn.Working(lanes):
            return live_view(lanes, mode, plot=False)
        case turn.Weighing():
            return View(status=WEIGHING_STATUS)
        case turn.Finished(lanes, record, engine, download):
            view = final_view(lanes, mode, record, engine, server.background.current)
            view.download = SKIP if download is None else render.render_download(download)
            return view
    raise TypeError(f"a turn does not say {happening!r}")


def first_view(lanes: dict[str, LaneRun], mode: str) -> View:
    """The lanes as they start: empty texts and figures, the timeline, and the charts drawn at the end."""
    view = live_view(lanes, mode, plot=True, whole=True)
    view.results = render.note("Running…")
    view.positions = charts.placeholder("Acceptance by draft position", "Drawn when the run ends.")
    view.would = charts.placeholder("What each K would have given on this answer", "Drawn when the run ends.")
    return view


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
    described = model.describe().to_json()
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
