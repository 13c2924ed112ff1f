"""How lanes are measured: every way of generating (ours, GenAI's, transformers') becomes a Lane (table.py), and
`measure` runs a section's lanes the same way, each generation a row of the run's one table."""

from __future__ import annotations

import gc
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

from specdemo.bench import peers
from specdemo.bench.schema import GenAICompile
from specdemo.bench.settings import CODE_INSTRUCTIONS, BenchSettings
from specdemo.bench.table import Kind, Lane, Output, Run
from specdemo.decoding import drafters
from specdemo.decoding.drafters import Strategy, with_counterpart
from specdemo.learning.profile import machine_profile
from specdemo.models import kernels, sources
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.lane import drain
from specdemo.results.parting import parting
from specdemo.run import genai
from specdemo.run.genai import compile_properties
from specdemo.run.sidebyside import SideBySide
from specdemo.settings import AUTO, FAITHFUL, GenerationSettings, KPolicy, ModelSettings, RunSettings


def our_lane(label: str, engine, mode: Kind, generation: GenerationSettings, baseline: Lane | None = None,
             reference: Lane | None = None) -> Lane:
    """specdemo's autoregressive or speculative loop on `engine`, one lane of a side-by-side run (sidebyside.py:
    tokenized, warmed up and planned before the clock starts, taught after it stops), timed from its first event's
    request to its summary. The lane owns its drafters' memory: a strategy that keeps earlier answers draws on this
    lane's earlier instructions, as on the page it draws on one visitor's."""
    memories = drafters.memories()

    def generate(instruction: str, prompt_ids: list[int], n: int) -> Output:
        run = SideBySide({mode: engine}, instruction, RunSettings(engine.target.settings, engine.draft.settings
                                                                  if engine.draft else RunSettings().draft,
                                                                  replace(generation, max_new_tokens=n)), memories)
        run.prepare()
        start = time.perf_counter()
        result = drain(run.lane(mode))
        wall_s = time.perf_counter() - start
        run.teach(mode, result)
        summary = result.summary
        # The summary's clock starts inside the loop: what it counts before the first token, ours counts too.
        first_s = wall_s - (summary.wall_s - summary.ttft_s)
        return Output(result.ids, wall_s, first_s, summary, summary.proposed, summary.accepted, result.rounds,
                      result.tokens, engine.noise)

    pair = models_of(engine.target.settings, engine.draft.settings if engine.draft and mode == SPECULATIVE else None)
    if mode == AUTOREGRESSIVE:
        return Lane(label, "specdemo", mode, baseline, reference, models=pair, generate=generate)
    policy = generation.k_policy.rule
    k = None if generation.k_policy.is_auto else generation.k_policy.k
    return Lane(label, "specdemo", mode, baseline, reference, k, policy, generation.drafter, pair, generate)


def models_of(target: ModelSettings, draft: ModelSettings | None = None) -> str:
    """Lane.models of a lane on `target` (and `draft`)."""
    return " + ".join(f"{m.source} {m.precision}" for m in (target, draft) if m is not None)


def peer_lane(lane: Lane, generate: Callable, **options) -> Lane:
    """`lane` generating with a peer's generate(prompt_ids, max_new_tokens, **options) -> Output."""
    return replace(lane, generate=lambda instruction, prompt_ids, n: generate(prompt_ids, n, **options))


def measure(lanes: list[Lane], instructions: list[str], prompts: list[list[int]], n: int, bench: BenchSettings,
            log) -> list[Run]:
    """Warm every lane up, then run all lanes back to back on each instruction, `bench.repeats` times. A lane's
    reference must come before it in `lanes`: its output is checked against the reference's on the same instruction."""
    for lane in lanes:
        lane.generate(instructions[0], prompts[0], min(n, bench.warmup_tokens))
    runs = []
    total = bench.repeats * len(instructions)
    for r in range(bench.repeats):
        for i, (instruction, prompt) in enumerate(zip(instructions, prompts)):
            outputs: dict[Lane, Output] = {}
            line = []
            for lane in lanes:
                out = outputs[lane] = lane.generate(instruction, prompt, n)
                reference = outputs[lane.reference or lanes[0]]
                same = out.ids == reference.ids
                parted = None if same or not (out.tokens and reference.tokens) else parting(reference.tokens, out.tokens, out.noise)
                produced = len(out.ids) if out.produced is None else out.produced
                runs.append(Run(lane, i, r, n, out.wall_s, produced, out.first_s, same, out.summary, out.proposed,
                                out.accepted, parted, ids=out.ids, rounds=out.rounds))
                line.append(f"{lane.label} {out.wall_s:.2f}s" + (f" (parted at token {parted.index + 1}: {parted.verdict})"
                                                                  if parted else ""))
            log(f"  [{r * len(instructions) + i + 1}/{total}] N={n}: " + ", ".join(line))
    return runs


def log_progress(log, what: str):
    """A sources.Progress that logs each new message once."""
    seen = set()
    return lambda fraction, message: None if message in seen else seen.add(message) or log(f"  {what}: {message}")


GENAI_PIPELINES = 2  # GenAI pipelines kept loaded at once


@dataclass(frozen=True)
class PeerModel:
    """The weights a peer pipeline loads of one model (an OVModel's two fields of that name)."""

    settings: ModelSettings
    folder: object  # pathlib.Path of its IR


@dataclass
class Context:
    """What every section needs: the loaded default pair, the settings, and where to log."""

    engine: object  # specdemo.run.engine.Engine with the default pair
    settings: RunSettings
    bench: BenchSettings
    log: Callable[[str], None]
    # The K of fixed-K lanes and of GenAI's pipeline: the flag's K, or, when auto, the planner's first K for the first
    # code instruction, taken once when the bench starts (the acceptance prior moves as lanes run).
    k: int = KPolicy.k
    section: str = ""  # the section running now (bench.run sets it): the table's runs carry it
    machine: str = ""  # the CPU's name (bench.run sets it): the table's runs carry it
    runs: list[Run] = field(default_factory=list)  # the run's one table: every section's runs, kept by keep()
    genai: OrderedDict = field(default_factory=OrderedDict)  # GenAI pipelines by name, least recently used first
    _genai_models: dict = field(default_factory=dict)  # PeerModel by role, "target" and "draft"

    @property
    def generation(self) -> GenerationSettings:
        return self.settings.generation

    def keep(self, runs: list[Run], setting: str = "") -> list[Run]:
        """`runs` into the table, stamped with the section, the machine and the section's pass `setting` (Run.setting),
        bare (their lanes without generate, no ids nor rounds); returns `runs` as they were, for the section's own
        figures."""
        self.runs += [replace(r, lane=r.lane.bare(), section=self.section, machine=self.machine, setting=setting, ids=[],
                              rounds=[]) for r in runs]
        return runs

    def k_label(self, peers: bool = False) -> str:
        """How our lanes chose K in a section that runs the run's own settings ("auto K" or "K = 4")."""
        auto = self.generation.k_policy.is_auto
        ours = "auto K (the planner's choice each round)" if auto else f"K = {self.generation.k_policy.k}"
        return f"ours {ours}, GenAI K = {self.k}" if peers and auto else ours

    def fixed(self, k: int) -> GenerationSettings:
        return replace(self.generation, k_policy=KPolicy.fixed(k))

    @property
    def sweep_tokens(self) -> int:
        """N of the sweeps: the bench's, capped by --max-new-tokens."""
        return min(self.bench.sweep_tokens, self.generation.max_new_tokens)

    def code_instructions(self, count: int | None = None) -> list[str]:
        return CODE_INSTRUCTIONS[: count or self.bench.instructions]

    def target_settings(self) -> list[ModelSettings]:
        """The target at the run's precision, then at each other precision of the bench, each compiled as this
        machine's profile resolves it (its tune applied): what the fidelity and nodes sections compare."""
        precisions = dict.fromkeys((self.settings.target.precision, *kernels.runnable(self.bench.target_precisions)))
        return [machine_profile().resolve(replace(self.settings.target, precision=p)) for p in precisions]

    def prompts(self, instructions: list[str]) -> list[list[int]]:
        return [self.engine.prompt_ids(text, self.generation) for text in instructions]

    def genai_target(self) -> PeerModel:
        return self.genai_model("target", self.engine.target, FAITHFUL)

    def genai_draft(self) -> PeerModel:
        return self.genai_model("draft", self.engine.draft, AUTO)

    def genai_model(self, role: str, ours, left_open: str) -> PeerModel:
        """The engine's model `ours` as GenAI's pipelines load it: itself, or where it runs specdemo's kernels
        (kernels.ON_KERNELS, which GenAI's pipelines cannot load) what Profile.for_plugin gives the same model with its
        precision left open (`left_open`: a target's faithful layout, a draft's auto), prepared once (converted from
        the GGUF, with its progress, where it is not yet) and said in the log."""
        if role not in self._genai_models:
            if ours.settings.precision not in kernels.ON_KERNELS:
                self._genai_models[role] = PeerModel(ours.settings, ours.folder)
            else:
                profile = machine_profile()
                settings = profile.resolve(profile.for_plugin(replace(ours.settings, precision=left_open)))
                self.log(f"OpenVINO GenAI's pipelines run the {role} at {settings.precision}: they cannot load "
                         f"specdemo's kernels, which our lanes run ({ours.settings.precision})")
                self._genai_models[role] = PeerModel(settings, sources.prepare(settings))
        return self._genai_models[role]

    def genai_pipeline(self, name: str):
        """GenAI pipelines on our IR folders: "plain", "speculative", "lookup", and "... (defaults)". Each holds its own
        copy of the target (~3 GiB RSS here): at most GENAI_PIPELINES stay loaded, another drops the least recent."""
        if name in self.genai:
            self.genai.move_to_end(name)
        else:
            while len(self.genai) >= GENAI_PIPELINES:
                self.genai.popitem(last=False)
                gc.collect()
            drafting = peer_strategy(name)
            target = self.genai_target()
            draft = self.genai_draft() if drafting and drafting.needs_model else None
            properties, draft_properties = genai_properties(target, draft, defaults=name.endswith("(defaults)"))
            self.log(f"loading OpenVINO GenAI pipeline: {name}")
            make = partial(peers.GenAIPeer, draft=draft.folder if draft else None,
                           draft_device=draft.settings.device if draft else "",
                           prompt_lookup=drafting is not None and not drafting.needs_model,
                           draft_properties=draft_properties)
            self.genai[name] = peers.PeerProcess(make, target.folder, target.settings.device, properties)
        return self.genai[name]

    def drop_genai(self) -> None:
        """Free GenAI's pipelines (once no lane or run refers to them any more)."""
        self.genai.clear()
        gc.collect()

    def genai_lane(self, label: str, pipeline: str, baseline: Lane | None = None, k: int | None = None) -> Lane:
        """A lane on GenAI pipeline `pipeline` (see genai_pipeline); speculative ones need their `baseline`."""
        drafting = peer_strategy(pipeline)
        k = k or self.k
        target = self.genai_target().settings
        if drafting is None:
            lane = Lane(label, "genai", AUTOREGRESSIVE, models=models_of(target))
        else:
            draft = self.genai_draft().settings if drafting.needs_model else None
            lane = Lane(label, "genai", SPECULATIVE, baseline, k=k, k_policy="fixed", drafter=drafting.name,
                        models=models_of(target, draft))
        generate = self.genai_pipeline(pipeline).generate
        return peer_lane(lane, generate, eos_ids=self.engine.eos_ids, k=k, ngram=self.generation.lookup_ngram)


# GenAI's pipelines by the drafting of ours each mirrors (Strategy.counterpart): a draft model, prompt lookup, none
GENAI_DRAFTING = {"plain": "", SPECULATIVE: "draft", "lookup": "lookup"}


def peer_strategy(pipeline: str) -> Strategy | None:
    """The strategy GenAI pipeline `pipeline` ("speculative (defaults)", ...) drafts as, None where it does not draft."""
    counterpart = GENAI_DRAFTING[pipeline.split()[0]]
    return with_counterpart(counterpart) if counterpart else None


def genai_compile(target, draft) -> GenAICompile:
    """What GenAI's peers were compiled with, for the record."""
    properties, draft_properties = genai_properties(target, draft)
    shown = lambda props: {key: value for key, value in props.items() if key != "CACHE_DIR"}  # noqa: E731
    return GenAICompile(shown(properties), shown(draft_properties),
                        genai.fitted(target.settings, draft.settings if draft is not None else None))


def genai_properties(target, draft, defaults: bool = False) -> tuple[dict, dict]:
    """(target's, draft's) compile properties for a GenAI peer: ours, each model its own tuned ones; {} for GenAI's
    defaults."""
    if defaults:
        return {}, {}
    return compile_properties(target.settings), compile_properties(draft.settings) if draft is not None else {}
