"""What watching costs: a local demo shares the machine with the browser watching it, and every live update is work
for the server and the browser's renderer, taken from the lanes. The same instruction run by the CLI, by the page
through its API (no browser) and by the page in Chromium, back to back, each saved run's two lanes read back into the
table (runfile.py: `generate --json` and the page's download share the schema), their setting the mode that ran them;
the report gives ratios to the CLI.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import astuple, dataclass, field
from pathlib import Path

from specdemo.bench import stats
from specdemo.bench.report_tables import table
from specdemo.bench.schema import OURS_AR, OURS_SPEC, Figures, Sections
from specdemo.bench.table import Lane, Run
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.record import Record
from specdemo.serve.values import PageValues

ROOT = Path(__file__).resolve().parent.parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update"]
MODES = ("CLI", "page API", "page in Chromium")
IDLE_S = 20  # seconds the loaded page is left idle in Chromium (after its first drawing) while its CPU time is read
# Our two lanes as every mode runs them (the page's defaults: auto K)
AR = Lane("ours autoregressive", "specdemo", AUTOREGRESSIVE)
SPEC = Lane("ours speculative", "specdemo", SPECULATIVE, baseline=AR, k_policy="auto")


@dataclass(frozen=True)
class Seen:
    """What the section compares, of one repeat by one mode (seen)."""

    step_s: float  # an autoregressive step
    verify_s: float  # a verify call
    drafting_s: float  # the speculative run's drafting, all of it
    speedup: float  # as results.metrics.measured_speedup


def seen(ar: Run, spec: Run) -> Seen:
    """The Seen of one repeat by one mode: its autoregressive run, its speculative run."""
    return Seen(ar.summary.target_step_s, spec.summary.verify_call_s, spec.summary.draft_s,
                ar.per_token_s / spec.per_token_s)


@dataclass
class BrowserCpu:
    """Chromium's CPU seconds (every process of it, from /proc) around one run pressed in it (Page.by_browser)."""

    idle_s: float = math.nan  # over IDLE_S with the page loaded and idle
    run_s: float = math.nan  # over the run
    run_wall_s: float = math.nan  # the run's wall seconds


@dataclass(frozen=True)
class Watching(Figures):
    """The section: what it ran; its runs are the table's, their setting the mode (MODES)."""

    instruction: str
    max_new_tokens: int
    repeats: int
    idle_s: int  # IDLE_S
    browser_cpu: list[BrowserCpu] = field(default_factory=list)  # one per run in Chromium


def rows(run: dict, repeat: int, n: int) -> list[Run]:
    """One saved run's two lanes as rows of the table."""
    record = Record.from_json(run)
    ar, spec = record.autoregressive, record.speculative
    return [Run(lane, 0, repeat, n, s.wall_s, s.tokens, s.ttft_s, same, s, s.proposed, s.accepted) for lane, s, same in
            ((AR, ar.summary, True), (SPEC, spec.summary, spec.ids == ar.ids))]


def by_repeat(runs: list[Run], mode: str) -> dict[int, Seen]:
    """{repeat: what it saw} of the watching section's rows run by `mode`."""
    if not (at := stats.section(runs, "watching", mode)):
        return {}
    return {ar.repeat: seen(ar, spec) for ar, spec in stats.paired_runs(at.runs, at.lane(OURS_AR), at.lane(OURS_SPEC))}


def by_cli(instruction: str, n: int) -> dict:
    """One run of `python -m specdemo generate --json` (its own process, as a user would run it)."""
    out = subprocess.run([sys.executable, "-m", "specdemo", "generate", instruction, "--max-new-tokens", str(n), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900, check=True)
    return json.loads(out.stdout)


def held_run(button: str) -> str:
    """The run's JSON that the page's download button holds (ui/render.render_download: a link whose href is a base64
    data: URL), as a browser would save it; ValueError where the button holds no run."""
    found = re.search(r'href="data:application/json;base64,([^"]+)"', button)
    if found is None:
        raise ValueError("the page's download button holds no run")
    return base64.b64decode(found.group(1)).decode("utf-8")


class Page:
    """`python app.py` on a free port, for the API and the browser runs."""

    def __init__(self, log):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "app.py", "--port", str(self.port)], cwd=ROOT,
                                        stdout=self.output, stderr=subprocess.STDOUT,
                                        env={**os.environ, "SPECDEMO_TUNE_AT_START": "0"})  # nothing else on the machine
        log(f"watching: starting the page on {self.url}")
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url, timeout=5)
                break
            except OSError:
                time.sleep(1)

    def by_api(self, instruction: str, n: int) -> dict:
        """One run through the page's API, no browser: its download read back."""
        from gradio_client import Client

        from specdemo.ui.handlers import OUTPUTS
        from specdemo.ui.page import INPUTS

        values = {**vars(PageValues()), "instruction": instruction, "max_new_tokens": n}
        # gradio's answer as its client gives it, where it comes in: the page's outputs by name
        outputs = dict(zip(OUTPUTS, Client(self.url, verbose=False).predict(*[values[k] for k in INPUTS],
                                                                           api_name="/generate")))
        return json.loads(held_run(outputs["download"]))

    def by_browser(self, instruction: str, n: int, cpu: BrowserCpu | None = None) -> dict:
        """One run pressed in Chromium on this machine, the page streaming to it; its download read back, and `cpu`
        filled in."""
        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.goto(self.url)
                status = page.locator("#status")
                expect(status).to_contain_text("Ready", timeout=900_000)
                if cpu is not None:
                    time.sleep(4)  # the charts' first drawing animates for a second or two
                    before = chromium_cpu_s()
                    time.sleep(IDLE_S)
                    cpu.idle_s = chromium_cpu_s() - before
                page.locator("#instruction textarea").fill(instruction)
                box = page.locator("#max-new-tokens input[type=number]")
                box.fill(str(n))
                box.press("Enter")
                before, began = chromium_cpu_s(), time.perf_counter()
                page.locator("#generate").click()
                expect(status).to_contain_text("Finished", timeout=900_000)
                if cpu is not None:
                    cpu.run_s, cpu.run_wall_s = chromium_cpu_s() - before, time.perf_counter() - began
                with page.expect_download() as download:
                    page.locator("#download").click()
                return json.loads(Path(download.value.path()).read_text())
            finally:
                browser.close()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def chromium_cpu_s() -> float:
    """User + system CPU seconds of every Chromium process this process started (through Playwright's driver)."""
    import psutil

    total = 0.0
    for process in psutil.Process().children(recursive=True):
        try:
            if "chrom" in process.name().lower():
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.Error:  # gone between the listing and the reading
            pass
    return total


def run_watching(ctx) -> Watching:
    """The section: the third code instruction by each mode, the three back to back in every repeat, each run's rows
    kept in the table with the mode as their setting (Context.keep); what it ran, and Chromium's own CPU time."""
    instruction, n, repeats, log = ctx.code_instructions(3)[2], ctx.sweep_tokens, ctx.bench.watching_repeats, ctx.log
    browser_cpu = []
    page = Page(log)
    try:
        page.by_api(instruction, 8)  # the page warms up once, as a visitor's first run would not
        for r in range(repeats):
            if CHROMIUM.exists():
                browser_cpu.append(BrowserCpu())
            for mode, run in (("CLI", lambda: by_cli(instruction, n)), ("page API", lambda: page.by_api(instruction, n)),
                              ("page in Chromium", lambda: page.by_browser(instruction, n, browser_cpu[-1]))):
                if mode == "page in Chromium" and not CHROMIUM.exists():
                    continue
                ar, spec = ctx.keep(rows(run(), r, n), mode)
                log(f"watching [{r + 1}/{repeats}] {mode}: {seen(ar, spec)}")
    finally:
        page.close()
    return Watching(instruction, n, repeats, IDLE_S, browser_cpu)


def _median(seens: list[Seen]) -> Seen:
    return Seen(*map(statistics.median, zip(*map(astuple, seens))))


def watching_section(sections: Sections, plots: dict, runs: list[Run]) -> str:
    """The report's part: each mode's medians, and in brackets the median of each repeat's figure over the CLI's of the
    same repeat (a shared machine drifts between repeats)."""
    if not (section := sections.watching):
        return ""
    lines, cli = [], by_repeat(runs, "CLI")
    for mode in MODES:
        if mine := by_repeat(runs, mode):
            m = _median(list(mine.values()))
            r = _median([Seen(*(a / b for a, b in zip(astuple(v), astuple(cli[i])))) for i, v in mine.items()])
            lines.append([mode, f"{m.step_s * 1e3:.1f} ms ({r.step_s:.2f}×)", f"{m.verify_s * 1e3:.1f} ms "
                          f"({r.verify_s:.2f}×)", f"{m.drafting_s:.2f} s ({r.drafting_s:.2f}×)",
                          f"{m.speedup:.2f}× ({r.speedup:.2f}×)"])
    return (f"## 8. What watching costs\n\nThe same instruction (N = {section.max_new_tokens}, auto K), {section.repeats} "
            "times each way, back to back: the CLI, the page through its API with no browser, and the page in Chromium on "
            "this machine. Medians, and in brackets the median of each run over the CLI's run of the same repeat.\n\n"
            + table(["where", "autoregressive step", "verify call", "drafting", "speedup shown"], lines)
            + _browser_cpu(section))


def _browser_cpu(section: Watching) -> str:
    """Chromium's own CPU time: the loaded page left idle, and over a run."""
    if not (readings := [r for r in section.browser_cpu if not math.isnan(r.run_s)]):
        return ""
    idle, run, wall = (statistics.median(r.idle_s for r in readings), statistics.median(r.run_s for r in readings),
                       statistics.median(r.run_wall_s for r in readings))
    return (f"\n\nChromium's CPU time (all its processes, read from /proc), medians: the page loaded and idle, "
            f"{idle:.2f} CPU s per {section.idle_s} s; over a run ({wall:.1f} s, both lanes streaming), {run:.2f} CPU s "
            f"({run / wall:.1%} of a core).")
