"""The Gradio page: one instruction, an autoregressive and a speculative lane side by side, and
where the speedup comes from.

The engine yields events; this module renders them into whole component values and streams those
to the browser. The renderers (tokens to HTML, summaries to figures, events to plot frames) are
pure functions so tests can check them without a browser. This is the only module under specdemo/
that imports gradio.

Engines are loaded once per process and shared by every visitor; per-run state (events, timers)
lives in the handler's local variables, so visitors never see each other's outputs.
"""

from __future__ import annotations

import functools
import html
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr
import pandas as pd

from specdemo import sources
from specdemo.disk import size
from specdemo.engine import Engine
from specdemo.events import ACCEPTED, BONUS, CORRECTED, Summary, TokenEvent, measured_speedup
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET, GenerationSettings, RunSettings

AUTOREGRESSIVE, SPECULATIVE = "autoregressive", "speculative"
LANES = (AUTOREGRESSIVE, SPECULATIVE)
ONE_AFTER_ANOTHER, RACE = "one after another", "race"

# Server-side caps: the page's sliders say the same, but a visitor can call the API directly and
# must not hold the models for longer than this.
MAX_NEW_TOKENS_CAP = 1024
MAX_INSTRUCTION_CHARS = 20_000  # bounds the tokenizer's work, before the prompt is counted in tokens
MAX_PROMPT_TOKENS = 2048  # bounds the prefill: 2,048 tokens took 41 s on the target on 2 shared cores
MAX_K = 12  # draft length offered in the page; adaptive K may grow up to max(K, 8)

UPDATE_INTERVAL_S = 0.1  # the browser gets at most this many updates a second, however fast tokens come
PLOT_INTERVAL_S = 0.5  # redrawing a chart costs more than appending text

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_PATH = ASSETS / "examples.json"

# How the speculative lane names each provenance; each has a CSS class sd-<source> in assets/style.css
# (Okabe-Ito colours, readable with red-green colour blindness, plus an underline style per source).
PROVENANCE = {ACCEPTED: "accepted draft", CORRECTED: "corrected by target", BONUS: "bonus"}
LANE_COLOURS = {AUTOREGRESSIVE: "#7f7f7f", SPECULATIVE: "#0072B2"}  # the timeline chart's series
COST_COLOURS = {"this machine": "#0072B2", "n steps": "#D55E00", "1 step": "#009E73"}  # the cost chart's series


# ----------------------------------------------------------------------------- settings from the page


def generation_settings(
    max_new_tokens, k, adaptive, drafter, decoding, temperature, top_p, top_k, seed, k_auto=False
) -> GenerationSettings:
    """GenerationSettings from the page's values. Raises ValueError with a sentence for a user."""
    max_new_tokens = _whole(max_new_tokens)
    if isinstance(max_new_tokens, int) and max_new_tokens > MAX_NEW_TOKENS_CAP:
        raise ValueError(f"max new tokens is capped at {MAX_NEW_TOKENS_CAP:,} on this page, got {max_new_tokens:,}")
    k = _whole(k)
    sampling = decoding == "sampling"
    return GenerationSettings(
        max_new_tokens=max_new_tokens,
        temperature=temperature if sampling else 0.0,
        top_k=_whole(top_k) if sampling else 0,
        top_p=top_p if sampling else 1.0,
        seed=None if seed is None or seed == "" else _whole(seed),
        k=k,
        k_auto=bool(k_auto) and not adaptive,
        adaptive=bool(adaptive),
        drafter=drafter,
    )


def _whole(value):
    """Sliders and number boxes send 48.0 for 48; anything else passes on for the settings to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def check_instruction(instruction: str) -> None:
    """Refuse an instruction over the server-side cap (empty or too long for the context: the engine)."""
    if len(instruction or "") > MAX_INSTRUCTION_CHARS:
        raise ValueError(
            f"the instruction is {len(instruction):,} characters; this page accepts at most {MAX_INSTRUCTION_CHARS:,}"
        )


def check_prompt(ids: list[int]) -> None:
    """Refuse a prompt over the server-side token cap (the chat template's own tokens count too)."""
    if len(ids) > MAX_PROMPT_TOKENS:
        raise ValueError(f"the prompt is {len(ids):,} tokens; this page accepts at most {MAX_PROMPT_TOKENS:,}")


@functools.cache
def offered_devices() -> tuple[str, ...]:
    """The OpenVINO devices the page offers for each model."""
    import openvino as ov

    return tuple(ov.Core().available_devices)


def check_choices(mode, target_device: str, draft_device: str) -> None:
    """Refuse a run mode or device the page does not offer. The page's API passes None, or anything
    for a mode, through to the handler, and a new device would make every visitor wait while the
    models load again."""
    if mode not in (ONE_AFTER_ANOTHER, RACE):
        raise ValueError(f"the run mode must be {ONE_AFTER_ANOTHER!r} or {RACE!r}, got {mode!r}")
    for role, device in (("target", target_device), ("draft", draft_device)):
        if device not in offered_devices():
            raise ValueError(f"the {role} device must be one of {', '.join(offered_devices())}, got {device!r}")


def as_sentence(error: Exception) -> str:
    """Errors inside specdemo are lower-case clauses; the page shows them as sentences."""
    text = str(error).strip() or type(error).__name__
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def load_examples(path: Path = EXAMPLES_PATH) -> list[dict]:
    """The example instructions: [{"label", "instruction", "drafter"}]."""
    return json.loads(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- engines, once per process


class _Loading:
    """An engine being prepared in a background thread; any number of visitors wait on it and watch its progress."""

    def __init__(self, settings: RunSettings, with_draft: bool):
        self.key = _engine_key(settings, with_draft)
        # Conversion reports fractions; compiling and warming up do not (None: no bar, just the message).
        self.fraction, self.message = None, "loading and compiling the models"
        self.engine: Engine | None = None
        self.error: Exception | None = None
        self.done = threading.Event()
        threading.Thread(target=self._load, args=(settings, with_draft), daemon=True, name="specdemo-load").start()

    def _load(self, settings: RunSettings, with_draft: bool) -> None:
        try:
            engine = Engine.load(settings, progress=self._report, with_draft=with_draft)
            self._report(None, "warming up and measuring this machine's call costs (once per machine)")
            engine.warm_up(MAX_K)  # every K the page offers
            self.engine = engine
        except Exception as error:  # raised again in every handler that waits for this engine
            self.error = error
        finally:
            self.done.set()

    def _report(self, fraction: float | None, message: str) -> None:
        self.fraction, self.message = fraction, message

    def wait(self, report: Callable[[float | None, str], None]) -> Engine:
        while not self.done.wait(0.25):
            report(self.fraction, self.message)
        if self.error is not None:
            raise self.error
        return self.engine


_LOADING: dict[str, _Loading] = {}  # by role: "pair", "race-autoregressive", "race-speculative"
_LOADING_LOCK = threading.Lock()


def _engine_key(settings: RunSettings, with_draft: bool) -> tuple:
    return settings.target, settings.draft if with_draft else None


def loading_for(role: str, settings: RunSettings, with_draft: bool = True) -> _Loading:
    """The (possibly finished) loading of the engine for `role`, started on first use. Other settings for a
    role replace its engine."""
    with _LOADING_LOCK:
        loading = _LOADING.get(role)
        if loading is None or loading.key != _engine_key(settings, with_draft) or loading.error is not None:
            loading = _LOADING[role] = _Loading(settings, with_draft)
    return loading


def engine_for(role: str, settings: RunSettings, with_draft: bool = True, report=lambda fraction, message: None) -> Engine:
    """The engine for `role`, waiting for it to load (reporting progress) on first use."""
    return loading_for(role, settings, with_draft).wait(report)


def prepare(settings: RunSettings = RunSettings()) -> None:
    """Start preparing the default pair now, so it is ready (or converting) before the first visitor."""
    with _LOADING_LOCK:
        if "pair" not in _LOADING:
            _LOADING["pair"] = _Loading(settings, with_draft=True)


def race_threads() -> int:
    """Inference threads per lane in a race: half the cores this process may use."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


def lane_engines(mode: str, target_device: str, draft_device: str, report) -> dict[str, Engine]:
    """The engine each lane runs on. One after another: one pair with every core. Race: one engine per
    lane, each compiled for half the cores, because an engine runs one generation at a time."""
    settings = RunSettings(replace(DEFAULT_TARGET, device=target_device), replace(DEFAULT_DRAFT, device=draft_device))
    if mode == ONE_AFTER_ANOTHER:
        pair = engine_for("pair", settings, True, report)
        return {AUTOREGRESSIVE: pair, SPECULATIVE: pair}
    threads = race_threads()
    half = RunSettings(replace(settings.target, num_threads=threads), replace(settings.draft, num_threads=threads))
    return {
        AUTOREGRESSIVE: engine_for("race-autoregressive", half, False, report),
        SPECULATIVE: engine_for("race-speculative", half, True, report),
    }


# ----------------------------------------------------------------------------- running the lanes


_STARTED = object()  # a worker's marker: this lane's generation begins now


@dataclass
class LaneRun:
    """What one lane of one run has produced so far."""

    events: list[TokenEvent] = field(default_factory=list)
    summary: Summary | None = None
    started: float | None = None  # time.perf_counter() when the lane began, for the live timer
    error: str = ""
    changed: bool = False  # events arrived since the text was last rendered

    def take(self, item) -> None:
        if item is _STARTED:
            self.started = time.perf_counter()
        elif isinstance(item, TokenEvent):
            self.events.append(item)
            self.changed = True
        elif isinstance(item, Summary):
            self.summary = item
        else:
            self.error = as_sentence(item)

    @property
    def done(self) -> bool:
        return self.summary is not None or bool(self.error)

    def elapsed(self, now: float) -> float:
        if self.summary is not None:
            return self.summary.wall_s
        if self.started is None:
            return 0.0
        return max(now - self.started, self.events[-1].t if self.events else 0.0)



def start_lanes(engines: dict[str, Engine], instruction: str, settings: GenerationSettings, mode: str,
                cancel: threading.Event, inbox: queue.SimpleQueue) -> list[threading.Thread]:
    """Start the workers: one thread running both lanes in turn, or one thread per lane in a race."""
    jobs = [(AUTOREGRESSIVE, engines[AUTOREGRESSIVE].autoregressive), (SPECULATIVE, engines[SPECULATIVE].speculative)]
    groups = [jobs] if mode == ONE_AFTER_ANOTHER else [[job] for job in jobs]
    threads = [
        threading.Thread(target=_work, args=(group, instruction, settings, cancel, inbox), daemon=True, name=f"specdemo-{mode}")
        for group in groups
    ]
    for thread in threads:
        thread.start()
    return threads


def _work(jobs, instruction: str, settings: GenerationSettings, cancel: threading.Event, inbox: queue.SimpleQueue) -> None:
    # Each engine generator is run to its end here, even after the page has gone away: that is what
    # releases the engine's lock. `cancel` makes that end come after the current step.
    for lane, run in jobs:
        if cancel.is_set():
            return
        inbox.put((lane, _STARTED))
        try:
            for event in run(instruction, settings, cancel):
                inbox.put((lane, event))
        except Exception as error:  # shown in the page as a sentence; the other lane carries on
            inbox.put((lane, error))


def follow(lanes: dict[str, LaneRun], threads: list[threading.Thread], inbox: queue.SimpleQueue) -> Iterator[None]:
    """Apply the workers' events to `lanes`; yield every UPDATE_INTERVAL_S until the workers are done."""
    deadline = time.perf_counter() + UPDATE_INTERVAL_S
    while True:
        finished = not any(thread.is_alive() for thread in threads)
        try:
            lane, item = inbox.get(timeout=max(0.0, deadline - time.perf_counter()))
            lanes[lane].take(item)
        except queue.Empty:
            if finished:
                return
        if time.perf_counter() >= deadline:
            yield
            deadline = time.perf_counter() + UPDATE_INTERVAL_S


_RUNS: dict[str, threading.Event] = {}  # the cancel Event of each visitor's current run, by session
_RUNS_LOCK = threading.Lock()


def _begin_run(session: str) -> threading.Event:
    cancel = threading.Event()
    with _RUNS_LOCK:
        _RUNS[session] = cancel
    return cancel


def _end_run(session: str, cancel: threading.Event) -> None:
    cancel.set()  # stops the workers if the page went away mid-run
    with _RUNS_LOCK:
        if _RUNS.get(session) is cancel:
            del _RUNS[session]


def cancel_run(session: str) -> bool:
    """Ask this visitor's run to stop after the current step. False if nothing was running."""
    with _RUNS_LOCK:
        cancel = _RUNS.get(session)
    if cancel is None:
        return False
    cancel.set()
    return True


# ----------------------------------------------------------------------------- rendering (pure)


def _escape(text: str) -> str:
    # gr.HTML runs its value through a template engine: braces and dollars become entities so model
    # output such as f"{x}" or `${y}` shows literally.
    return html.escape(text, quote=True).replace("{", "&#123;").replace("}", "&#125;").replace("$", "&#36;")


def token_title(event: TokenEvent) -> str:
    """The hover text of one token: its step, its provenance and, when sampling, p_target and p_draft."""
    parts = [f"step {event.step}", PROVENANCE.get(event.source, "target")]
    if event.p_target is not None:
        parts.append(f"p_target {event.p_target:.3f}")
    if event.p_draft is not None:
        parts.append(f"p_draft {event.p_draft:.3f}")
    return " · ".join(parts)


def render_tokens(events: list[TokenEvent]) -> str:
    """A lane's text as HTML: one span per token, coloured by provenance, with rejected drafts struck
    through where the target rejected them (the CSS class sd-rejected; the page can hide them)."""
    parts = []
    for event in events:
        if event.rejected_text:
            title = f"step {event.step} · {len(event.rejected)} draft token(s) rejected"
            parts.append(f'<del class="sd-rejected" title="{_escape(title)}">{_escape(event.rejected_text)}</del>')
        if event.text:
            parts.append(f'<span class="sd-tok sd-{event.source}" title="{_escape(token_title(event))}">{_escape(event.text)}</span>')
    return f'<div class="sd-text">{"".join(parts)}</div>'


def _tiles(tiles: list[tuple[str, str]], extra_class: str = "") -> str:
    cells = "".join(
        f'<div class="sd-tile"><div class="sd-value">{_escape(value)}</div><div class="sd-label">{_escape(label)}</div></div>'
        for label, value in tiles
    )
    return f'<div class="sd-tiles {extra_class}">{cells}</div>'


def render_lane_figures(lane: LaneRun, now: float) -> str:
    """Elapsed time, tokens, tokens/s and time to first token of one lane, live or final."""
    elapsed = lane.elapsed(now)
    tokens = len(lane.events)
    if lane.summary is not None:
        rate, ttft = lane.summary.tokens_per_s, lane.summary.ttft_s
    else:
        rate = tokens / elapsed if elapsed > 0 else 0.0
        ttft = lane.events[0].t if lane.events else None
    return _tiles([
        ("elapsed", f"{elapsed:.1f} s"),
        ("tokens", f"{tokens}"),
        ("tokens/s", f"{rate:.1f}" if tokens else "–"),
        ("first token", f"{ttft:.2f} s" if ttft is not None else "–"),
    ])


def describe_mode(mode: str) -> str:
    if mode == RACE:
        return f"race: both lanes at once, each with {race_threads()} inference thread(s)"
    return "one after another: each lane had the whole machine"


STOPPED_NOTE = "Stopped before both lanes finished: no speedup figures for this run."


def render_results(ar: LaneRun, spec: LaneRun, mode: str, settings: GenerationSettings) -> str:
    """The headline figures once both lanes are done: measured against expected speedup, acceptance,
    tokens per target call and target calls saved, and which run mode produced them."""
    a, s = ar.summary, spec.summary
    if a is None or s is None or "cancelled" in (a.stop_reason, s.stop_reason):
        return _note(STOPPED_NOTE)
    saved = a.target_calls - s.target_calls
    tiles = _tiles([
        ("speedup, measured", f"{measured_speedup(a, s):.2f}×"),
        ("predicted for this machine", f"{s.predicted_speedup:.2f}×" if s.predicted_speedup else "–"),
        ("acceptance α̂", f"{s.alpha:.2f}" if s.rounds else "–"),
        ("tokens per target call", f"{s.tokens_per_call:.2f}"),
        ("target calls saved", f"{saved} of {a.target_calls}"),
    ], "sd-results")
    drafter = "prompt lookup" if (s.drafter or settings.drafter) == "prompt-lookup" else "draft model"
    if settings.k_auto:
        k = f"K chosen by the planner (mean {s.mean_k:.1f})"
    else:
        k = f"K adaptive (mean {s.mean_k:.1f})" if settings.adaptive else f"K = {settings.k}"
    lines = [
        f"<b>Measured {_escape(describe_mode(mode))}.</b> Speedup = speculative tokens/s ÷ autoregressive tokens/s "
        f"({s.tokens_per_s:.1f} ÷ {a.tokens_per_s:.1f}); {drafter}, {k}.",
        _escape(s.plan) if s.plan else "",
        f"Predicted from this machine's measured call costs with α̂ = {s.alpha:.2f} (accepted ÷ (accepted + rounds "
        f"that ended in a rejection)), mean K = {s.mean_k:.1f}, {a.tokens} tokens and the prompt's prefill. "
        f"Leviathan et al.'s eq. 1, which prices a verify call at one step, would say {s.expected_speedup:.2f}×; "
        f"draft acceptance rate (accepted ÷ proposed) {s.draft_acceptance_rate:.0%}.",
        f"Speculative time: target {s.target_s:.2f} s (a verify call {s.target_step_s * 1e3:.0f} ms, an autoregressive "
        f"step {a.target_step_s * 1e3:.0f} ms), drafting {s.draft_s:.2f} s, KV cache rollback {s.rollback_s:.3f} s.",
        _compare_outputs(ar.events, spec.events, settings, a, s),
    ]
    notes = "".join(f"<p>{line}</p>" for line in lines if line)
    return f'{tiles}<div class="sd-notes">{notes}</div>'


def _compare_outputs(ar: list[TokenEvent], spec: list[TokenEvent], settings: GenerationSettings, a: Summary, s: Summary) -> str:
    ar_ids, spec_ids = [e.id for e in ar], [e.id for e in spec]
    if not settings.greedy:
        return "Sampling: the two lanes draw different samples from the same distribution, so their texts differ."
    if ar_ids == spec_ids:
        return f"Both lanes produced the same {len(ar_ids)} tokens: speculation changed the speed, not the text."
    first = next((i for i, (x, y) in enumerate(zip(ar_ids, spec_ids)) if x != y), min(len(ar_ids), len(spec_ids)))
    return (f"The texts part at token {first + 1}: at a near-tie the batched and single-token kernels can order two "
            f"almost equal logits differently (near-ties: {a.near_ties} autoregressive, {s.near_ties} speculative).")


def _note(text: str) -> str:
    return f'<div class="sd-notes"><p>{_escape(text)}</p></div>'


def timeline_frame(lanes: dict[str, LaneRun]) -> pd.DataFrame:
    """Tokens generated against seconds since each lane began, one series per lane, from (0, 0)."""
    # Every lane starts at (0, 0) even before it runs: the chart fixes its series from the first
    # data it sees, so both must be there from the start.
    rows = []
    for name in LANES:
        rows.append((0.0, 0, name))
        events = lanes[name].events if name in lanes else []
        rows.extend((event.t, i + 1, name) for i, event in enumerate(events))
    # Explicit types: an empty frame would otherwise make the chart treat the axes as categories.
    return pd.DataFrame(rows, columns=["seconds", "tokens", "lane"]).astype({"seconds": float, "tokens": int, "lane": str})


def cost_frame(costs) -> pd.DataFrame:
    """The cost of scoring n tokens in one target call, in single steps, beside the two extremes."""
    # Every series is there from the first frame (the chart fixes its series then): before the machine is
    # measured, "this machine" is the one point every curve shares, (1, 1).
    n_max = costs.n_max if costs is not None else 13
    rows = [(n, costs.verify_steps(n) if costs is not None else 1.0, "this machine") for n in range(1, n_max + 1)
            if costs is not None or n == 1]
    for n in range(1, n_max + 1):
        rows.append((n, float(n), "n steps"))  # no gain from batching: speculation cannot pay
        rows.append((n, 1.0, "1 step"))  # free verification: Leviathan's assumption
    frame = pd.DataFrame(rows, columns=["tokens scored at once", "cost in single steps", "curve"])
    return frame.astype({"tokens scored at once": int, "cost in single steps": float, "curve": str})


def render_costs(costs, warm_up_s: float) -> str:
    """The sentence under the cost chart: what the curve means for speculation here."""
    if costs is None:
        return _note("The cost of each call is measured once this machine has warmed up.")
    source = f"measured in {costs.seconds:.1f} s" if costs.seconds else "from the cache of an earlier measurement"
    return _note(f"{costs.sentence()} One target step is {costs.t(1) * 1e3:.0f} ms on {costs.cpu} ({source}; "
                 f"warm-up {warm_up_s:.1f} s, never counted in a lane's time). Near the orange line (n steps) "
                 "speculation cannot pay; the green line (1 step) is what Leviathan et al.'s formula assumes.")


def histogram_frame(summary: Summary | None) -> pd.DataFrame:
    """Speculative rounds by how many of their draft tokens the target accepted."""
    counts = summary.accepted_histogram if summary is not None else []
    frame = pd.DataFrame({"accepted draft tokens": [str(n) for n in range(len(counts))], "rounds": counts})
    return frame.astype({"accepted draft tokens": str, "rounds": int})


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


MODEL_ROWS = ("model", "parameters", "weights", "size on disk", "KV cache", "device", "inference threads", "layers · context")


def _model_cells(facts: dict | None, kv_cache_bytes: int | None, threads: int) -> list[str]:
    """One column of the model panel, in MODEL_ROWS order, from LoadedModel.describe()."""
    if facts is None:
        return ["–"] * len(MODEL_ROWS)
    kv_size = size(kv_cache_bytes) if kv_cache_bytes is not None else "– until a run"
    return [
        facts["name"],
        _count(facts["parameters"]),
        facts["precision"].upper(),
        size(facts["size_on_disk_bytes"]),
        f'{facts["kv_cache_precision"]}, {kv_size}',
        facts["device"],
        str(threads) if threads else "all cores",
        f'{facts["layers"]} · {facts["context_length"]:,} tokens',
    ]


def render_disk(items) -> str:
    """One line under the model panel: how much specdemo keeps on disk, and the command that lists it."""
    total = sum(item.bytes for item in items)
    by_kind = {}
    for item in items:
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.bytes
    parts = ", ".join(f"{kind.replace('-', ' ')} {size(n)}" for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    return (f'<p class="sd-disk">On disk: {_escape(size(total))} ({_escape(parts)}). '
            "<code>python -m specdemo clean</code> lists it and removes what can go.</p>")


def render_models(target: dict, draft: dict | None, threads: int = 0, kv_cache_bytes: dict | None = None,
                  disk_note: str = "") -> str:
    """The model panel: target and draft side by side, with KV cache sizes once a run has filled them."""
    kv = kv_cache_bytes or {}
    columns = [_model_cells(target, kv.get("target"), threads), _model_cells(draft, kv.get("draft"), threads)]
    body = "".join(
        f"<tr><th>{label}</th>" + "".join(f"<td>{_escape(column[i])}</td>" for column in columns) + "</tr>"
        for i, label in enumerate(MODEL_ROWS)
    )
    table = f'<table class="sd-models"><thead><tr><th></th><th>target</th><th>draft</th></tr></thead><tbody>{body}</tbody></table>'
    return table + disk_note


def render_legend() -> str:
    swatches = "".join(f'<span class="sd-tok sd-{source}">{label}</span>' for source, label in PROVENANCE.items())
    return (f'<div class="sd-legend">{swatches}<del class="sd-rejected">rejected draft</del>'
            '<span class="sd-hint">hover a token for its step and probabilities</span>'
            '<label class="sd-toggle"><input type="checkbox" checked> show rejected drafts</label></div>')


# ----------------------------------------------------------------------------- the handlers


@dataclass
class View:
    """One update of the page's outputs, in the order of the handlers' `outputs`; gr.skip() leaves one as it is."""

    status: object = field(default_factory=gr.skip)
    ar_figures: object = field(default_factory=gr.skip)
    ar_text: object = field(default_factory=gr.skip)
    spec_figures: object = field(default_factory=gr.skip)
    spec_text: object = field(default_factory=gr.skip)
    results: object = field(default_factory=gr.skip)
    timeline: object = field(default_factory=gr.skip)
    histogram: object = field(default_factory=gr.skip)
    models: object = field(default_factory=gr.skip)

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


def _progress_reporter(progress: gr.Progress):
    def report(fraction: float | None, message: str) -> None:
        progress(fraction, desc=f"Preparing the models: {message}")
    return report


def preparing_status(fraction: float | None, message: str) -> str:
    """The status line while the default pair is prepared: the stage, how far, and what to expect."""
    done = f" ({fraction:.0%})" if fraction is not None else ""
    return (f"**Preparing the models:** {message}{done}. The first start converts them once (about 6 minutes on a "
            "2-core AMX Xeon, 10 on an AVX2-only one); later starts take seconds.")


def wait_for_models():
    """Page load: the preparation's progress in the status line, then the model panel and the cost chart.

    The status line is written by this handler alone (no progress overlay drawn over it), so two
    messages never sit on top of each other.
    """
    from specdemo import disk

    loading = loading_for("pair", RunSettings(), True)
    while not loading.done.wait(0.5):
        yield preparing_status(loading.fraction, loading.message), gr.skip(), gr.skip(), gr.skip()
    if loading.error is not None:
        yield f"⚠️ The models could not be prepared: {as_sentence(loading.error)}", gr.skip(), gr.skip(), gr.skip()
        return
    engine = loading.engine
    ready = "Ready. Pick an example or type an instruction, then press **Generate**."
    models = render_models(engine.target.describe(), engine.draft.describe(), disk_note=render_disk(disk.inventory()))
    yield ready, models, cost_frame(engine.costs), render_costs(engine.costs, engine.warm_up_s)


# The page's values generate() takes, in its parameter order.
GENERATE_INPUTS = ("instruction", "max_new_tokens", "k", "k_auto", "adaptive", "drafter", "decoding", "temperature", "top_p",
                   "top_k", "seed", "target_device", "draft_device", "mode")


def generate(instruction, max_new_tokens, k, k_auto, adaptive, drafter, decoding, temperature, top_p, top_k, seed,
             target_device, draft_device, mode, request: gr.Request, progress=gr.Progress()):
    """Run both lanes on one instruction and stream the page's outputs."""
    try:
        settings = generation_settings(max_new_tokens, k, adaptive, drafter, decoding, temperature, top_p, top_k, seed,
                                       k_auto)
        check_instruction(instruction)
        check_choices(mode, target_device, draft_device)
        engines = lane_engines(mode, target_device, draft_device, _progress_reporter(progress))
        check_prompt(engines[SPECULATIVE].prompt_ids(instruction, settings))  # the stricter context of the two
    except (ValueError, sources.ModelSourceError, RuntimeError) as error:
        gr.Warning(as_sentence(error))
        yield View(status=f"⚠️ {as_sentence(error)}").values()
        return

    lanes = {name: LaneRun() for name in LANES}
    cancel = _begin_run(request.session_hash)
    inbox = queue.SimpleQueue()
    threads = start_lanes(engines, instruction, settings, mode, cancel, inbox)
    try:  # Stop (or a closed page) closes this generator at a yield; the finally stops the workers
        first = _live_view(lanes, mode, plot=True, whole=True)
        first.results, first.histogram = _note("Running…"), None
        yield first.values()
        last_plot = time.perf_counter()
        for _ in follow(lanes, threads, inbox):
            plot = time.perf_counter() - last_plot >= PLOT_INTERVAL_S
            last_plot = time.perf_counter() if plot else last_plot
            yield _live_view(lanes, mode, plot).values()
    finally:
        _end_run(request.session_hash, cancel)
    yield _final_view(lanes, mode, settings, engines).values()


def _live_view(lanes: dict[str, LaneRun], mode: str, plot: bool, whole: bool = False) -> View:
    """The lanes' figures, their texts when new tokens came (or `whole`), the chart when `plot`."""
    now = time.perf_counter()
    ar, spec = lanes[AUTOREGRESSIVE], lanes[SPECULATIVE]
    view = View(
        status=_running_status(lanes, mode),
        ar_figures=render_lane_figures(ar, now),
        spec_figures=render_lane_figures(spec, now),
    )
    for lane, attr in ((ar, "ar_text"), (spec, "spec_text")):
        if lane.changed or whole:
            setattr(view, attr, render_tokens(lane.events))
            lane.changed = False
    if plot:
        view.timeline = timeline_frame(lanes)
    return view


def _running_status(lanes: dict[str, LaneRun], mode: str) -> str:
    if mode == RACE:
        return f"Racing: both lanes run at once, each with {race_threads()} inference thread(s)."
    if not lanes[AUTOREGRESSIVE].done:
        return "Running the autoregressive lane; the speculative lane waits so each has the whole machine."
    return "Running the speculative lane; the autoregressive lane is done."


def _final_view(lanes: dict[str, LaneRun], mode: str, settings: GenerationSettings, engines: dict[str, Engine]) -> View:
    ar, spec = lanes[AUTOREGRESSIVE], lanes[SPECULATIVE]
    errors = [f"The {name} lane failed: {lane.error}" for name, lane in lanes.items() if lane.error]
    status = " ".join(errors) if errors else f"Finished ({describe_mode(mode)}). Hover a token for its step."
    engine = engines[SPECULATIVE]
    kv = spec.summary.kv_cache_bytes if spec.summary else {}
    view = _live_view(lanes, mode, plot=True, whole=True)
    view.status = ("⚠️ " if errors else "") + status
    view.results = render_results(ar, spec, mode, settings)
    view.histogram = histogram_frame(spec.summary)
    view.models = render_models(engine.target.describe(), engine.draft.describe() if engine.draft else None,
                                engine.target.settings.num_threads, kv)
    return view


def stop(request: gr.Request):
    """Stop button: both lanes stop after their current step; the next run starts clean."""
    if not cancel_run(request.session_hash):
        return gr.skip(), gr.skip()
    return "Stopped. The lanes show what was generated before Stop.", _note(STOPPED_NOTE)


# ----------------------------------------------------------------------------- the page


def build() -> gr.Blocks:
    """The Blocks page. Call prepare() first so the models load before the first visitor."""
    with gr.Blocks(title="specdemo: speculative decoding, live", analytics_enabled=False) as demo:
        gr.Markdown(
            "# Speculative decoding, live\n"
            "One instruction, two lanes on OpenVINO: the **target** model alone, and a small **draft** model proposing "
            "K tokens that the target checks in one call. Watch where the speedup comes from.",
        )
        page: dict[str, gr.components.Component] = {}  # every component the handlers use, by name
        _add_controls(page)
        _add_lanes_and_results(page)
        inputs = [page[name] for name in GENERATE_INPUTS]
        outputs = [page[f.name] for f in fields(View)]
        status = page["status"]
        run = page["generate"].click(generate, inputs, outputs, concurrency_limit=1, concurrency_id="models",
                                     show_progress_on=[status])
        page["stop"].click(stop, None, [status, page["results"]], cancels=[run], queue=False)
        page["k_auto"].change(lambda auto: gr.Slider(interactive=not auto), page["k_auto"], page["k"], queue=False)
        page["decoding"].change(lambda d: gr.Row(visible=d == "sampling"), page["decoding"], page["sampling"], queue=False)
        demo.load(wait_for_models, None, [status, page["models"], page["costs"], page["costs_note"]],
                  concurrency_limit=None, show_progress="hidden")
    return demo


def _add_controls(c: dict) -> None:
    """The instruction, the examples, every setting, Generate and Stop, and the status line under them."""
    devices = list(offered_devices())
    device = "CPU" if "CPU" in devices else devices[0]
    examples = load_examples()
    defaults = GenerationSettings()
    with gr.Row(equal_height=True):
        c["instruction"] = gr.Textbox(label="Instruction", lines=3, max_lines=12, value=examples[0]["instruction"],
                                      max_length=MAX_INSTRUCTION_CHARS, elem_id="instruction", scale=3)
        with gr.Column(scale=1, min_width=240):
            with gr.Row():
                c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate", min_width=100)
                c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
            c["status"] = gr.Markdown(preparing_status(None, "starting"), elem_id="status", elem_classes="sd-status",
                                      container=True, min_height=96)
    with gr.Row(equal_height=True):
        c["drafter"] = gr.Radio([("Draft model", "model"), ("Prompt lookup", "prompt-lookup")], value=defaults.drafter,
                                label="Drafting", elem_id="drafter", min_width=300)
        c["mode"] = gr.Radio([("One after another", ONE_AFTER_ANOTHER), ("Race", RACE)], value=ONE_AFTER_ANOTHER,
                             label="Run mode", elem_id="mode", min_width=300)
        c["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS_CAP, value=defaults.max_new_tokens, step=1,
                                        label="Max new tokens", elem_id="max-new-tokens", min_width=200)
        with gr.Column(min_width=200):
            c["k_auto"] = gr.Checkbox(value=True, label="Auto K: the planner picks K for this machine", elem_id="k-auto")
            c["k"] = gr.Slider(1, MAX_K, value=defaults.k, step=1, label="K: drafts per round (when not auto)",
                               elem_id="k", min_width=200)
    gr.Examples([[e["instruction"], e["drafter"]] for e in examples], [c["instruction"], c["drafter"]],
                example_labels=[e["label"] for e in examples], label="Examples")
    with gr.Accordion("Adaptive K, sampling and devices", open=False):
        gr.Markdown("Prompt lookup drafts by matching the last few tokens against the prompt, so it needs no draft "
                    "model and shines when the answer copies from the instruction. A race runs both lanes at once, "
                    "each on half the cores; the headline speedup is best measured one after another.")
        with gr.Row():
            c["adaptive"] = gr.Checkbox(value=defaults.adaptive, label="Adaptive K", elem_id="adaptive",
                                        info="K grows after a fully accepted round and shrinks after a rejection.")
            c["decoding"] = gr.Radio([("Greedy", "greedy"), ("Sampling", "sampling")], value="greedy", label="Decoding")
            c["target_device"] = gr.Dropdown(devices, value=device, label="Target device")
            c["draft_device"] = gr.Dropdown(devices, value=device, label="Draft device")
        with gr.Row(visible=False) as c["sampling"]:
            c["temperature"] = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature")
            c["top_p"] = gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="Top-p")
            c["top_k"] = gr.Slider(0, 200, value=50, step=1, label="Top-k (0 keeps all)")
            c["seed"] = gr.Number(value=None, precision=0, label="Seed (empty: random)")


def _add_lanes_and_results(o: dict) -> None:
    """The legend, the two lanes with their live figures, the headline results, the charts and the models."""
    gr.HTML(render_legend(), elem_id="legend", js_on_load=TOGGLE_REJECTED_JS, elem_classes="sd-legend-row")
    with gr.Row(equal_height=True):
        for prefix, title in (("ar", "Autoregressive — target only"), ("spec", "Speculative — draft + target")):
            with gr.Column(elem_classes="sd-lane"):
                gr.HTML(f"<h3 class='sd-lane-title'>{title}</h3>")
                o[f"{prefix}_figures"] = gr.HTML(render_lane_figures(LaneRun(), 0.0), elem_id=f"{prefix}-figures")
                o[f"{prefix}_text"] = gr.HTML(render_tokens([]), elem_id=f"{prefix}-text", js_on_load=FOLLOW_JS)
    o["results"] = gr.HTML(_note("Press Generate to run both lanes."), elem_id="results")
    with gr.Row():
        o["timeline"] = gr.LinePlot(None, x="seconds", y="tokens", color="lane", color_map=LANE_COLOURS,
                                    title="Tokens generated over time", x_title="seconds since the lane began",
                                    y_lim=[0, None], height=280, elem_id="timeline")
        o["histogram"] = gr.BarPlot(None, x="accepted draft tokens", y="rounds", sort=None, y_lim=[0, None],
                                    title="Accepted draft tokens per round", height=280, elem_id="histogram")
    with gr.Row():
        with gr.Column():
            o["costs"] = gr.LinePlot(cost_frame(None), x="tokens scored at once", y="cost in single steps", color="curve",
                                     color_map=COST_COLOURS, title="Cost of scoring n tokens at once, in single steps",
                                     y_lim=[0, None], height=260, elem_id="costs")
            o["costs_note"] = gr.HTML(render_costs(None, 0.0), elem_id="costs-note")
        with gr.Column():
            with gr.Accordion("Models", open=True):
                o["models"] = gr.HTML("<p>Loading…</p>", elem_id="models")


# Hiding rejected drafts is pure presentation: a class on the page, no round trip, kept across runs.
TOGGLE_REJECTED_JS = """
element.addEventListener('change', (e) => document.body.classList.toggle('sd-hide-rejected', !e.target.checked));
"""

# The lane text scrolls inside its box. Each update replaces the box, so follow the newest tokens
# unless the visitor has scrolled up to read, in which case keep their place.
FOLLOW_JS = """
let stick = true, top = 0;
element.addEventListener('scroll', (e) => {
  const box = e.target;
  top = box.scrollTop;
  stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 24;
}, true);
watch('value', () => {
  const box = element.querySelector('.sd-text');
  if (!box) return;
  if (box.scrollHeight <= box.clientHeight + 24) stick = true;
  box.scrollTop = stick ? box.scrollHeight : top;
});
"""


# Gradio 6.31's SourceSansPro-SemiBold.woff2 holds only 55 glyphs, so semibold text mixes fonts; with
# only the regular and bold faces declared, semibold text uses the complete bold face instead.
THEME = gr.themes.Default(primary_hue="blue",
                          font=[gr.themes.GoogleFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif", "sans-serif"])


def launch(demo: gr.Blocks, host: str, port: int, share: bool) -> None:
    """Serve the page: queued runs (one at a time per model pair), no share link unless asked."""
    demo.queue(max_size=64).launch(server_name=host, server_port=port, share=share, css_paths=[ASSETS / "style.css"],
                                   theme=THEME)
