"""The engines behind the page: loaded once per process, in the background, shared by every visitor.

A `Loading` is one engine being prepared on its own thread; any number of handlers wait on it and
show its progress. Per-run state never lives here, so visitors never see each other's outputs.

The default pair ("pair") is loaded at start and kept. Whatever else a visitor's choice loads (OpenVINO GenAI's
pipeline, a race's two engines, the fastest configuration's pair) lives inside the memory bound like the background
work (specdemo/host/memory.py): it is loaded only where it fits beside what the app holds and what the background work may
still need (else memory.Short with a sentence), only from models already prepared (a conversion never runs inside a
visitor's turn: ModelSourceError says it is being prepared), and released once it sat unused for IDLE_S.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from specdemo import errors
from specdemo.host import machine, memory
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.models.runtime import release_weight_pages
from specdemo.names import AUTOREGRESSIVE, GENAI, SPECULATIVE
from specdemo.run import genai
from specdemo.run.engine import Engine
from specdemo.settings import CONFIGURATIONS, ModelSettings, RunSettings
from specdemo.serve.values import MAX_K, ONE_AFTER_ANOTHER

GENAI_WARM_UP_TOKENS = 8  # GenAI compiles its kernels on its first generate: done at load, never in a lane's time
KEPT = "pair"  # the one role loaded at start and never released; every other role is a visitor's choice
IDLE_S = 180.0  # a visitor's optional models unused this long are released (the background work may need the room)
REAPER_S = 15.0  # how often idle models are looked for


class Loading:
    """Something slow being loaded on a background thread (an Engine or a GenAI pipeline), with its progress;
    `on_done(value)` is called once it has loaded."""

    def __init__(self, key, load: Callable, on_done: Callable | None = None, stamp: int = 0, message: str = ""):
        self.key = key
        self.stamp = stamp  # the machine's tune file as it stood when this loading began (Profile.stamp)
        self.on_done = on_done
        # Conversion reports fractions; compiling and warming up do not (None: no bar, just the message).
        self.fraction, self.message = None, message or "loading and compiling the models"
        self.value = None
        self.error: Exception | None = None
        self.done = threading.Event()
        self.users = 0  # runs holding it now (Held)
        self.last_used = time.monotonic()
        self.need = 0  # bytes its admission counted (an optional role), spoken for until it has loaded
        threading.Thread(target=self._load, args=(load,), daemon=True, name="specdemo-load").start()

    def _load(self, load: Callable) -> None:
        try:
            self.value = load(self.report)
        except Exception as error:  # raised again in every handler that waits for it; said in the server's log too
            self.error = error
            print(f"loading failed: {errors.describe(error)}", flush=True)
        finally:
            self.done.set()
        if self.error is None and self.on_done is not None:
            self.on_done(self.value)

    def report(self, fraction: float | None, message: str) -> None:
        self.fraction, self.message = fraction, message

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def _also_in_the_terminal(report: Callable) -> Callable:
    """`report` for the page, and one line per stage in the server's terminal, each with the time since loading began:
    a conversion's stages by model (the target and the draft may convert at once; each estimates what is left from
    its own start), a stage without a fraction (compiling, measuring) as it comes."""
    start, terminals = time.perf_counter(), {}

    def both(fraction: float | None, message: str) -> None:
        report(fraction, message)
        if fraction is None:
            print(f"[{time.perf_counter() - start:5.0f} s] {message}", file=sys.stderr, flush=True)
            return
        model = message.split(":")[0].lower().removesuffix("-instruct")  # the preset's name, then its source's
        if model not in terminals or fraction < terminals[model][0]:  # a fraction lower than the last: a new conversion
            terminals[model] = [fraction, sources.terminal_progress(model, clock=start)]
        terminals[model][0] = fraction
        terminals[model][1](fraction, message)
    return both


def load_engine(settings: RunSettings, with_draft: bool):
    def load(report) -> Engine:
        both = _also_in_the_terminal(report)
        engine = Engine.load(settings, progress=both, with_draft=with_draft)
        both(None, "warming up")
        # Every K the page offers; quick: what the first run needs, the rest learnt after the page is ready
        # (learning.learn_in_turns).
        engine.warm_up(MAX_K, log=lambda message: both(None, message), quick=True)
        return engine
    return load


def load_genai(settings: RunSettings, prompt_lookup: bool):
    def load(report):
        report(None, "loading OpenVINO GenAI's pipeline on the same model folders")
        target = sources.prepare(machine_profile().resolve_precision(settings.target), report)
        # The draft our lane runs: an auto precision is the draft plan's (GenAI keeps the full LM head).
        draft = None if prompt_lookup else sources.prepare(machine_profile().resolve_precision(settings.draft), report)
        properties = genai.compile_properties(settings.target)
        pipeline = genai.make_pipeline(target, settings.target.device, properties, draft, settings.draft.device, prompt_lookup,
                                       draft_properties=genai.compile_properties(settings.draft))
        report(None, "warming up OpenVINO GenAI's pipeline")
        pipeline.generate("Hello", max_new_tokens=GENAI_WARM_UP_TOKENS)
        release_weight_pages()  # as after our warm-up: the plugin works from its own copies of the weights
        return pipeline
    return load


APPLYING = "applying this machine's new tune: compiling the models again"


@dataclass(frozen=True)
class Admission:
    """What an optional role must pass before it loads: `models` prepared already (a conversion never runs in a
    visitor's turn), and their compiles fitting in the memory bound beside `reserve`, what the background work may still
    take, and the loadings still under way."""

    what: str  # for people: "OpenVINO GenAI's pipeline"
    models: list[ModelSettings]
    reserve: int = 0  # bytes

    @property
    def need(self) -> int:
        return sum(memory.compile_need(sources.weights_bytes(model)) for model in self.models)

    def check(self, pending: int) -> None:
        """ModelSourceError where a model is not prepared, memory.Short where memory does not allow them now; `pending`:
        bytes other loadings under way will take."""
        for model in self.models:
            if not sources.is_prepared(model):
                raise sources.ModelSourceError(
                    f"{self.what} needs {model.source} at {model.precision}, which is not prepared on this machine yet "
                    "(the background work prepares the models this machine can use after the first start; `python -m "
                    "specdemo prepare` does it by hand); try again later, or choose the default configuration")
        room, held = memory.room(), self.reserve + pending
        if room.left - held < self.need:
            also = f", and {memory.gib(held)} of it is spoken for by the background work" if held > 0 else ""
            raise memory.Short(f"{self.what} needs about {memory.gib(self.need)} of memory and there is "
                               f"{room.describe()}{also}; try again in a few minutes, or run without it")


class Engines:
    """The engines and pipelines this server loaded, by role ("pair", "race-autoregressive", "race-speculative",
    "genai", "pair-fastest"), and their admission: one Loading per role, replaced when its settings or the machine's
    tune change, an optional role released once idle. `load_engine(settings, with_draft)` and `load_genai(settings,
    prompt_lookup)` make a loading's work, and `configurations` are the pairs offered by name (a test hands in fakes
    and its own pair)."""

    def __init__(self, load_engine: Callable = load_engine, load_genai: Callable = load_genai,
                 configurations: dict[str, tuple[ModelSettings, ModelSettings]] = CONFIGURATIONS):
        self.load_engine, self.load_genai, self.configurations = load_engine, load_genai, configurations
        self.loadings: dict[str, Loading] = {}  # by role; read under `lock`
        self.lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    def loading_for(self, role: str, settings: RunSettings, with_draft: bool = True, on_done: Callable | None = None,
                    refresh: bool = True) -> Loading:
        """The (possibly finished) loading of the engine for `role`, started on first use. Other settings for a
        role replace its engine; a failed loading is tried again; and with `refresh`, one compiled before this machine's
        tune last changed is compiled again under the new choice (callers that hold the machine, a run in its turn,
        refresh; a page being loaded does not)."""
        key = (settings.target, settings.draft if with_draft else None)
        return self._loading(role, key, lambda: self.load_engine(settings, with_draft), on_done, refresh)

    def genai_loading_for(self, settings: RunSettings, prompt_lookup: bool, reserve: int = 0) -> Loading:
        """The loading of GenAI's speculative pipeline (draft model or prompt lookup) for the third lane, admitted like
        every optional role (`reserve`: bytes the background work may still need). A faithful target that runs
        specdemo's kernels here runs the plugin's fastest faithful layout in GenAI's pipeline, which cannot load them,
        and an auto draft that runs them (a first start's) its INT4 (Profile.for_plugin)."""
        profile = machine_profile()
        settings = replace(settings, target=profile.for_plugin(settings.target), draft=profile.for_plugin(settings.draft))
        models = [profile.resolve_precision(m)
                  for m in [settings.target] + ([] if prompt_lookup else [settings.draft])]
        return self._loading(GENAI, (settings.target, settings.draft, prompt_lookup),
                             lambda: self.load_genai(settings, prompt_lookup),
                             admission=Admission("OpenVINO GenAI's pipeline", models, reserve))

    def _loading(self, role: str, key, make_load: Callable, on_done: Callable | None = None, refresh: bool = True,
                 admission: Admission | None = None) -> Loading:
        """The role's loading, started anew where it has none, another key, an error or (with `refresh`) an older tune;
        an optional role's `admission` is checked first (it raises where a new loading must not start)."""
        stamp = machine_profile().stamp()
        with self.lock:
            loading = self.loadings.get(role)
            stale = refresh and loading is not None and loading.error is None and loading.stamp != stamp
            if loading is None or loading.key != key or loading.error is not None or stale:
                if admission is not None:
                    if loading is not None and loading.users == 0:  # the one it replaces goes first, and is not counted
                        self.loadings.pop(role)
                        _return_memory()
                    admission.check(sum(other.need for other in self.loadings.values() if not other.done.is_set()))
                # The engine it replaces goes when the last run holding it ends (runs take turns: none does now).
                loading = self.loadings[role] = Loading(key, make_load(), on_done, stamp, APPLYING if stale else "")
                loading.need = admission.need if admission is not None else 0
            loading.last_used = time.monotonic()
        return loading

    def release_idle(self, idle_s: float = IDLE_S) -> list[str]:
        """Release every optional role no run holds that was last used more than `idle_s` seconds ago; the roles
        released."""
        now = time.monotonic()
        with self.lock:
            idle = [role for role, loading in self.loadings.items() if role != KEPT and loading.users == 0
                    and loading.done.is_set() and now - loading.last_used > idle_s]
            for role in idle:
                del self.loadings[role]  # its engine goes once nothing refers to it
        if idle:
            _return_memory()
        return idle

    def held(self) -> "Held":
        """A run's hold on the loadings it adds: none of them is released as idle until it lets go."""
        return Held(self.lock)

    def prepare(self, settings: RunSettings = RunSettings(), on_ready: Callable | None = None) -> None:
        """Start preparing the default pair now, so it is ready (or converting) before the first visitor;
        `on_ready(engine)` once it is. Optional models visitors load are released from now on once idle."""
        self.loading_for(KEPT, settings, True, on_ready)
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, daemon=True, name="specdemo-release-idle")
            self._reaper.start()

    def _reap(self, period_s: float = REAPER_S) -> None:
        while True:
            time.sleep(period_s)
            self.release_idle()

    def lane_loadings(self, mode: str, target_device: str, draft_device: str, configuration: str = "faithful",
                      reserve: int = 0) -> dict[str, Loading]:
        """The loading of each lane's engine. One after another: one pair with every core (the default configuration's
        is the kept pair; another's is a role of its own, admitted). Race: one engine per lane, each compiled for half
        the cores, because an engine runs one generation at a time, both admitted. `reserve`: bytes the background
        work may still need (Admission)."""
        settings = self.pair_settings(target_device, draft_device, configuration)
        target, draft = map(machine_profile().resolve_precision, (settings.target, settings.draft))  # the weights
        if mode == ONE_AFTER_ANOTHER:
            if settings == self.pair_settings(target_device, draft_device):
                pair = self.loading_for(KEPT, settings, True)
            else:
                pair = self._optional(f"pair-{configuration}", settings, True,
                                      Admission(f"the {configuration} configuration", [target, draft], reserve))
            return {AUTOREGRESSIVE: pair, SPECULATIVE: pair}
        threads = race_threads()
        half = RunSettings(replace(settings.target, num_threads=threads), replace(settings.draft, num_threads=threads))
        return {AUTOREGRESSIVE: self._optional("race-autoregressive", half, False,
                                               Admission("a race's autoregressive engine", [target], reserve)),
                SPECULATIVE: self._optional("race-speculative", half, True,
                                            Admission("a race's speculative engine", [target, draft], reserve))}

    def pair_settings(self, target_device: str, draft_device: str, configuration: str = "faithful") -> RunSettings:
        """The pair of `configuration` on these devices."""
        target, draft = self.configurations[configuration]
        return RunSettings(replace(target, device=target_device), replace(draft, device=draft_device))

    def _optional(self, role: str, settings: RunSettings, with_draft: bool, admission: Admission) -> Loading:
        """loading_for an optional role: admitted before it loads, released once idle."""
        key = (settings.target, settings.draft if with_draft else None)
        return self._loading(role, key, lambda: self.load_engine(settings, with_draft), admission=admission)


def _return_memory() -> None:
    """Collect what the released engines held and hand glibc's free pages back to the system, so the bound sees it."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


class Held:
    """The loadings a run holds while it runs: none of them is released as idle meanwhile (`lock`: their Engines')."""

    def __init__(self, lock: threading.Lock):
        self.lock = lock
        self.loadings: list[Loading] = []

    def add(self, loading: Loading) -> Loading:
        with self.lock:
            loading.users += 1
            loading.last_used = time.monotonic()
        self.loadings.append(loading)
        return loading

    def release(self) -> None:
        with self.lock:
            for loading in self.loadings:
                loading.users -= 1
                loading.last_used = time.monotonic()
        self.loadings = []


def race_threads() -> int:
    """Inference threads per lane in a race: half the cores this process may use."""
    return max(1, machine.usable_cores() // 2)
