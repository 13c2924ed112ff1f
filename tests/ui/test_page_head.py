"""The page's head middleware (ui/asgi.py FirstInHead) on a tiny app called as the server calls it (raw ASGI): what it
inserts, and what it must leave as it was."""

import asyncio

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from specdemo.ui.asgi import FirstInHead

PAGE = b"<html><head><title>t</title></head><body>hello</body></html>"
SCRIPT = "<script>quiet()</script>"


def home(request):
    response = HTMLResponse(PAGE)
    response.set_cookie("a", "1")
    response.set_cookie("b", "2")
    return response


def request(method: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """(response headers as sent, body) of `method` / on the tiny app behind FirstInHead."""
    app = FirstInHead(Starlette(routes=[Route("/", home)]), html=SCRIPT)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": "/", "raw_path": b"/", "root_path": "", "query_string": b"", "headers": [(b"host", b"test")],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["headers"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def values(headers, name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def test_the_html_goes_first_in_the_head_and_the_length_counts_it():
    headers, body = request("GET")
    assert body == PAGE.replace(b"<head>", b"<head>" + SCRIPT.encode())
    assert values(headers, b"content-length") == [str(len(body)).encode()]


def test_every_set_cookie_header_survives():
    cookies = values(request("GET")[0], b"set-cookie")
    assert len(cookies) == 2 and cookies[0].startswith(b"a=1") and cookies[1].startswith(b"b=2")


def test_head_gives_get_s_headers_and_no_body():
    (get, _), (head, body) = request("GET"), request("HEAD")
    assert body == b"" and head == get  # the same content-length and cookies, in the same order


def test_what_gradio_imports_at_its_first_event_is_imported_before_a_visitor_comes():
    """Gradio enters a matplotlib backend manager around every event: the first one imported matplotlib, 1.4-1.9 s of
    the first visitor's first run on a 2-core Zen 3. launch() pays it on a thread while the models load."""
    import subprocess
    import sys

    code = ("import sys; from specdemo.ui import page; assert 'matplotlib' not in sys.modules; "
            "page.enter_events_once(); print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
