"""What a refused request leaves in the server's terminal (ui/asgi.py OneLineErrors, Lines), on tiny apps called as the
server calls them (raw ASGI): a refusal after the answer started ends the answer and says nothing, and however many
refusals a client sends, the terminal gets a bounded number of lines a minute."""

import asyncio
import io

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse
from starlette.routing import Route

from specdemo.ui.asgi import Lines, OneLineErrors


def stream_then_404(request):
    """As Gradio's /queue/data and /call/<name>/<event id> answer a session or event they do not know: the stream has
    started when the refusal is raised."""
    async def events():
        yield b'data: {"msg": "unexpected_error", "message": "404: Not Found"}\n\n'
        raise HTTPException(404, "Not Found")
    return StreamingResponse(events(), media_type="text/event-stream")


def stream_then_fail(request):
    async def events():
        yield b"data: one\n\n"
        raise ValueError("a bug of ours")
    return StreamingResponse(events(), media_type="text/event-stream")


def call(app, path: str) -> list[dict]:
    """The messages `app` sends for GET `path`."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    sent, requests = [], iter([{"type": "http.request", "body": b"", "more_body": False}])

    async def receive():  # the request, then a client that stays connected
        return next(requests, None) or await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def app_and_terminal(lines_per_minute: int = 20) -> tuple[OneLineErrors, io.StringIO]:
    terminal = io.StringIO()
    routes = [Route("/refused", stream_then_404), Route("/failed", stream_then_fail)]
    return OneLineErrors(Starlette(routes=routes), lines=Lines(lines_per_minute, stream=terminal)), terminal


def test_a_refusal_after_the_answer_started_ends_the_answer_and_prints_nothing():
    """The client was told in the stream; uvicorn, left an answer without its end, printed a line of its own."""
    app, terminal = app_and_terminal()
    sent = call(app, "/refused")
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert terminal.getvalue() == ""


def test_a_failure_after_the_answer_started_ends_the_answer_with_one_line():
    app, terminal = app_and_terminal()
    sent = call(app, "/failed")
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert terminal.getvalue().splitlines() == ["refused a request the page's API could not handle: GET /failed: "
                                                "ValueError: a bug of ours"]


def test_a_hundred_failures_print_the_minute_s_lines_then_one_saying_the_rest_are_not_printed():
    app, terminal = app_and_terminal(lines_per_minute=3)
    for _ in range(100):
        call(app, "/failed")
    lines = terminal.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("more refused requests this minute are not printed")


def test_the_lines_of_a_new_minute_are_printed_again():
    now, terminal = [0.0], io.StringIO()
    lines = Lines(2, stream=terminal, clock=lambda: now[0])
    for i in range(5):
        lines.say(f"refused {i}")
    now[0] = 61.0
    lines.say("refused again")
    assert terminal.getvalue().splitlines() == [
        "refused 0", "refused 1", "more refused requests this minute are not printed (at most 2 lines a minute)",
        "3 refused requests were not printed", "refused again"]
