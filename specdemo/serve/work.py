"""The background work this server started (at most one, serve/tuning.py's BackgroundWork) and the visitors' runs that
hold the machine meanwhile: from the first run's start to the last one's end, the work is stopped."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from specdemo.host import load, memory
from specdemo.learning.profile.choices import BUSY_PLANS
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.serve.tuning import PLAN_COMMAND, PLANNING, TUNE_AT_START, BackgroundWork, background_steps, runs
from specdemo.settings import RunSettings

QUIET_POLL_S = 60.0  # how often a provisional draft plan looks for a quiet host to be made again on


class Background:
    """The server's background work, if any, and how many visitors' runs hold the machine now."""

    def __init__(self):
        self.current: BackgroundWork | None = None  # the work this server started, if any
        self._holds = 0  # visitors' runs holding the machine now
        self._lock = threading.Lock()  # between a run taking or leaving the machine and the work starting
        self._decided = threading.Event()  # start_if_needed has run
        self._planning_again = False  # a thread waits for a quiet host to make a provisional draft plan again

    @contextmanager
    def machine_held(self) -> Iterator[None]:
        """Around a visitor's run: the work, if any, is stopped from the first run's start to the last one's end."""
        with self._lock:
            self._holds += 1
            if self._holds == 1 and self.current is not None:
                self.current.hold(True)
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                if self._holds == 0 and self.current is not None:
                    self.current.hold(False)

    def reserve(self, settings: RunSettings = RunSettings()) -> int:
        """Bytes of anonymous memory the work may still take beyond what its step holds now: what a visitor's optional
        models must leave free (engines.Admission), so that a visitor's choice never holds the work off. 0 once it has
        ended (or where there is none)."""
        work = self.current
        if work is None or work.state != "running":
            return 0
        left = [label for label, _ in filter(runs, work.steps[work.index - 1:])]
        profile = machine_profile()
        if any(label == PLANNING or label.startswith("tuning") for label in left):
            need = memory.tune_need(sources.weights_bytes(profile.resolve_precision(settings.target)),
                                    sources.weights_bytes(profile.resolve_precision(settings.draft)))
        else:
            need = max(memory.conversion_need(sources.source_bytes(m.source)) for m in (settings.target, settings.draft))
        return max(0, need - work.holds())

    def needed_steps(self, settings: RunSettings = RunSettings(), model_bytes: int = 0,
                     log: Callable[[str], None] = print, costs=None) -> list:
        """The background work this machine still needs (tuning.background_steps); [] where SPECDEMO_TUNE_AT_START=0,
        the pair is not on the CPU or this server started its work already."""
        if os.environ.get(TUNE_AT_START, "1") == "0" or not settings.target.device.upper().startswith("CPU") \
                or self.current is not None:
            return []
        return background_steps(settings, model_bytes, log, costs)

    def start_if_needed(self, settings: RunSettings = RunSettings(), model_bytes: int = 0,
                        on_end: Callable[[BackgroundWork], None] | None = None,
                        log: Callable[[str], None] = print,
                        on_step: Callable[[BackgroundWork, str], None] | None = None,
                        steps: list | None = None) -> BackgroundWork | None:
        """Start `steps` (by default needed_steps, decided now); None when nothing was started."""
        try:
            return self.start(self.needed_steps(settings, model_bytes, log) if steps is None else steps, on_end, on_step)
        finally:
            self._decided.set()

    def decided(self) -> bool:
        """Whether this server has settled its background work (started it, or found none to start)."""
        return self._decided.is_set() or os.environ.get(TUNE_AT_START, "1") == "0"

    def start(self, steps: list, on_end: Callable[[BackgroundWork], None] | None = None,
              on_step: Callable[[BackgroundWork, str], None] | None = None) -> BackgroundWork | None:
        """Run `steps` in the background (the visitors' runs stop it while they hold the machine); None if there are
        none."""
        if not steps:
            return None
        with self._lock:  # a run may hold the machine already: the first step then starts stopped
            self.current = BackgroundWork(steps, sources.specdemo_home() / "logs" / "background.log", on_end,
                                          stopped=self._holds > 0, on_step=on_step)
        return self.current

    def plan_again_when_quiet(self, start: Callable[[list], BackgroundWork | None],
                              draft=RunSettings().draft, log: Callable[[str], None] = print,
                              watch: Callable[[], load.HostLoad] = lambda: load.watch(load.WATCH_S),
                              poll_s: float = QUIET_POLL_S) -> threading.Thread | None:
        """A draft plan priced on a busy host (provisional: choices.provisional_plan), made again while this server
        runs, as soon as the host is quiet, rather than at the next start: every `poll_s` seconds, with no visitor's
        run holding the machine and no background work running, the host is watched (`watch`); when nothing else
        loads it, `start(steps)` runs `tune --draft-plan` as background work (app.py's, which applies the plan and says
        what changed). At most BUSY_PLANS plans; none while the plan is clean. None when there is nothing to make
        again, the background work is off, or a thread already waits."""
        if os.environ.get(TUNE_AT_START, "1") == "0" or not machine_profile().provisional_plan(draft):
            return None
        with self._lock:
            if self._planning_again:
                return None
            self._planning_again = True

        def plan_again() -> None:
            try:
                for _ in range(BUSY_PLANS):
                    host = self._wait_for_quiet(draft, watch, poll_s)
                    if host is None:
                        return
                    log("the draft plan was priced on a busy host (provisional): planning it again now that the host "
                        f"is quiet ({load.described(host)})")
                    work = start([(PLANNING, PLAN_COMMAND)])
                    while work is not None and work.state == "running":
                        time.sleep(min(poll_s, 5.0))
            finally:
                self._planning_again = False

        thread = threading.Thread(target=plan_again, daemon=True, name="specdemo-plan-again")
        thread.start()
        return thread

    def _wait_for_quiet(self, draft, watch: Callable[[], load.HostLoad], poll_s: float) -> load.HostLoad | None:
        """The first quiet watch of the host with the machine free, or None once the plan is no longer provisional."""
        while machine_profile().provisional_plan(draft):
            time.sleep(poll_s)
            work = self.current
            if self._holds or (work is not None and work.state == "running"):
                continue
            host = watch()
            if not host.busy():
                return host
        return None
