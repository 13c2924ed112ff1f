"""The line under the page's status: the background work (serve/tuning.py) followed as it runs, and what its tunes
changed. The page binds `follow` to its load event; no gradio here."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import AsyncIterator

from specdemo.learning.profile import machine_profile
from specdemo.settings import CONFIGURATIONS, RunSettings
from specdemo.serve import tuning
from specdemo.serve.engines import KEPT
from specdemo.serve.server import Server
from specdemo.ui import render


async def follow(server: Server, poll_s: float = 2.0, settle_s: float = 900.0) -> AsyncIterator[str]:
    """Page load: the background work's line (render.render_background) whenever it changes, until the work ends.
    Asked on the server every `poll_s` seconds while the work runs (reading only what its log gained); the browser
    receives nothing until the line changes, and nothing at all where there is no work. Waits for the models first,
    as the work starts once they are ready and the page has learnt the rest of the machine in turns between runs (up
    to `settle_s` seconds more for the server to start it)."""
    # Only the loading's Event: holding the Loading would keep its engine alive after a tune replaces it (2 GiB).
    loaded = server.engines.loading_for(KEPT, RunSettings(), True, refresh=False).done
    while not loaded.is_set():
        await asyncio.sleep(poll_s)
    for _ in range(int(settle_s / poll_s)):
        if server.background.decided():
            break
        await asyncio.sleep(poll_s)
    work, last = server.background.current, None
    while work is not None:
        progress = work.progress()
        progress = replace(progress, passed_over=progress.passed_over + not_measured(progress))
        line = render.render_background(progress, applied(progress))
        if line != last:
            yield line
            last = line
        if progress.state != "running":
            return
        await asyncio.sleep(poll_s)


def applied(progress) -> str:
    """What the finished tune steps changed, in words ("the default target tuned at 17:20: 18% faster than the
    defaults"): the page compiles under it from the next run on."""
    profile, out = machine_profile(), []
    if tuning.TUNING in progress.finished:
        out.append(f"the default target {profile.gain(RunSettings().target) or 'kept its defaults'}")
    out += [f"the {name} configuration's target {profile.gain(target) or 'kept its defaults'}"
            for name, (target, _) in CONFIGURATIONS.items() if tuning.configuration_tune(name) in progress.finished]
    return "; ".join(out)


def not_measured(progress) -> tuple[str, ...]:
    """The drafts a finished draft plan of the default pair left unmeasured, as they could not pay here, as one more
    thing the work did not do."""
    if tuning.TUNING not in progress.finished and tuning.PLANNING not in progress.finished:
        return ()
    options = machine_profile().planned_options(RunSettings().draft)
    left = [o.describe().replace(", ", " ") for o in options if not o.measured]  # "int4 head 8k"
    if not left:
        return ()
    return (f"measuring {'any draft' if len(left) == len(options) else ', '.join(left)} for the draft plan",)
