"""The engines behind the page: loaded once per process, in the background, shared by every visitor.

A `Loading` is one engine being prepared on its own thread; any number of handlers wait on it and
show its progress. Per-run state never lives here, so visitors never see each other's outputs.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from typing import Callable

from specdemo import genai, machine, sources
from specdemo.engine import Engine
from specdemo.profile import machine_profile
from specdemo.runtime import release_weight_pages
from specdemo.settings import CONFIGURATIONS, GenerationSettings, RunSettings
from specdemo.ui.lanes import AUTOREGRESSIVE, GENAI, SPECULATIVE
from specdemo.ui.values import MAX_K, ONE_AFTER_ANOTHER

GENAI_WARM_UP_TOKENS = 8  # GenAI compiles its kernels on its first generate: done at load, never in a lane's time


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
        threading.Thread(target=self._load, args=(load,), daemon=True, name="specdemo-load").start()

    def _load(self, load: Callable) -> None:
        try:
            self.value = load(self.report)
        except Exception as error:  # raised again in every handler that waits for it
            self.error = error
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
    """`report` for the page, and one line per stage in the server's terminal. Each model's conversion reports
    fractions from 0 to 1, so a fraction lower than the last starts the next model's clock; a stage without a fraction
    (compiling, measuring) is one line with the time since loading began."""
    state = {"fraction": 1.0, "terminal": None, "start": time.perf_counter()}

    def both(fraction: float | None, message: str) -> None:
        report(fraction, message)
        if fraction is None:
            print(f"[{time.perf_counter() - state['start']:5.0f} s] {message}", file=sys.stderr, flush=True)
            return
        if fraction < state["fraction"] or state["terminal"] is None:
            state["terminal"] = sources.terminal_progress(message.split(":")[0])
        state["fraction"] = fraction
        state["terminal"](fraction, message)
    return both


def _load_engine(settings: RunSettings, with_draft: bool):
    def load(report) -> Engine:
        both = _also_in_the_terminal(report)
        engine = Engine.load(settings, progress=both, with_draft=with_draft)
        both(None, "warming up")
        engine.warm_up(MAX_K, log=lambda message: both(None, message))  # every K the page offers
        return engine
    return load


def _load_genai(settings: RunSettings, prompt_lookup: bool):
    def load(report):
        report(None, "loading OpenVINO GenAI's pipeline on the same model folders")
        target = sources.prepare(settings.target, report)
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


_LOADING: dict[str, Loading] = {}  # by role: "pair", "race-autoregressive", "race-speculative", "genai"
_LOADING_LOCK = threading.Lock()


def loading_for(role: str, settings: RunSettings, with_draft: bool = True, on_done: Callable | None = None,
                refresh: bool = True) -> Loading:
    """The (possibly finished) loading of the engine for `role`, started on first use. Other settings for a
    role replace its engine; a failed loading is tried again; and with `refresh`, one compiled before this machine's
    tune last changed is compiled again under the new choice (callers that hold the machine, a run in its turn, refresh;
    a page being loaded does not)."""
    key = (settings.target, settings.draft if with_draft else None)
    return _loading(role, key, lambda: _load_engine(settings, with_draft), on_done, refresh)


def genai_loading_for(settings: RunSettings, prompt_lookup: bool) -> Loading:
    """The loading of GenAI's speculative pipeline (draft model or prompt lookup) for the third lane."""
    return _loading(GENAI, (settings.target, settings.draft, prompt_lookup), lambda: _load_genai(settings, prompt_lookup))


APPLYING = "applying this machine's new tune: compiling the models again"


def _loading(role: str, key, make_load: Callable, on_done: Callable | None = None, refresh: bool = True) -> Loading:
    stamp = machine_profile().stamp()
    with _LOADING_LOCK:
        loading = _LOADING.get(role)
        stale = refresh and loading is not None and loading.error is None and loading.stamp != stamp
        if loading is None or loading.key != key or loading.error is not None or stale:
            # The engine it replaces goes when the last run holding it ends (runs take turns: none does now).
            loading = _LOADING[role] = Loading(key, make_load(), on_done, stamp, APPLYING if stale else "")
    return loading


def prepare(settings: RunSettings = RunSettings(), on_ready: Callable | None = None) -> None:
    """Start preparing the default pair now, so it is ready (or converting) before the first visitor; `on_ready(engine)`
    once it is."""
    loading_for("pair", settings, True, on_ready)


def race_threads() -> int:
    """Inference threads per lane in a race: half the cores this process may use."""
    return max(1, machine.usable_cores() // 2)


def lane_loadings(mode: str, target_device: str, draft_device: str, configuration: str = "faithful") -> dict[str, Loading]:
    """The loading of each lane's engine. One after another: one pair with every core. Race: one engine per
    lane, each compiled for half the cores, because an engine runs one generation at a time."""
    settings = device_settings(target_device, draft_device, configuration)
    if mode == ONE_AFTER_ANOTHER:
        pair = loading_for("pair", settings, True)
        return {AUTOREGRESSIVE: pair, SPECULATIVE: pair}
    threads = race_threads()
    half = RunSettings(replace(settings.target, num_threads=threads), replace(settings.draft, num_threads=threads))
    return {
        AUTOREGRESSIVE: loading_for("race-autoregressive", half, False),
        SPECULATIVE: loading_for("race-speculative", half, True),
    }


def device_settings(target_device: str, draft_device: str, configuration: str = "faithful") -> RunSettings:
    """The pair of `configuration` (settings.CONFIGURATIONS) on these devices."""
    target, draft = CONFIGURATIONS[configuration]
    return RunSettings(replace(target, device=target_device), replace(draft, device=draft_device))
