"""One press of Generate, served: its place in the line, the models it loads and their admission, the lanes' jobs, the
run, Stop, and its end, streamed as what happened (the small values below). It knows nothing of the page: ui/handlers.py
turns each value into the page's update.

A turn's values, in the order they come (`*` any number of times, `?` at most once):

    Refused                                                   the values or the line refused it: nothing else follows
    Admitted  Waiting*  LeftLine                              Stop while it waited: nothing was run
    Admitted  Waiting*  Preparing*  Refused                   it cannot go ahead (a model, memory, a prompt too long)
    Admitted  Waiting*  Preparing*  Running  Working*  Weighing?  Finished

Closing the stream (the page went away) ends the turn where it stands: its place in the line is given up, its loadings
are let go and its lanes stop after their current step. Page load waits for the kept pair the same way:
Preparing*, then Ready or Failed.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Iterator

from specdemo.host import memory
from specdemo.models import sources
from specdemo.names import GENAI, LANES
from specdemo.results.lane import finished
from specdemo.results.record import Record
from specdemo.run import genai
from specdemo.run.engine import Engine
from specdemo.run.sidebyside import SideBySide
from specdemo.settings import GenerationSettings, RunSettings
from specdemo.serve import waiting
from specdemo.serve.downloads import Download, download
from specdemo.serve.engines import KEPT, Held, Loading
from specdemo.serve.lanes import LaneRun, follow, start_lanes
from specdemo.serve.server import Server
from specdemo.serve.values import PageValues, as_sentence, check_prompt
from specdemo.serve.visitors import Visitor

SETTLE_S = 0.5  # the browser renders the run's first update before the lanes start, not while they run


@dataclass(frozen=True)
class Refused:
    """The run will not go ahead, and why, as a sentence for the visitor."""

    sentence: str


@dataclass(frozen=True)
class Admitted:
    """The run has its place in the line. Stop names it by `run_id` from now on (told to this visitor's page alone)."""

    run_id: str


@dataclass(frozen=True)
class Waiting:
    """Runs ahead of this one hold the machine."""

    ahead: int  # runs ahead, the running one included
    seconds: float  # about how long until this run's turn, at the line's recent pace
    page_work: str = ""  # what the page's own turn holding the machine does (RunQueue.page_work_ahead), or ""


@dataclass(frozen=True)
class LeftLine:
    """Stop while waiting: the run left the line, and nothing was run."""


@dataclass(frozen=True)
class Preparing:
    """A model this run (or the page) needs is being loaded."""

    fraction: float | None  # of a conversion done; None while compiling or warming up (no bar)
    message: str  # the stage, e.g. "loading and compiling the models"


@dataclass(frozen=True)
class Running:
    """The lanes are about to start, each with its LaneRun (by lane name). The same LaneRuns come in every Working and
    in Finished, as the workers have filled them by then."""

    lanes: dict[str, LaneRun]


@dataclass(frozen=True)
class Working:
    """The lanes' work so far, every lanes.UPDATE_INTERVAL_S while they run."""

    lanes: dict[str, LaneRun]


@dataclass(frozen=True)
class Weighing:
    """Every lane of a greedy run finished: one pass of the draft model now works out what each K would have given."""


@dataclass(frozen=True)
class Finished:
    """The run ended: by itself, by Stop, or with a lane failed (each lane's error is in its LaneRun)."""

    lanes: dict[str, LaneRun]
    record: Record  # what the run means (results/record.py)
    engine: Engine  # the speculative lane's: its models, costs and warm-up, for the panel and the cost surface
    download: Download | None  # the run for its page to save (downloads.download) if it finished; None if it was stopped or failed


@dataclass(frozen=True)
class Ready:
    """Page load: the kept pair is loaded."""

    engine: Engine


@dataclass(frozen=True)
class Failed:
    """Page load: the kept pair could not be prepared, and why, as a sentence."""

    sentence: str


Happening = Refused | Admitted | Waiting | LeftLine | Preparing | Running | Working | Weighing | Finished


def take(server: Server, values: PageValues, visitor: Visitor) -> Iterator[Happening]:
    """One press of Generate by `visitor`, from joining the line to the run's end (the module's docstring gives the
    order). A refusal is a value, never an exception; an error of ours while running is raised."""
    try:
        settings = values.check()
        ticket = server.line.join(settings.max_new_tokens, visitor)
    except ValueError as error:  # QueueFull too
        yield Refused(as_sentence(error))
        return
    run_id, cancel = server.runs.begin(visitor.session)  # from now on Stop reaches this run, waiting or running
    turn = Turn(server, values, settings, visitor, run_id, cancel, server.engines.held())
    try:
        yield Admitted(run_id)
        yield from turn.take(ticket)
    finally:  # also when the stream is closed at a yield: the page went away
        turn.held.release()
        # A run that had its turn (the line started its clock) and was not stopped teaches the line its pace.
        server.line.leave(ticket, finished=ticket.started is not None and not cancel.is_set())
        server.runs.end(run_id)  # sets `cancel`: the workers of a page that went away stop after their current step


@dataclass
class Turn:
    """One press of Generate, once admitted: what its steps share. One SideBySide owns the run itself (tokenized and
    planned once, taught, walked and recorded once), drafting from this visitor's own earlier answers alone; the Turn
    loads, runs and streams it. The models it loads are `held` until it ends (none is released as idle meanwhile)."""

    server: Server
    values: PageValues  # as the page sent them
    settings: GenerationSettings  # the values, checked
    visitor: Visitor
    run_id: str  # told to this visitor's page alone, for their Stop and their download
    cancel: threading.Event  # set by Stop, or when the page goes away
    held: Held

    def take(self, ticket: waiting.Ticket) -> Iterator[Happening]:
        """Wait for this run's turn in the line, saying its place; then load and run it."""
        for ahead, seconds in self.server.line.wait(ticket, self.cancel):
            yield Waiting(ahead, seconds, self.server.line.page_work_ahead(ticket))
        if self.cancel.is_set():
            yield LeftLine()
            return
        try:
            run, jobs = yield from self._load()
        except (ValueError, sources.ModelSourceError, RuntimeError, memory.Short) as error:
            yield Refused(as_sentence(error))
            return
        # The lanes hold the machine: background work (a new machine's tune) is stopped meanwhile. Not while loading,
        # which may wait for a conversion that work holds the lock of.
        with self.server.background.machine_held():
            yield from self._run(run, jobs)

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

    def _run(self, run: SideBySide, jobs: dict) -> Iterator[Happening]:
        """Run the lanes' jobs on their worker threads and say how they go. Stop sets `cancel`: the workers end after
        their current step and the run ends as usual, with Finished (a closed stream instead stops at a yield, and
        take's finally stops the workers)."""
        lanes = {name: LaneRun() for name in jobs}
        yield Running(lanes)
        time.sleep(SETTLE_S)
        inbox = queue.SimpleQueue()
        threads = start_lanes(jobs, self.values.mode, self.cancel, inbox)
        for _ in follow(lanes, threads, inbox):
            yield Working(lanes)
        yield from self._finish(run, lanes)

    def _finish(self, run: SideBySide, lanes: dict[str, LaneRun]) -> Iterator[Happening]:
        """The run's Record (a finished greedy run first weighs each K on its answer), and its download if it finished."""
        stopped = self.cancel.is_set()
        results = {name: lanes[name].result() if lanes[name].summary is not None else None for name in LANES}
        if not stopped and self.settings.greedy and all(finished(r) for r in results.values()):
            yield Weighing()
        record = run.finish(results, stopped)
        yield Finished(lanes, record, run.speculative, download(record, self.run_id) if record.finished else None)


def _wait_for(loadings: dict[str, Loading]):
    """Wait for every loading, saying its progress; the loaded values by lane."""
    for loading in set(loadings.values()):
        while not loading.done.wait(0.25):
            yield Preparing(loading.fraction, loading.message)
    return {lane: loading.wait() for lane, loading in loadings.items()}


def _failed(error: Exception):
    """A lane's job that fails at once with `error` (its lane shows the sentence)."""
    def job(cancel):
        raise error
        yield  # a generator, like every lane's job
    return job


def wait_for_models(server: Server) -> Iterator[Preparing | Ready | Failed]:
    """Page load: the kept pair's preparation as it goes (Preparing every half second), then Ready or Failed."""
    # Not refreshed: a visitor's run may hold the machine now.
    loading = server.engines.loading_for(KEPT, RunSettings(), True, refresh=False)
    while not loading.done.wait(0.5):
        yield Preparing(loading.fraction, loading.message)
    if loading.error is not None:
        yield Failed(as_sentence(loading.error))
    else:
        yield Ready(loading.value)
