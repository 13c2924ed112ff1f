"""The page's learning of the machine, in turns of its own in the visitors' line (the Server's): what a quickly
warmed-up engine still has to learn (learn_in_turns, learn_the_rest), and a new tune applied to the default pair
(apply_tune). Each runs on a thread of its own and lets visitors' runs have the machine; app.py starts them.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from specdemo.learning import measuring
from specdemo.run.engine import Engine
from specdemo.settings import RunSettings
from specdemo.serve.engines import KEPT
from specdemo.serve.values import MAX_K, as_sentence

if TYPE_CHECKING:
    from specdemo.serve.server import Server

LEARN_RETRY_S = 5.0  # how often learning that stopped for a visitor looks for the line to be empty again


def learn_in_turns(server: Server, engine: Engine, log=print, then=lambda: None, pair_only: bool = False,
                   retry_s: float = LEARN_RETRY_S) -> threading.Thread:
    """What a quickly warmed-up engine still has to learn of this machine (Engine.to_learn: the full cost curve, the
    batching noise, the acceptance evidence; `pair_only`, only the last, when a tune comes next and measures the rest
    for the compile it chooses), each step in a turn of its own in the visitors' line that lets visitors go first: a
    visitor's run that comes while the full measurement runs stops it (measuring.Interrupted, nothing kept), and it is
    taken again once the line is empty (looked for every `retry_s` seconds); then `then()` (the background work)."""

    def learn() -> None:
        try:
            while True:
                ticket = server.line.join(1, yields=True, work="learning this machine")
                try:
                    for _ in server.line.wait(ticket, threading.Event()):
                        pass
                    steps = engine.to_learn(MAX_K, log, interrupted=lambda: server.line.visitors_behind(ticket),
                                            pair_only=pair_only)
                    if not steps:
                        break
                    what, step = steps[0]
                    started = time.perf_counter()
                    step()
                    log(f"{what}: done in {time.perf_counter() - started:.0f} s, between visitors' runs")
                except measuring.Interrupted:
                    log("learning this machine stopped for a visitor's run; it goes on when the line is empty")
                finally:
                    server.line.leave(ticket, finished=False)
                while len(server.line):
                    time.sleep(retry_s)
        except Exception as error:  # the page runs on what it has; the terminal says what is missing
            log(f"could not finish learning this machine: {as_sentence(error)}")
        then()

    thread = threading.Thread(target=learn, daemon=True, name="specdemo-learn")
    thread.start()
    return thread


def learn_the_rest(server: Server, settings: RunSettings = RunSettings(), log=print) -> threading.Thread:
    """What the default pair left to a tune that did not end (the background work failed): learnt in turns, as after a
    start without one."""
    return learn_in_turns(server, server.engines.loading_for(KEPT, settings, True, refresh=False).wait(), log)


def apply_tune(server: Server, settings: RunSettings = RunSettings(), log=print) -> threading.Thread:
    """After this machine's tune changed (the background work, or `tune` in another terminal): the default pair compiled
    again under it, in a turn of its own in the line, so no visitor's run shares the machine with the compile and the
    next run starts on it. (Whatever a run asks for is compiled under the newest tune anyway: loading_for.)"""

    def apply() -> None:
        ticket = server.line.join(1, work="applying this machine's new tune")
        try:
            for _ in server.line.wait(ticket, threading.Event()):
                pass
            started = time.perf_counter()
            engine = server.engines.loading_for(KEPT, settings, True).wait()
            for _, step in engine.to_learn(MAX_K, log):  # the new compile's costs in full, its noise, in this turn
                step()
            log(f"applied this machine's tune in {time.perf_counter() - started:.0f} s (target "
                f"{engine.target.tuned or 'untuned'}; draft {engine.draft.tuned or 'untuned'}); no restart needed")
        except Exception as error:  # the page's next run says it again, in its own status line
            log(f"could not apply this machine's tune: {as_sentence(error)}")
        finally:
            server.line.leave(ticket, finished=False)

    thread = threading.Thread(target=apply, daemon=True, name="specdemo-apply-tune")
    thread.start()
    return thread
