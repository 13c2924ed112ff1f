"""One side-by-side run, owned here from the instruction to its record: the CLI (terminal.py), the page
(serve/turn.py, ui/handlers.py) and the benchmark (bench/harness.py) only stream and render what it gives them.

    run = SideBySide({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, instruction, settings)   # tokenized once
    run.prepare(log)                        # warm-up where a pair has no costs yet, then the one plan
    results = {mode: drain(run.lane(mode)) for mode in run.engines}   # or in threads, or one lane (the bench)
    record = run.finish(results)            # teach the profile, walk the counterfactual, judge: the run's Record

A run's life cycle, in this order and nowhere else: the prompt is tokenized once (with the stricter context of the
engines); every engine without this machine's costs is warmed up explicitly, before anything is timed; the plan is made
once and the speculative lane drafts by it (GenAI's lane takes its counterpart from it); the lanes run; then one rule
says whether a lane finished (it ended by itself: no error, no Stop), finished lanes teach the machine profile, a
finished greedy pair gets its counterfactual (which teaches the acceptance prior), its parting and failures judged,
and all of it goes into the run's Record (results/record.py), which the entry points render and the run file keeps.
"""

from __future__ import annotations

import threading
from typing import Iterator, Mapping

from specdemo.decoding import planner
from specdemo.decoding.drafters import Strategy, with_counterpart
from specdemo.host import load, machine
from specdemo.host.compat import compile_config
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.failures import where_drafts_fail
from specdemo.results.lane import Result, finished
from specdemo.results.parting import parting
from specdemo.results.record import Record
from specdemo.run.engine import Engine
from specdemo.settings import RunSettings
from specdemo.text import clean_instruction


class SideBySide:
    """One instruction through one or both lanes, on `engines` by lane (the page may give each lane its own engine:
    a race runs each on half the threads); `settings` as the engines were loaded with, generation included;
    `memories`: what the run's owner's earlier runs left the drafters that keep something (drafters.memories(): a
    visitor's own on the page; None: the run draws on itself alone)."""

    def __init__(self, engines: Mapping[str, Engine], instruction: str, settings: RunSettings,
                 memories: dict[str, object] | None = None):
        self.engines = dict(engines)
        self.memories = memories
        self.instruction = instruction
        self.settings = settings
        self.generation = settings.generation
        # Tokenized once (the engines share the target's tokenizer); an instruction too long for any lane's context is
        # refused here.
        first, *others = dict.fromkeys(self.engines.values())
        self.prompt = first.prompt_ids(instruction, self.generation)
        for engine in others:
            engine.check_room(self.prompt, self.generation)
        self.plan: planner.Plan | None = None
        self.watch: load.Ticks | None = None  # host.load.start() once prepared

    @property
    def speculative(self) -> Engine | None:
        return self.engines.get(SPECULATIVE)

    def prepare(self, log=lambda message: None, fresh: bool = False) -> None:
        """Warm up every engine that has no costs for this machine yet (or all, `fresh`), then plan the speculative
        lane once. Nothing of it is timed in any lane."""
        for engine in dict.fromkeys(self.engines.values()):
            if fresh or not engine.knows_costs(self.generation):
                engine.warm_up(self.generation.k_max, fresh=fresh, log=log)
        if self.speculative is not None:
            self.plan = self.speculative.plan_lane(self.instruction, self.generation)
        self.watch = load.start()  # the host's load while the lanes run: a busy run cannot show a measurement wrong

    def lane(self, mode: str, cancel: threading.Event | None = None) -> Iterator:
        """The events of one lane (a speculative lane's plan first), on the prompt tokenized once."""
        engine = self.engines[mode]
        if mode == AUTOREGRESSIVE:
            return engine.autoregressive_ids(self.prompt, self.generation, cancel)
        if self.plan is None:
            raise RuntimeError("prepare() the run before its speculative lane")
        return engine.speculative_ids(self.prompt, self.generation, self.plan, cancel, self.memories)

    def genai_counterpart(self) -> tuple[Strategy, int]:
        """The drafter (Strategy.counterpart) and K OpenVINO GenAI runs beside the speculative lane: GenAI keeps K
        fixed, so the plan's first K (Plan.first_k). RuntimeError where GenAI has nothing like the plan's drafter."""
        if self.plan is None:
            raise RuntimeError("prepare() the run before GenAI's lane")
        kind = self.plan.drafter.counterpart
        if not kind:
            raise RuntimeError(f"OpenVINO GenAI has nothing like {self.plan.drafter.label} to run beside it")
        return with_counterpart(kind), self.plan.first_k

    def teach(self, mode: str, result: Result | None) -> None:
        """Hand a lane's rounds to the machine profile (its cost curve; a finished sampled lane's acceptance)."""
        if result is not None and result.rounds:
            engine = self.engines[mode]
            busy = self.watch is not None and bool(load.judge(load.since(self.watch)))
            engine.profile.learn(engine.keys, self.generation, result.rounds, finished(result), busy)

    def finish(self, results: Mapping[str, Result | None], stopped: bool = False) -> Record:
        """Teach, walk and judge once the lanes let go of the engines (`results` by lane; None: the lane failed), and
        say all of it in the run's Record. `stopped`: Stop was pressed."""
        for mode, result in results.items():
            self.teach(mode, result)
        ar, spec = results.get(AUTOREGRESSIVE), results.get(SPECULATIVE)
        engine = self.speculative
        record = Record(clean_instruction(self.instruction), self.settings.configuration, self.settings,
                        {lane: results.get(lane) for lane in (AUTOREGRESSIVE, SPECULATIVE)}, stopped)
        if record.finished and self.generation.greedy:
            record.would = engine.would_have_given(self.prompt, self.generation, spec.ids, spec.rounds)
            if record.would is not None:
                engine.profile.learn_from_answer(engine.keys, record.would.evidence)
        # Judged once, here, for every renderer and the run file; a Stop pressed after both lanes ended still shows it.
        if finished(ar) and finished(spec) and self.generation.greedy:
            record.parting = parting(ar.tokens, spec.tokens, engine.noise)
        if record.finished:
            self._describe(record, engine)
        record.provisional = engine.provisional if engine is not None else ""
        return record

    def _describe(self, record: Record, engine: Engine) -> None:
        """What the run file keeps of a finished run beside its lanes: this machine, the models, what was measured and
        planned before the lanes ran, and where the drafts failed."""
        tokenizer = engine.tokenizer
        special = set(getattr(tokenizer, "all_special_ids", []))
        record.failures = where_drafts_fail(record.speculative.tokens,
                                            lambda ids: tokenizer.decode(ids, skip_special_tokens=False), special)
        record.machine = machine.describe().to_json()
        record.models = {role: {**model.describe().to_json(), "compile_properties": compile_config(model.settings, None)}
                         for role, model in (("target", engine.target), ("draft", engine.draft)) if model is not None}
        record.batching_noise = getattr(engine, "noise", None)
        record.warm_up_s = engine.warm_up_s
        record.costs = engine.costs
        plan = record.speculative.plan
        record.planned = plan.to_dict() if plan is not None else None
