"""The specdemo page: `python app.py [--host HOST] [--port PORT] [--share]`, then open http://127.0.0.1:7860.

Binds 127.0.0.1 unless told otherwise (--host, or GRADIO_SERVER_NAME as on Hugging Face Spaces) and
creates no public link unless --share; Gradio's /monitoring and deep links are off unless --monitoring, --deep-links.
The page itself lives in specdemo/ui/.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import time

from specdemo.host import compat, private_temp

compat.keep_torch_out()  # the server never needs torch: conversion runs in a child process
private_temp.use_private_temp()  # before Gradio names its cache: what one visitor gets, no other user of the host lists

from specdemo.models import kernels  # noqa: E402
from specdemo.serve import learning, tuning, waiting  # noqa: E402 - after keep_torch_out, so transformers does not load torch
from specdemo.serve.server import Server  # noqa: E402
from specdemo.settings import PROXIES_VARIABLE, PageSettings  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Autoregressive and speculative generation side by side, live.")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to bind (default 127.0.0.1 or $GRADIO_SERVER_NAME; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                        help="port to serve on (default 7860 or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also create a public gradio.live link")
    parser.add_argument("--monitoring", action="store_true",
                        help="serve Gradio's /monitoring dashboard (its URL is printed here; its summary answers anyone)")
    parser.add_argument("--deep-links", action="store_true",
                        help="serve Gradio's deep links (each writes a session's page state to a file it serves)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = PageSettings.from_environment()  # the proxies whose X-Forwarded-For is believed (SPECDEMO_PROXIES)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if os.environ.get("SPACE_ID") and not settings.proxies:  # a Space's visitors all come through its proxy
        print(f"note: no proxy named in {PROXIES_VARIABLE}, so every visitor counts as the Space's proxy, one address "
              f"with {waiting.PER_ADDRESS} places; set {PROXIES_VARIABLE}=10.0.0.0/8 (README.md)", flush=True)
    busy = port_in_use(args.host, args.port)
    if busy:  # before the models load: say so now, not after minutes of conversion
        print(f"error: {busy}; serve on another port with --port (e.g. python app.py --port {args.port + 1})",
              file=sys.stderr)
        return 1
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::', '') else args.host}:{args.port}"
    started = time.perf_counter()
    server = Server(settings=settings)  # the line, the engines, the runs, the background work, the visitors' memories
    kernels.say_once_if_unavailable(sys.stdout)  # the GGUF's blocks then run on the plugin's kernels, as before them
    # Convert (first start only), compile and measure the models quickly while the page comes up; say when runs can
    # start. Then learn the rest of this machine in turns between visitors' runs, and on a machine not tuned yet, tune
    # it in the background (specdemo/serve/tuning.py).
    def ready(engine) -> None:
        print(f"ready: {url} in {time.perf_counter() - started:.0f} s (models compiled, a first measurement of this "
              "machine; the rest is learnt in the background)", flush=True)
        log = lambda message: print(message, flush=True)  # noqa: E731
        steps = server.background.needed_steps(model_bytes=engine.target.describe()["size_on_disk_bytes"], log=log,
                                               costs=engine.costs)  # what could not pay on its quick curve is not run
        # A tune measures the cost curve and the noise of the compile it keeps: until then runs plan provisionally.
        learning.learn_in_turns(server, engine, log, then=lambda: start_background(server, steps),
                                pair_only=tuning.tunes_the_pair(steps))

    server.engines.prepare(on_ready=ready)
    from specdemo.ui import page  # Gradio's 3 s of imports while the models convert, not before they start

    page.launch(page.build(server), args.host, args.port, args.share, monitoring=args.monitoring, deep_links=args.deep_links)
    return 0


def port_in_use(host: str, port: int) -> str:
    """Why `port` cannot be served on `host` ("port 7860 on 127.0.0.1 is already in use"), or "" when it can."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closing socket is no user
        try:
            probe.bind((host, port))
        except OSError as error:
            reason = "is already in use" if error.errno == errno.EADDRINUSE else f"cannot be bound ({error.strerror})"
            return f"port {port} on {host} {reason}"
    return ""


def start_background(server: Server, steps: list) -> None:
    """The background work this machine still needs (serve/tuning.py), once the page's own learning is done."""
    background = server.background.start_if_needed(on_end=lambda work: say_background_done(server, work),
                                                   on_step=lambda work, step: apply_when_tuned(server, work, step),
                                                   steps=steps)
    labels = [label for label, _ in filter(tuning.runs, background.steps)] if background is not None else []
    if labels:  # the steps not run were said when they were decided
        print(f"in the background at low priority, paused while visitors' runs hold the machine: {'; '.join(labels)} "
              f"(minutes; log: {background.log_path}); what it learns is applied as soon as it is done, between "
              "visitors' runs", flush=True)


def plan_again(server: Server, steps: list) -> tuning.BackgroundWork | None:
    """A provisional draft plan made again (Background.plan_again_when_quiet), applied as soon as it is done."""
    return server.background.start(steps, on_step=lambda work, step: apply_when_tuned(server, work, step))


def apply_when_tuned(server: Server, background: tuning.BackgroundWork, step: str) -> None:
    """The default pair's tune (or draft plan) is done: apply it at once, while the rest of the background work (the
    other configurations) goes on; their engines compile under it when a visitor first runs them."""
    if step in (tuning.TUNING, tuning.PLANNING):
        print(f"{step}: done after {(time.perf_counter() - background.started) / 60:.1f} min in the background; "
              "applying the choice now, in a turn of its own between visitors' runs", flush=True)
        learning.apply_tune(server, log=lambda message: print(message, flush=True))


def say_background_done(server: Server, background: tuning.BackgroundWork) -> None:
    if background.state == "done":
        print(f"background work done in {background.seconds / 60:.1f} min"
              + ("" if background.tunes else ": the page's other configurations now load without converting"), flush=True)
        server.background.plan_again_when_quiet(start=lambda steps: plan_again(server, steps),
                                                log=lambda message: print(message, flush=True))
    else:
        print(f"the background work failed while {background.step} (exit {background.returncode}); "
              f"see {background.log_path}", flush=True)
        learning.learn_the_rest(server, log=lambda message: print(message, flush=True))  # what the page left to the tune


if __name__ == "__main__":
    sys.exit(main())
