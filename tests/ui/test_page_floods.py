"""Floods a public page must hold (issue 50): what one stranger can send the page over plain HTTP and gradio_client, on
the real page without its models (conftest.page_server: up in seconds, nothing run). Figures: docs/reliability.md."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from specdemo.serve import waiting
from specdemo.ui.asgi import one_line
from specdemo.ui.handlers import OUTPUTS
from specdemo.ui.page import INPUTS
from specdemo.serve.values import PageValues

UPLOADS, UPLOAD_BYTES = 300, 60_000  # what one client sent in the issue: all kept, 19.3 MB in 1.5 s


def status_and_body(request: urllib.request.Request | str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def upload(url: str, name: str, size: int) -> urllib.request.Request:
    """A POST of one file to Gradio's upload route, as its client sends it."""
    boundary = "specdemo-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + b"x" * size + f"\r\n--{boundary}--\r\n".encode()
    return urllib.request.Request(url + "gradio_api/upload", body,
                                  {"Content-Type": f"multipart/form-data; boundary={boundary}"})


def kept_bytes(folder) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.exists() else 0


def test_300_uploads_from_one_client_are_refused_with_a_sentence_and_nothing_is_kept(page_server):
    answers = {status_and_body(upload(page_server.url, f"file-{i}.bin", UPLOAD_BYTES)) for i in range(UPLOADS)}
    assert answers == {(403, "This page takes no files.")}
    assert kept_bytes(page_server.gradio_files) <= 1 << 20, "at most 1 MB of what visitors sent may be kept"


def test_deep_links_are_off_so_no_session_s_state_is_written_to_a_served_file(page_server):
    assert status_and_body(page_server.url + "gradio_api/deep_link?session_hash=anyone") == \
        (403, "Deep links are off on this page.")


def test_gradio_s_cancel_route_is_closed_so_no_visitor_ends_another_s_run(page_server):
    """Issue 62: given A's event id, visitor B ended A's run through /gradio_api/cancel; the page stops a run with its
    own Stop (which names the run its page started), so the route answers 403 before Gradio reads the body."""
    body = json.dumps({"session_hash": "someone-else", "fn_index": 0, "event_id": "their-event"}).encode()
    request = urllib.request.Request(page_server.url + "gradio_api/cancel", body, {"Content-Type": "application/json"})
    assert status_and_body(request) == (403, "This page's runs are stopped by their own Stop button.")


@pytest.mark.parametrize("path", ["monitoring", "monitoring/summary"])
def test_gradio_s_monitoring_is_off(page_server, path):
    assert status_and_body(page_server.url + path)[0] == 403


# ----------------------------------------------------------------------------- refused calls in the server's terminal


def arguments(**change) -> list:
    values = {**vars(PageValues(max_new_tokens=16, k_auto=False)), "instruction": "hi", **change}
    return [values[name] for name in INPUTS]


def post(url: str, body: dict) -> tuple[int, str]:
    return status_and_body(urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}))


def call_and_wait(server, **change) -> str:
    """A run asked for over /call/ (as curl would), then the event that ended it: 'error' for a refused one."""
    status, body = post(server.url + "gradio_api/call/generate", {"data": arguments(**change)})
    assert status == 200, body
    _, events = status_and_body(f"{server.url}gradio_api/call/generate/{json.loads(body)['event_id']}")
    return re.findall(r"event: (\w+)", events)[-1]


def test_ten_refused_calls_leave_ten_short_lines_in_the_terminal_and_no_traceback(page_server):
    before, client = len(page_server.log.read_text()), Client(page_server.url, verbose=False)
    for change in ({"max_new_tokens": 100_000}, {"k": 0}, {"target_device": "x" * 100_000},
                   {"drafter": "other/model-id"}, {"mode": "sideways"}, {"top_p": 5.0}):
        with pytest.raises(AppError) as refused:  # through Gradio's queue, as the page and gradio_client call
            client.predict(*arguments(**change), api_name="/generate")
        assert len(str(refused.value)) < 400
    assert [call_and_wait(page_server, **change) for change in ({"decoding": "beam"}, {"seed": "four"})] == ["error"] * 2
    assert post(page_server.url + "gradio_api/run/stop", {"data": []})[0] == 400  # too few values, straight to /run/
    assert post(page_server.url + "gradio_api/queue/join", {"data": [], "fn_index": 0, "session_hash": "s"})[0] == 200
    deadline = time.monotonic() + 10  # the queue prints its refusal as it processes the event, after answering
    while page_server.log.read_text()[before:].count("refused a call to") < 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    added = page_server.log.read_text()[before:]
    assert "Traceback" not in added and max(map(len, added.splitlines())) <= 2000
    assert added.count("refused a call to") == 10, added[-3000:]


def test_a_direct_call_with_too_few_values_answers_400_with_a_sentence_not_500(page_server):
    status, body = post(page_server.url + "gradio_api/run/stop", {"data": []})
    assert status == 400
    assert json.loads(body)["error"].startswith("An event handler (stop) didn't receive enough input values")


def test_a_hundred_junk_requests_print_at_most_a_handful_of_lines(page_server):
    """Issue 62: a session or event Gradio does not know is refused in a stream already started; each printed the page's
    line and uvicorn's "ASGI callable returned without completing response"."""
    before = len(page_server.log.read_text())
    for i in range(50):
        assert status_and_body(f"{page_server.url}gradio_api/queue/data?session_hash=junk-{i}")[0] == 200
        assert "404" in status_and_body(f"{page_server.url}gradio_api/call/generate/no-such-event-{i}")[1]
    time.sleep(1)
    added = page_server.log.read_text()[before:]
    assert len(added.splitlines()) <= 5 and "without completing response" not in added, added[-3000:]


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"session_hash": 1}', b'{"data": null}',
                                  b'{"session_hash": "s", "component_id": "x", "fn_name": "f", "data": null}',
                                  b'{"session_hash": "s", "component_id": 99999, "fn_name": "f", "data": null}'])
def test_a_malformed_component_server_call_answers_400_with_a_sentence_not_500(page_server, body):
    before = len(page_server.log.read_text())
    request = urllib.request.Request(page_server.url + "gradio_api/component_server", body,
                                     {"Content-Type": "application/json"})
    status, sentence = status_and_body(request)
    assert status == 400 and len(sentence.splitlines()) == 1 and sentence.endswith("."), sentence
    assert "Traceback" not in page_server.log.read_text()[before:]


@pytest.mark.parametrize("instruction", [123, ["x"]])
def test_an_instruction_that_is_not_text_is_refused_with_a_sentence_not_turned_into_text(page_server, instruction):
    """Issue 62: 123 and ["x"] were taken as "123" and "['x']". A refused call leaves the page's values as they were
    (Gradio updates no output of an event whose input it refused)."""
    job = Client(page_server.url, verbose=False).submit(*arguments(instruction=instruction), api_name="/generate")
    deadline = time.monotonic() + 30
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.done(), "the run was taken and waits in the line"
    with pytest.raises(AppError, match="The instruction must be text, got"):
        job.result()


def test_a_quoted_value_is_one_line_its_middle_cut_out_and_its_controls_shown():
    line = one_line("Value: " + "x" * 100_000 + "\n\x1b[31m is not in the list of choices")
    assert len(line) < 300 and "\n" not in line and "\x1b" not in line
    assert line.startswith("Value: xxx") and line.endswith("␛[31m is not in the list of choices")


# ----------------------------------------------------------------------------- a visitor's address


def test_eight_sessions_from_an_unnamed_client_each_naming_another_address_get_the_per_address_cap(page_server):
    """Issue 62: eight sessions from one loopback client, each naming another address in X-Forwarded-For, were all
    admitted. The page names no proxy here (conftest.page_server), so each counts as the peer it is: a few places, the
    rest refused with a sentence. The page's line is held, so admitted runs wait in it."""
    jobs = [Client(page_server.url, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{i}"})
            .submit(*arguments(instruction=f"Count to {i}."), api_name="/generate") for i in range(8)]
    deadline = time.monotonic() + 60
    while sum(job.done() for job in jobs) < 8 - waiting.PER_ADDRESS and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # time for one more refusal to show, if there were one
    refused = [dict(zip(OUTPUTS, job.result()))["status"] for job in jobs if job.done()]
    for job in jobs:
        job.cancel()
    assert len(refused) == 8 - waiting.PER_ADDRESS, refused
    assert all("your network address" in status for status in refused), refused


# ----------------------------------------------------------------------------- what the page keeps on disk


def test_the_app_keeps_gradio_s_cache_in_a_folder_only_its_user_can_open(tmp_path):
    """Issue 62: in /tmp/gradio/<hash>/ (0755) any user of the host listed every visitor's run file and fetched it from
    the page by its path. The app's process makes a 0700 folder of its own its temp folder before Gradio names its
    cache (the runs' downloads are written nowhere: serve/downloads.py)."""
    code = ("import os, stat, tempfile, app\n"
            "from gradio import route_utils, utils\n"
            "private = tempfile.gettempdir()\n"
            "print(private, oct(stat.S_IMODE(os.stat(private).st_mode)), os.stat(private).st_uid == os.getuid(),\n"
            "      utils.get_upload_folder(), route_utils.DEFAULT_TEMP_DIR, os.environ['TMPDIR'])\n")
    env = {**{k: v for k, v in os.environ.items() if k != "GRADIO_TEMP_DIR"}, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], env=env, capture_output=True,
                         text=True, timeout=300)
    private, mode, owned, *inside = out.stdout.split()[-6:]
    assert Path(private).parent == tmp_path and mode == "0o700" and owned == "True", out.stderr[-2000:]
    assert all(Path(folder).is_relative_to(private) for folder in inside), inside
    assert not Path(private).exists()  # removed when the process ends
