"""The Gradio page: the layout, and the glue binding handlers.py's generators to the components. This is the
only module under specdemo/ that imports gradio."""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import fields

import gradio as gr
from starlette.middleware import Middleware

from specdemo.decoding import drafters
from specdemo.results import figures
from specdemo.ui import background, charts, handlers, render
from specdemo.ui.asgi import (REFUSED, CheckedComponentCalls, Closed, FirstInHead, Lines, OneLineErrors, RefusedIs400,
                             one_line)
from specdemo.ui.handlers import OUTPUTS, SKIP
from specdemo.serve.lanes import LaneRun
from specdemo.serve.values import (ASSETS, MAX_INSTRUCTION_CHARS, MAX_K, MAX_NEW_TOKENS_CAP, ONE_AFTER_ANOTHER, RACE,
                                PageValues, load_examples, offered_devices)
from specdemo.serve.server import Server
from specdemo.serve.visitors import Visitor, visitor_of
from specdemo.serve.waiting import MAX_WAITING_RUNS
from specdemo.settings import PageSettings

INPUTS = tuple(f.name for f in fields(PageValues))  # the page's inputs, in the order generate() receives them
MAX_UPLOAD_BYTES = 64 << 10  # the page takes no files; what still parses a form (Gradio's component server) stops here
# Gradio's routes that would keep a visitor's bytes on disk, closed (asgi.Closed): the upload route and its screen
# recordings (the page has no file input, and the cap above is per file, not per visitor: 300 files of 60 KB were kept
# in 1.5 s), and deep links, which write a session's whole page state to a served file (the page offers none).
NO_FILES = "This page takes no files."
# And Gradio's cancel route, which ended any run given its event id whatever the session (issue 62): the page's Stop
# names the run its own page started, and no event of the page asks Gradio to cancel (page.py: no `cancels=`).
CLOSED_ROUTES = {"/gradio_api/upload": NO_FILES, "/gradio_api/process_recording": NO_FILES,
                 "/gradio_api/cancel": "This page's runs are stopped by their own Stop button."}
DEEP_LINKS = {"/gradio_api/deep_link": "Deep links are off on this page."}
CACHE_CHECK_S, CACHE_AGE_S = 600, 3600  # Gradio's served copies: looked at every 10 min, removed after an hour


def _gradio(values: tuple) -> tuple:
    return tuple(gr.skip() if value is SKIP else value for value in values)


def _warn(status) -> None:
    if isinstance(status, str) and status.startswith("⚠️"):
        gr.Warning(status.removeprefix("⚠️").strip())


def visitor(request: gr.Request, settings: PageSettings) -> Visitor:
    """Who sent `request`: their session, and their address (visitors.address_of: the peer's, or the client a named
    proxy forwarded for, from every X-Forwarded-For line). uvicorn under Gradio leaves the peer as it is (launch)."""
    headers = request.headers or {}
    forwarded = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for")]
    peer = request.client.host if request.client is not None else ""
    return visitor_of(request.session_hash or "", peer, [line for line in forwarded if line], settings.proxies)


class Events:
    """The page's events, bound to the server they serve from (bound methods, not functools.partial: Gradio finds the
    gr.Request to pass by a handler's type hints, which a partial hides)."""

    def __init__(self, server: Server):
        self.server = server

    def generate(self, request: gr.Request, *values):
        """Generate: the page's values (INPUTS order) in, whole page updates (OUTPUTS order) out."""
        for view in handlers.generate(self.server, PageValues(*values), visitor(request, self.server.settings)):
            _warn(view.status)
            yield _gradio(view.values())

    def stop(self, request: gr.Request, run_id: str):
        """Stop: the lanes of the run this page started (its id, which only this page was told) stop after their
        current step; generate's last update shows the result."""
        update = handlers.stop(self.server, request.session_hash or "", run_id or "")
        return gr.skip() if update is None else update

    def leave(self, request: gr.Request):
        """The visitor closed or reloaded their tab: nothing of theirs is kept (their drafters' memories)."""
        self.server.memories.forget(request.session_hash or "")

    def wait_for_models(self):
        for update in handlers.wait_for_models(self.server):
            yield _gradio(update)

    async def follow_background(self):
        async for line in background.follow(self.server):
            yield line


class Page(gr.Blocks):
    """The page's Blocks: a call Gradio refuses leaves one line in the server's terminal, and its caller a short
    sentence (a 400 on /run/: asgi.RefusedIs400).

    This reaches into Gradio 6.31, which has no option or hook for it: every value it refuses (a slider out of bounds,
    a choice not offered, too few values) is raised in Blocks.preprocess_data, before the event's handler runs, and
    each route that calls it (the queue behind /queue/join and /call/, and /run/) prints the whole traceback, quoting
    the value at the length it was sent, unless the error is a gr.Error with print_exception=False. Overriding the one
    method they share catches exactly the refusals: an error in a handler of ours still prints its traceback. Those
    lines and OneLineErrors' share one bound a minute (`refusals`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.refusals = Lines()  # the terminal's lines about refused calls and requests

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        try:
            check_text(block_fn.inputs, inputs)
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except Exception as error:  # noqa: BLE001 - whatever Gradio refuses a call with, it is this one line
            sentence = one_line(error.message if isinstance(error, gr.Error) else str(error))
            self.refusals.say(f"refused a call to {one_line(str(block_fn.api_name or block_fn.name))}: {sentence}")
            raise gr.Error(sentence, title=REFUSED, print_exception=False) from None


def check_text(blocks: list, values: list) -> None:
    """Refuse a value that is not text for a text box: Gradio's Textbox makes text of any value (123 became "123",
    ["x"] "['x']": issue 62). Raises ValueError with a sentence."""
    for block, value in zip(blocks, values):
        if isinstance(block, gr.Textbox) and value is not None and not isinstance(value, str):
            raise ValueError(f"The {(block.label or 'value').lower()} must be text, got {one_line(repr(value), 60)}.")


def build(server: Server) -> Page:
    """The Blocks page, serving from `server`. Call server.engines.prepare() first so the models load before the first
    visitor."""
    events = Events(server)
    # Gradio's copies of any files it served are removed an hour after they were made (the runs' downloads are none).
    with Page(title="specdemo: speculative decoding, live", analytics_enabled=False,
              delete_cache=(CACHE_CHECK_S, CACHE_AGE_S)) as demo:
        gr.Markdown(
            "# Speculative decoding, live\n"
            "One instruction, two lanes on OpenVINO: the **target** model alone, and a small **draft** model proposing "
            "K tokens that the target checks in one call. Watch where the speedup comes from.",
        )
        page: dict[str, gr.components.Component] = {}  # every component the handlers use, by name
        _add_controls(page)
        _add_lanes_and_results(page)
        status = page["status"]
        # No concurrency limit here: runs wait in our own queue (serve/waiting.py), which tells each visitor their place.
        page["generate"].click(events.generate, [page[name] for name in INPUTS], [page[name] for name in OUTPUTS],
                               concurrency_limit=None, show_progress="hidden")
        # No `cancels=[run]`: closing the generator mid-update let a live update already in flight land after
        # Stop's message. Stop sets the run's cancel flag and the run ends itself with a final update.
        page["stop"].click(events.stop, page["run"], status, queue=False, show_progress="hidden")
        demo.unload(events.leave)
        page["k_auto"].change(lambda auto: gr.Slider(interactive=not auto), page["k_auto"], page["k"], queue=False)
        page["decoding"].change(lambda d: gr.Row(visible=d == "sampling"), page["decoding"], page["sampling"], queue=False)
        page["genai"].change(lambda on: gr.Column(visible=on), page["genai"], page["genai_lane"], queue=False)
        demo.load(events.wait_for_models, None, [status, page["models"], page["costs"], page["costs_note"], page["surface"]],
                  concurrency_limit=None, show_progress="hidden")
        # Updates only when the line changes, and none where there is no background work (no timer ticking).
        demo.load(events.follow_background, None, page["background"], concurrency_limit=None, show_progress="hidden")
    return demo


def _add_controls(c: dict) -> None:
    """The instruction, the examples, every setting, Generate and Stop, and the status line under them."""
    devices = list(offered_devices())
    device = "CPU" if "CPU" in devices else devices[0]
    examples = load_examples()
    defaults = PageValues()
    with gr.Row(equal_height=True):
        c["instruction"] = gr.Textbox(label="Instruction", lines=3, max_lines=12, value=examples[0]["instruction"],
                                      max_length=MAX_INSTRUCTION_CHARS, elem_id="instruction", scale=3)
        with gr.Column(scale=1, min_width=240):
            with gr.Row():
                c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate", min_width=100)
                c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
            c["status"] = gr.Markdown(render.preparing_status(None, "starting"), elem_id="status", elem_classes="sd-status",
                                      container=True, min_height=96)
            c["background"] = gr.HTML("", elem_id="background")  # what the background work does (ui/background.py)
            # The id of this page's run, which Stop names (handlers.View.run): told to this page alone.
            c["run"] = gr.Textbox("", visible=False, elem_id="run-id")
    with gr.Row(equal_height=True):
        c["drafter"] = gr.Radio(drafters.choices(),
                                value=defaults.drafter, label="Drafting", elem_id="drafter", min_width=300)
        c["mode"] = gr.Radio([("One after another", ONE_AFTER_ANOTHER), ("Race", RACE)], value=defaults.mode,
                             label="Run mode", elem_id="mode", min_width=300)
        c["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS_CAP, value=defaults.max_new_tokens, step=1,
                                        label="Max new tokens", elem_id="max-new-tokens", min_width=200)
        with gr.Column(min_width=200):
            c["k_auto"] = gr.Checkbox(value=defaults.k_auto, label="Auto K: the planner picks K for this machine",
                                      elem_id="k-auto")
            c["k"] = gr.Slider(1, MAX_K, value=defaults.k, step=1, label="K: drafts per round (when not auto)",
                               elem_id="k", min_width=200, interactive=not defaults.k_auto)
    gr.Examples([[e["instruction"], e["drafter"]] for e in examples], [c["instruction"], c["drafter"]],
                example_labels=[e["label"] for e in examples], label="Examples")
    with gr.Accordion("OpenVINO GenAI, adaptive K, sampling and devices", open=False):
        gr.Markdown("Prompt lookup drafts by matching the last few tokens against the text so far, so it needs no draft "
                    "model and shines when the answer copies from the instruction; hybrid drafts by lookup where the text "
                    "repeats and by the draft model elsewhere, whichever this machine's costs favour each round. Your "
                    "earlier answers drafts from what the model answered you before in this tab, and never from anyone "
                    "else's answers; they are forgotten when you close the tab. A race "
                    "runs both lanes at once, each on half the cores; the headline speedup is best measured one after "
                    "another.")
        c["genai"] = gr.Checkbox(value=defaults.genai, elem_id="genai",
                                 label="Also run OpenVINO GenAI's speculative pipeline (a third lane, run last)",
                                 info="The same model folders, prompt tokens and K; loads a second copy of the models "
                                      "where memory allows it, released again after a few idle minutes.")
        c["configuration"] = gr.Radio(
            [("Faithful: the GGUF's answers (the default)", "faithful"), ("Fastest: INT4 target", "fastest")],
            value=defaults.configuration, label="Configuration", elem_id="configuration",
            info="The faithful target keeps the GGUF's greedy choices: INT8 or the GGUF's own 4-bit blocks, whichever "
                 "steps faster on this machine (its background work races them). The INT4 target is faster but "
                 "answers like another model (its greedy text parts from the faithful target's after ~17 tokens); it "
                 "is offered once the background work has prepared it. Speculation is lossless either way.")
        with gr.Row():
            c["adaptive"] = gr.Checkbox(value=defaults.adaptive, label="Adaptive K", elem_id="adaptive",
                                        info="K grows after a fully accepted round and shrinks after a rejection.")
            c["decoding"] = gr.Radio([("Greedy", "greedy"), ("Sampling", "sampling")], value=defaults.decoding,
                                     label="Decoding")
            c["target_device"] = gr.Dropdown(devices, value=device, label="Target device")
            c["draft_device"] = gr.Dropdown(devices, value=device, label="Draft device")
        with gr.Row(visible=False) as c["sampling"]:
            c["temperature"] = gr.Slider(0.05, 2.0, value=defaults.temperature, step=0.05, label="Temperature")
            c["top_p"] = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top-p")
            c["top_k"] = gr.Slider(0, 200, value=defaults.top_k, step=1, label="Top-k (0 keeps all)")
            c["seed"] = gr.Number(value=defaults.seed, precision=0, label="Seed (empty: random)")


LANE_TITLES = (("ar", "Autoregressive — target only"), ("spec", "Speculative — draft + target"),
               ("genai", "OpenVINO GenAI — its speculative pipeline"))


def _add_lanes_and_results(o: dict) -> None:
    """The legend, the lanes with their live figures, the headline results, the charts and the models."""
    gr.HTML(render.render_legend(), elem_id="legend", js_on_load=TOGGLE_REJECTED_JS, elem_classes="sd-legend-row")
    with gr.Row(equal_height=True):
        for prefix, title in LANE_TITLES:
            with gr.Column(elem_classes="sd-lane", visible=prefix != "genai", elem_id=f"{prefix}-lane") as column:
                gr.HTML(f"<h3 class='sd-lane-title'>{title}</h3>")
                o[f"{prefix}_figures"] = gr.HTML(render.render_lane_figures(LaneRun(), 0.0), elem_id=f"{prefix}-figures")
                o[f"{prefix}_text"] = gr.HTML(render.render_stream([], 0, reset=True), elem_id=f"{prefix}-text",
                                              js_on_load=STREAM_JS)
            o[f"{prefix}_lane"] = column
    o["results"] = gr.HTML(render.note("Press Generate to run both lanes."), elem_id="results")
    with gr.Row(equal_height=True):
        with gr.Column(scale=4, min_width=300):
            with gr.Accordion("ⓘ What the figures mean, and what other tools call them", open=False, elem_id="glossary"):
                gr.Markdown(figures.glossary_markdown())
        # A link holding the run itself (render.render_download): the run is this page's alone, never a served file.
        o["download"] = gr.HTML(render.render_download(None), elem_id="download", js_on_load=None, scale=0,
                                min_width=220)
    with gr.Row(equal_height=True):
        # Columns with a min_width: on a phone the charts stack instead of shrinking side by side.
        with gr.Column(min_width=320):
            o["timeline"] = gr.HTML(charts.placeholder("Tokens generated over time", "Drawn as the lanes run."),
                                    elem_id="timeline", elem_classes="sd-chart-box")
        with gr.Column(min_width=320):
            o["would"] = gr.HTML(charts.placeholder("What each K would have given on this answer", "Drawn after a run."),
                                 elem_id="would", elem_classes="sd-chart-box")
    with gr.Row(equal_height=True):
        with gr.Column(min_width=320):
            o["positions"] = gr.HTML(charts.placeholder("Acceptance by draft position", "Drawn after a run."),
                                     elem_id="positions", elem_classes="sd-chart-box")
        with gr.Column(min_width=320):
            o["surface"] = gr.HTML(charts.cost_surface(None, MAX_K), elem_id="surface", elem_classes="sd-chart-box")
    with gr.Row():
        with gr.Column():
            o["costs"] = gr.LinePlot(render.cost_frame(None), x="tokens scored at once", y="cost in single steps",
                                     color="curve", color_map=render.COST_COLOURS, y_lim=[0, None], height=260,
                                     title="Cost of scoring n tokens at once, in single steps", elem_id="costs")
            o["costs_note"] = gr.HTML(render.render_costs(None, 0.0), elem_id="costs-note")
        with gr.Column():
            with gr.Accordion("Models", open=True):
                o["models"] = gr.HTML("<p>Loading…</p>", elem_id="models")


# Hiding rejected drafts is pure presentation: a class on the page, no round trip, kept across runs.
TOGGLE_REJECTED_JS = """
element.addEventListener('change', (e) => document.body.classList.toggle('sd-hide-rejected', !e.target.checked));
"""

# A lane's text box receives only the tokens new since the last update (render.render_stream: a hidden div with
# data-from / data-to, data-reset at the start and the end of a run) and appends them to a box of its own beside the
# component's re-rendered content, so an update costs the new tokens, not the whole text again. The box follows the
# newest tokens unless the visitor has scrolled up to read, in which case it keeps their place.
STREAM_JS = """
const box = document.createElement('div');
box.className = 'sd-text';
box.dataset.count = '0';
element.parentNode.insertBefore(box, element.nextSibling);
let stick = true;
box.addEventListener('scroll', () => { stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 24; });
const take = () => {
  const delta = element.querySelector('.sd-delta');
  if (!delta) return;
  const from = +delta.dataset.from, to = +delta.dataset.to, have = +box.dataset.count;
  if (delta.dataset.reset === '1') { box.innerHTML = delta.innerHTML; stick = true; }
  else if (from === have) box.insertAdjacentHTML('beforeend', delta.innerHTML);
  else { delta.remove(); return; }  // already shown, or a gap: the run's last update resets the whole text
  delta.remove();  // shown in the box now: no hidden second copy in the page
  box.dataset.count = String(to);
  if (box.scrollHeight <= box.clientHeight + 24) stick = true;
  if (stick) box.scrollTop = box.scrollHeight;
};
take();
watch('value', take);
"""


# Gradio 6.31's status tracker ticks its elapsed-time display on every animation frame while its timer runs, and a
# tracker that goes away while pending (the page's own loading tracker, at every load) never stops its timer: an idle
# page rendered 60 frames a second, 1.5 CPU s per 20 s in headless Chromium against 0.07 for a blank page. Every
# tracker on this page is hidden (its events show no progress, the status line is ours), so those ticks are dropped
# unless a tracker is showing. It must run before Gradio's modules take their reference to requestAnimationFrame, so
# it goes into the page's HTML itself (FirstInHead below: Gradio's own `head=` is added by its script, too late); the
# tick is recognised by its body (elapsed seconds from performance.now()).
QUIET_TRACKERS_JS = """
(() => {
  const raf = window.requestAnimationFrame.bind(window);
  const tick = /performance\.now\(\)-.*\/1e3/;
  const showing = () => [...document.querySelectorAll('[data-testid="status-tracker"]')]
    .some((tracker) => !tracker.classList.contains('hide') && tracker.offsetParent !== null);
  window.requestAnimationFrame = (callback) => (tick.test(String(callback)) && !showing() ? 0 : raf(callback));
})();
"""


# Gradio 6.31's SourceSansPro-SemiBold.woff2 holds only 55 glyphs, so semibold text mixes fonts; with
# only the regular and bold faces declared, semibold text uses the complete bold face instead.
THEME = gr.themes.Default(primary_hue="blue",
                          font=[gr.themes.GoogleFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif", "sans-serif"])


def enter_events_once() -> None:
    """Gradio 6.31 wraps every event in a MatplotlibBackendMananger that imports matplotlib the first time: 1.4-1.9 s of
    the first visitor's first run on the 2-core Zen 3 (py-spy). Paid at launch instead, on a thread of its own."""
    with getattr(gr.utils, "MatplotlibBackendMananger", contextlib.nullcontext)():
        pass


def launch(demo: Page, host: str, port: int, share: bool, *, monitoring: bool = False,
           deep_links: bool = False) -> None:
    """Serve the page: runs take turns in our queue (each waiting one holds a worker thread, hence the threads), no share
    link, no /monitoring and no deep links unless asked."""
    threading.Thread(target=enter_events_once, daemon=True, name="specdemo-gradio-events").start()
    closed = CLOSED_ROUTES if deep_links else {**CLOSED_ROUTES, **DEEP_LINKS}
    # uvicorn believes X-Forwarded-For from the peers in FORWARDED_ALLOW_IPS (loopback by default) and puts the address it
    # names in the peer's place, before the page sees the request; the page reads that header itself, from the proxies
    # its settings name (visitor), so uvicorn, which Gradio gives no other option, believes no one.
    os.environ["FORWARDED_ALLOW_IPS"] = ""
    middleware = [Middleware(OneLineErrors, lines=demo.refusals), Middleware(RefusedIs400), Middleware(Closed, routes=closed),
                  Middleware(CheckedComponentCalls, components=set(demo.blocks), max_bytes=MAX_UPLOAD_BYTES),
                  Middleware(FirstInHead, html=f"<script>{QUIET_TRACKERS_JS}</script>")]
    # enable_monitoring: Gradio's default (None) serves /monitoring/summary to anyone; False answers 403.
    demo.queue(max_size=2 * MAX_WAITING_RUNS).launch(server_name=host, server_port=port, share=share,
                                                     max_file_size=MAX_UPLOAD_BYTES, enable_monitoring=monitoring,
                                                     css_paths=[ASSETS / "style.css"], theme=THEME,
                                                     app_kwargs={"middleware": middleware},
                                                     max_threads=2 * MAX_WAITING_RUNS + 16)
