"""The page in a real browser: `python app.py` on a free loopback port, driven by Playwright with
Debian's chromium. A run on an example finishes with coloured tokens and figures, Stop cancels a
second run, and a third run, with the planner choosing K, completes normally. Saves a screenshot on the way
(to the test's temporary folder; with SPECDEMO_REFRESH_SCREENSHOT=1 also over assets/screenshot.png).
"""

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, STARTUP_S

pytestmark = [pytest.mark.browser, pytest.mark.real_models, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]
RUN_MS = 300_000  # one run of both lanes, generously, on a shared 2-core machine


@pytest.fixture(scope="module")
def app_url(app_server):
    return app_server.url


@pytest.fixture
def page():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1440, "height": 900})
        finally:
            browser.close()


def set_max_new_tokens(page, n: int) -> None:
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(n))
    box.press("Enter")


def test_a_run_shows_coloured_tokens_and_figures_and_stop_cancels_cleanly(app_url, page, tmp_path):
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)  # a shared 2-core machine may take seconds to answer a click
    page.goto(app_url)
    status = page.locator("#status")
    expect(status).to_contain_text("Ready", timeout=STARTUP_S * 1000)
    expect(page.locator("#models")).to_contain_text("Qwen2.5-Coder-1.5B-Instruct")
    expect(page.locator("#costs-note")).to_contain_text("single steps here")  # the machine's measured cost curve

    # A bad instruction is refused with a sentence, and the text box keeps what was typed.
    instruction = page.locator("#instruction textarea")
    instruction.fill("   ")
    page.locator("#generate").click()
    expect(status).to_contain_text("The instruction is empty")
    expect(instruction).to_have_value("   ")

    # A short run on an example: both lanes finish, with provenance colours and figures.
    page.get_by_role("button", name="Code: a prime checker").click()
    expect(instruction).to_have_value("Write a Python function that checks whether a number is prime. "
                                      "Include a docstring and three doctests.")
    set_max_new_tokens(page, 48)
    page.locator("#k-auto input[type=checkbox]").uncheck()  # a fixed K = 4 drafts on any CPU, so colours show
    page.locator("#generate").click()
    expect(status).to_contain_text("Finished (one after another", timeout=RUN_MS)
    assert page.locator("#ar-text .sd-tok").count() > 0
    assert page.locator("#spec-text .sd-accepted").count() > 0
    title = page.locator("#spec-text .sd-accepted").first.get_attribute("title")
    assert title.startswith("step ") and "accepted draft" in title
    expect(page.locator("#ar-figures")).to_contain_text("tokens/s")
    expect(page.locator("#spec-figures")).to_contain_text("48")
    results = page.locator("#results")
    for figure in ("measured speedup", "predicted speedup", "α̂ (acceptance)", "mean acceptance length",
                   "target calls saved", "Measured one after another", "Leviathan", "the best fixed K ="):
        expect(results).to_contain_text(figure)
    # The run's charts: what each K would have given (a point per K and this run's mark), acceptance by position,
    # and this machine's cost surface with the run's point.
    assert page.locator("#would svg circle").count() >= 12 and page.locator("#would svg path").count() == 1
    assert page.locator("#positions svg rect title").count() >= 1
    # Where drafts pay, or that none does: a fact of this machine's measured costs (a 2-core Zen 3 whose quick
    # measurement ran beside a neighbour's load said none does), either way in a sentence.
    expect(page.locator("#surface")).to_contain_text(re.compile("drafts pay when α is above|no K pays, even if every"))
    assert page.locator("#surface svg circle").count() == 1
    expect(page.locator("#models")).to_contain_text("MiB")  # KV cache sizes after a run
    page.locator("#legend input[type=checkbox]").uncheck()
    expect(page.locator("body")).to_have_class(re.compile("sd-hide-rejected"))
    page.locator("#legend input[type=checkbox]").check()
    save_screenshot(page, tmp_path, "screenshot.png")

    # Stop during a second run: both lanes stop and the page says so.
    set_max_new_tokens(page, 64)
    page.locator("#generate").click()
    expect(status).to_contain_text("Running the autoregressive lane", timeout=RUN_MS)
    expect(page.locator("#ar-text .sd-tok").first).to_be_visible(timeout=RUN_MS)
    page.locator("#stop").click()
    expect(status).to_contain_text("Stopped. The lanes show what was generated before Stop.")
    expect(page.locator("#results")).to_contain_text("Stopped before both lanes finished")

    # The next run works normally, with the planner choosing K and saying why.
    set_max_new_tokens(page, 16)
    page.locator("#k-auto input[type=checkbox]").check()
    page.locator("#generate").click()
    expect(status).to_contain_text("Finished (one after another", timeout=RUN_MS)
    expect(page.locator("#spec-figures")).to_contain_text("16")
    expect(results).to_contain_text("measured speedup")
    expect(results).to_contain_text(re.compile("chosen for this machine|No K pays"))


def status_overlaps(page) -> list[str]:
    """Pairs of visible boxes with text inside the status block that intersect (two messages on top of each other)."""
    return page.evaluate("""() => {
      const block = document.querySelector('#status');
      const boxes = [...block.querySelectorAll('*')]
        .filter(e => e.children.length === 0 && e.textContent.trim() && e.getClientRects().length)
        .map(e => [e.textContent.trim().slice(0, 40), e.getBoundingClientRect()])
        .filter(([, r]) => r.width > 0 && r.height > 0);
      const hits = [];
      for (let i = 0; i < boxes.length; i++)
        for (let j = i + 1; j < boxes.length; j++) {
          const [a, r] = boxes[i], [b, s] = boxes[j];
          if (r.left < s.right - 1 && s.left < r.right - 1 && r.top < s.bottom - 1 && s.top < r.bottom - 1)
            hits.push(a + ' / ' + b);
        }
      return hits;
    }""")


def save_screenshot(page, tmp_path, name: str) -> None:
    """To the test's folder; with SPECDEMO_REFRESH_SCREENSHOT=1 also over assets/<name>."""
    page.wait_for_timeout(800)  # let the charts finish drawing
    page.add_style_tag(content=".toast-wrap { display: none !important; }")  # an earlier warning's toast, if it lingers
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("SPECDEMO_REFRESH_SCREENSHOT") == "1":
        shutil.copy(shot, ROOT / "assets" / name)


def test_genai_runs_as_a_third_lane_and_the_status_never_overlaps(app_url, page, tmp_path):
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)
    page.goto(app_url)
    status = page.locator("#status")
    expect(status).to_contain_text("Ready", timeout=STARTUP_S * 1000)
    assert status_overlaps(page) == []
    expect(page.locator("#genai-lane")).to_be_hidden()
    page.get_by_text("OpenVINO GenAI, adaptive K, sampling and devices").click()
    page.locator("#genai input[type=checkbox]").check()
    expect(page.locator("#genai-lane")).to_be_visible()
    page.locator("#k-auto input[type=checkbox]").uncheck()
    set_max_new_tokens(page, 24)
    page.locator("#generate").click()
    seen = set()
    deadline = time.monotonic() + RUN_MS / 1000
    while "Finished" not in (text := status.inner_text()) and time.monotonic() < deadline:
        seen.add(text.split(":")[0][:40])
        assert status_overlaps(page) == [], text  # while loading GenAI's pipeline, running, and after
        page.wait_for_timeout(200)
    expect(status).to_contain_text("Finished", timeout=1000)
    assert any("GenAI" in text for text in seen), seen  # the status said when GenAI's lane ran
    assert page.locator("#genai-text .sd-tok").count() > 0
    expect(page.locator("#genai-figures")).to_contain_text("tokens/s")
    expect(page.locator("#genai-figures")).to_contain_text("24")
    results = page.locator("#results")
    expect(results).to_contain_text("OpenVINO GenAI's speculative pipeline (draft model, K = 4 in every round")
    expect(results).to_contain_text(re.compile(r"tokens equal our speculative lane's|part from ours at token"))
    expect(results).to_contain_text("× our speculative lane")
    save_screenshot(page, tmp_path, "screenshot-genai.png")


def animation_frames_per_s(page, seconds: float = 3.0) -> float:
    """Animation frames the page ran per second over `seconds`, from a Chromium trace (FireAnimationFrame events)."""
    import json

    browser = page.context.browser
    browser.start_tracing(page=page, categories=["devtools.timeline"])
    page.wait_for_timeout(seconds * 1000)
    trace = json.loads(browser.stop_tracing())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return sum(1 for event in events if event.get("name") == "FireAnimationFrame") / seconds


def test_an_idle_page_draws_no_frames(app_url, page):
    """Gradio's status trackers tick on every animation frame once a tracker left pending (60 a second on an idle
    page: 1.5 CPU s per 20 s); the page drops those ticks (page.QUIET_TRACKERS_JS), so an idle page draws nothing."""
    from playwright.sync_api import expect

    page.goto(app_url)
    expect(page.locator("#status")).to_contain_text("Ready", timeout=STARTUP_S * 1000)
    page.wait_for_timeout(4000)  # the charts' first drawing animates for a second or two (~34 frames/s then)
    assert animation_frames_per_s(page) <= 1  # 60 without the fix
    page.goto("about:blank")  # the same measure sees a page that does animate
    page.set_content("<script>const f = () => requestAnimationFrame(f); f();</script>")
    assert animation_frames_per_s(page, 1.0) >= 20


def test_the_page_fits_a_phone(app_url, page, tmp_path):
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(app_url)
    expect(page.locator("#status")).to_contain_text("Ready", timeout=STARTUP_S * 1000)
    page.wait_for_timeout(800)  # let the charts finish drawing
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing sticks out sideways
    assert status_overlaps(page) == []
    save_screenshot(page, tmp_path, "screenshot-phone.png")


def test_a_visitor_queued_behind_api_clients_sees_their_place_counting_down_and_stop_leaves_the_queue(app_url, page,
                                                                                                      tmp_path):
    """Three API clients hold the machine; the visitor who presses Generate reads their place within a second, sees it
    count down, and Stop while still waiting leaves the queue: a client queued behind moves up."""
    from gradio_client import Client
    from playwright.sync_api import expect

    from specdemo.ui.handlers import OUTPUTS
    from specdemo.ui.page import INPUTS
    from specdemo.serve.values import PageValues

    clients = iter(range(1, 100))

    def submit(instruction: str, tokens: int):
        """A run from an API client of its own address (conftest.app_server: this machine is a named proxy)."""
        values = {**vars(PageValues(max_new_tokens=tokens, k_auto=False)), "instruction": instruction}
        client = Client(app_url, verbose=False, headers={"X-Forwarded-For": f"192.0.2.{next(clients)}"})
        return client.submit(*[values[name] for name in INPUTS], api_name="/generate")

    def latest_status(job) -> str:
        """The last status line the job was sent (an update that left the status as it was sends none)."""
        sent = [output[OUTPUTS.index("status")] for output in job.outputs()]
        return next((status for status in reversed(sent) if isinstance(status, str)), "")

    def place(job) -> int | None:
        found = re.search(r"(\d+) runs? ahead", latest_status(job))
        return int(found.group(1)) if found else None

    expect.set_options(timeout=30_000)
    page.goto(app_url)
    status = page.locator("#status")
    expect(status).to_contain_text("Ready", timeout=STARTUP_S * 1000)
    ahead = [submit(f"Write a Python function number {i} that adds two numbers.", 32) for i in range(3)]
    deadline = time.monotonic() + 60
    while not any(latest_status(job).startswith("Waiting") for job in ahead) and time.monotonic() < deadline:
        time.sleep(0.2)  # the clients are in line (one runs, the others wait)
    page.locator("#generate").click()
    expect(status).to_contain_text(re.compile(r"Waiting for the machine: \d+ runs? ahead of you"), timeout=1000)
    first = int(re.search(r"(\d+) runs? ahead", status.inner_text()).group(1))
    page.locator("#status").screenshot(path=str(tmp_path / "queue.png"))
    if os.environ.get("SPECDEMO_REFRESH_SCREENSHOT") == "1":
        shutil.copy(tmp_path / "queue.png", ROOT / "assets" / "screenshot-queue.png")
    behind = submit("Write a haiku about queues.", 8)  # a client in line behind the visitor
    expect(status).to_contain_text(re.compile(rf"Waiting for the machine: {first - 1} runs? ahead"), timeout=RUN_MS)
    while place(behind) is None:
        time.sleep(0.2)
    before = place(behind)
    page.locator("#stop").click()
    expect(status).to_contain_text("You left the queue; nothing was run.")
    deadline = time.monotonic() + 30
    while (place(behind) or 0) >= before:  # the client behind moves up: the visitor's place is gone
        assert time.monotonic() < deadline, latest_status(behind)
        time.sleep(0.2)
    for job in [*ahead, behind]:
        job.result(timeout=RUN_MS / 1000)
