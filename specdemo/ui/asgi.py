"""ASGI middleware around Gradio's app: what the page's server does before and after Gradio sees a request. No gradio
here (starlette's Middleware wraps these in page.py).

- OneLineErrors: a request that makes Gradio's app raise (a malformed API call: an unknown fn_index, a wrong type)
  gets a short error response and leaves one line in the server's terminal, not uvicorn's traceback; the page and
  every other visitor carry on. A refusal in an answer already started ends it quietly.
- Lines: the terminal's lines about refusals, a bounded number a minute.
- FirstInHead: a script put first in the page's <head>, before any of Gradio's (page.QUIET_TRACKERS_JS).
- RefusedIs400: a direct call (/run/) that the page refused answers 400, not Gradio's 500 for every error.
- Closed: routes of Gradio's that the page does not use (the upload route: the page takes no files) answer 403 with a
  sentence, before Gradio sees the request.
- CheckedComponentCalls: a malformed call to Gradio's component server answers 400 with a sentence, not 500.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from specdemo.text import shown

REFUSED = "Refused"  # the title of the error a refused call gets (page.Page), which RefusedIs400 recognises
LINE_CHARS = 200  # a value or message quoted in the terminal is cut to about this many characters
LINES_PER_MINUTE = 20  # lines about refused requests the terminal gets a minute, from every client together (Lines)


def one_line(text: str, limit: int = LINE_CHARS) -> str:
    """`text` for one line of the terminal: whitespace runs (newlines too) as one space, control characters shown
    (text.shown), and if longer than `limit`, its middle cut out (a refusal's sentence ends after the value it quotes)."""
    text = shown(" ".join(text.split()), terminal=True)
    if len(text) <= limit:
        return text
    return f"{text[: limit * 3 // 4]} … ({len(text):,} characters) … {text[-limit // 4:]}"


class Lines:
    """The terminal's lines about refused requests and calls: at most `per_minute` in a minute, whoever sent them (a
    client sending junk by the hundred does not flood it), then one line saying the rest are not printed; the next
    minute begins with how many were not. Said from the server's event loop and the queue's threads alike."""

    def __init__(self, per_minute: int = LINES_PER_MINUTE, stream=None, clock=time.monotonic):
        self.per_minute, self.stream, self.clock = per_minute, stream, clock
        self._minute: float | None = None  # when the current minute began (clock seconds)
        self._said = self._unsaid = 0  # lines printed in it, and lines not
        self._lock = threading.Lock()

    def say(self, line: str) -> None:
        with self._lock:
            now = self.clock()
            if self._minute is None or now - self._minute >= 60:
                if self._unsaid:
                    self._print(f"{self._unsaid} refused requests were not printed")
                self._minute, self._said, self._unsaid = now, 0, 0
            if self._said < self.per_minute:
                self._said += 1
                self._print(line)
                return
            if not self._unsaid:
                self._print(f"more refused requests this minute are not printed (at most {self.per_minute} lines a "
                            "minute)")
            self._unsaid += 1

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)


class OneLineErrors:
    """ASGI middleware: an exception from the app becomes one line on standard error (the request's method and path,
    the exception's type and message, through `lines`) and, if the response has not started, a 500 with a one-sentence
    body. A response that had started is ended, and says nothing more when the exception was an HTTP refusal (a status
    under 500: Gradio's 404 for a session or event it does not know, said in its stream already)."""

    def __init__(self, app, lines: Lines | None = None):
        self.app, self.lines = app, lines or Lines()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = ended = False

        async def track(message):
            nonlocal started, ended
            started = started or message["type"] == "http.response.start"
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body", False))
            await send(message)

        try:
            await self.app(scope, receive, track)
        except Exception as error:  # noqa: BLE001 - any request's failure is this one line, whatever raised it
            # Starlette raises a RuntimeError from the HTTPException that a handler raised after its answer started.
            if not (started and getattr(error.__cause__, "status_code", 500) < 500):
                self.lines.say(f"refused a request the page's API could not handle: {scope.get('method', '')} "
                               f"{one_line(scope.get('path', ''))}: {type(error).__name__}: {one_line(str(error))}")
            if not started:
                await answer(send, 500, "The page could not handle this request; check the API call's fields.")
            elif not ended:  # else uvicorn says "ASGI callable returned without completing response"
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class FirstInHead:
    """ASGI middleware: `html` inserted first in the <head> of the page's HTML (GET or HEAD /), before any of Gradio's
    scripts. The response's headers pass as they came (two set-cookie stay two), but for content-length, which counts
    the page with `html` in it; HEAD is answered as GET would be, without the body, so both give the same length."""

    def __init__(self, app, html: str):
        self.app, self.html = app, html.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD") or scope["path"] not in ("/", ""):
            return await self.app(scope, receive, send)
        head_only = scope["method"] == "HEAD"
        start, body = None, []

        async def insert(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page, headers = b"".join(body), list(start["headers"])
            html = any(name.lower() == b"content-type" and b"text/html" in value for name, value in headers)
            if html and b"<head>" in page:
                page = page.replace(b"<head>", b"<head>" + self.html, 1)
                headers = [(name, value) for name, value in headers if name.lower() != b"content-length"]
                headers.append((b"content-length", str(len(page)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": b"" if head_only else page})

        await self.app({**scope, "method": "GET"}, receive, insert)


class RefusedIs400:
    """ASGI middleware: Gradio answers a direct call (POST /gradio_api/run/<name>, or its old alias /api/) 500 whatever
    went wrong; a call the page refused (its error titled REFUSED) answers 400 with the same body: the caller sent
    something wrong, the server did not fail."""

    PATHS = ("/gradio_api/run/", "/gradio_api/api/")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope.get("path", "").startswith(self.PATHS):
            return await self.app(scope, receive, send)
        start = None

        async def answer(message):
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 500:
                start = message  # held until the body says whether it is a refusal
                return
            if start is not None and message["type"] == "http.response.body":
                status = 400 if _is_refusal(message.get("body", b"")) else 500
                await send({**start, "status": status})
                start = None
            await send(message)

        await self.app(scope, receive, answer)


def _is_refusal(body: bytes) -> bool:
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("title") == REFUSED


class Closed:
    """ASGI middleware: a request to one of `routes` (a path, with or without a trailing slash, any method) answers 403
    with that route's sentence; its body is never read, so nothing it carries is kept."""

    def __init__(self, app, routes: dict[str, str]):
        self.app, self.routes = app, routes

    async def __call__(self, scope, receive, send):
        sentence = self.routes.get(scope.get("path", "").rstrip("/")) if scope["type"] == "http" else None
        if sentence is None:
            return await self.app(scope, receive, send)
        await answer(send, 403, sentence)


class CheckedComponentCalls:
    """ASGI middleware: a call to Gradio's component server (POST /gradio_api/component_server) whose body is not one
    (a JSON object naming a session, one of `components` and a function, with data) answers 400 with a sentence; Gradio
    answered 500, its parsing failing (issue 62). A call of that shape goes on as it came (Gradio answers 404 when the
    component has no such function, as none on this page has). Bodies over `max_bytes` are refused unread."""

    PATH = "/gradio_api/component_server"

    def __init__(self, app, components: set[int], max_bytes: int):
        self.app, self.components, self.max_bytes = app, components, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != self.PATH:
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more and len(body) <= self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body, more = body + message.get("body", b""), message.get("more_body", False)
        sentence = (f"A component server call is at most {self.max_bytes:,} bytes." if more or len(body) > self.max_bytes
                    else self.malformed(body))
        if sentence:
            return await answer(send, 400, sentence)
        told = False

        async def again():  # the body read here, then whatever the client sends next
            nonlocal told
            if told:
                return await receive()
            told = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, again, send)

    def malformed(self, body: bytes) -> str:
        """Why `body` is no component server call, in a sentence; "" when it is one."""
        try:
            call = json.loads(body)
        except ValueError:
            return "A component server call is a JSON object; this body is not JSON."
        if not (isinstance(call, dict) and isinstance(call.get("session_hash"), str) and "component_id" in call
                and isinstance(call.get("fn_name"), str) and "data" in call):
            return "A component server call is a JSON object with session_hash, component_id, fn_name and data."
        component = call["component_id"]
        if isinstance(component, bool) or not isinstance(component, int) or component not in self.components:
            return f"This page has no component {one_line(repr(component), 40)}."
        return ""


async def answer(send, status: int, sentence: str) -> None:
    """A whole short answer: `status` and `sentence` as plain text."""
    body = sentence.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
