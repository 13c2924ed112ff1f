"""ASGI middleware around Gradio's app: what the page's server does before and after Gradio sees a request. No gradio
here (starlette's Middleware wraps these in page.py).

- OneLineErrors: a request that makes Gradio's app raise (a malformed API call: an unknown fn_index, a wrong type)
  gets a short error response and leaves one line in the server's terminal, not uvicorn's traceback; the page and
  every other visitor carry on.
- FirstInHead: a script put first in the page's <head>, before any of Gradio's (page.QUIET_TRACKERS_JS).
- Closed: routes of Gradio's that the page does not use (the upload route: the page takes no files) answer 403 with a
  sentence, before Gradio sees the request.
"""

from __future__ import annotations

import sys


class OneLineErrors:
    """ASGI middleware: an exception from the app becomes one line on standard error (the request's method and path,
    the exception's type and message) and, if the response has not started, a 500 with a one-sentence body."""

    def __init__(self, app, stream=None):
        self.app, self.stream = app, stream

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def track(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, track)
        except Exception as error:  # noqa: BLE001 - any request's failure is this one line, whatever raised it
            print(f"refused a request the page's API could not handle: {scope.get('method', '')} {scope.get('path', '')}: "
                  f"{type(error).__name__}: {str(error)[:200]}", file=self.stream or sys.stderr, flush=True)
            if not started:
                body = b"The page could not handle this request; check the API call's fields."
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})


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




class Closed:
    """ASGI middleware: a request to one of `routes` (a path, with or without a trailing slash, any method) answers 403
    with that route's sentence; its body is never read, so nothing it carries is kept."""

    def __init__(self, app, routes: dict[str, str]):
        self.app, self.routes = app, routes

    async def __call__(self, scope, receive, send):
        sentence = self.routes.get(scope.get("path", "").rstrip("/")) if scope["type"] == "http" else None
        if sentence is None:
            return await self.app(scope, receive, send)
        body = sentence.encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
