"""A new machine's background work: once the page is ready, the server runs what this machine still needs, each step a
child process at the lowest CPU priority: `python -m specdemo prepare` for the draft's other weight precision (so the
tune's draft plan can price it), `python -m specdemo tune` when there is no tune choice yet (and memory allows; on a
machine tuned already, `tune --draft-plan` when the plan has not priced a draft it could run), then `python -m specdemo
prepare` for each named configuration whose models are not converted yet (the "fastest" INT4 target), and `tune
--configuration NAME --target-only` for each configuration whose target is not tuned yet. The page never
waits for it. While a visitor's run holds the machine the work is stopped (SIGSTOP to the step's process group, a
conversion included), then continued: niced but running, the tune doubled a target step (92 ms against ~45 on a 2-core
Zen 5), since the lanes share caches and memory bandwidth, not only cores.
It ends with the server. What it chose is applied when it is done, without a restart: the page compiles the default
pair again in a turn of its own in the visitors' line (learning.apply_tune), and any engine compiled before the tune
last changed is compiled again when a run next asks for it (engines.loading_for).
Memory is bounded for the page and its steps together (specdemo/host/memory.py): each step counts the page beside itself,
waits for room before each conversion or compile, and leaves what does not fit with a line in the log (exit
memory.SKIPPED): that step is skipped and the next one runs. A step whose result could not change what runs here, given
the page's quick cost curve (the draft's INT8 for a draft plan where no draft could pay, the plan itself), is not run:
the terminal, the work's log and the page say so, one line each. The page says where the work stands (ui/background.py).
SPECDEMO_TUNE_AT_START=0 turns it off (the tests' and the benchmark's servers).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from specdemo.models import kernels, sources
from specdemo.host import memory
from specdemo.learning.profile import machine_profile
from specdemo.settings import AUTO, CONFIGURATIONS, FAITHFUL, FAITHFUL_PRECISIONS, RunSettings
from specdemo.serve.progress import Follower, Progress

ROOT = Path(__file__).resolve().parents[2]  # where `-m specdemo` resolves, whatever the server's working folder
TUNE_AT_START = "SPECDEMO_TUNE_AT_START"
TUNING = "tuning this machine"  # the step that chooses the compile settings
PLANNING = "planning the draft"  # the draft plan alone, on a machine tuned before its draft's other precision was ready
PLAN_COMMAND = [sys.executable, "-m", "specdemo", "tune", "--draft-plan"]  # the draft plan alone, as a step runs it
NICENESS = 19  # the lowest priority, for the moments between runs when the page itself has work
_PR_SET_PDEATHSIG = 1


def _in_the_child() -> None:
    """Lowest priority, and ended (SIGTERM) when the server ends, so no tune outlives the page that started it."""
    os.nice(NICENESS)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (AttributeError, OSError):  # not Linux: the tune may outlive the server
        pass


class BackgroundWork:
    """The background work, step after step, each a child process: `steps` are (what it does, command), e.g. ("tuning
    this machine", [python, -m, specdemo, tune]), or (what it would do, why it could not pay here): not run, said in
    the log. `state` is "running", then "done" or "failed" (the failed step's exit code in `returncode`); `step` is
    what runs now, `index` its number from 1. A step that leaves its work for lack of memory (exit memory.SKIPPED, the
    reason in its log) is skipped and the next one runs."""

    def __init__(self, steps: list[tuple[str, list[str]]], log_path: Path,
                 on_end: Callable[["BackgroundWork"], None] | None = None, stopped: bool = False,
                 on_step: Callable[["BackgroundWork", str], None] | None = None):
        self.steps = steps
        self.log_path = log_path
        self.state = "running"
        self.step = steps[0][0]
        self.index = 1  # the step running now, from 1
        self.finished: list[str] = []  # the steps that ended well, in order
        self.skipped: list[str] = []  # the steps that left their work for lack of memory (memory.SKIPPED)
        self.passed_over: list[str] = []  # the steps not run: their result could not change what runs here
        self.returncode: int | None = None
        self.started = time.perf_counter()
        self.seconds = 0.0
        self.on_end = on_end
        self.on_step = on_step  # called with each step's label as it ends well: a tune is applied before the rest runs
        self.process: subprocess.Popen | None = None
        self._lock = threading.Lock()  # between starting a step and signalling it
        self._stopped = stopped  # a visitor's run holds the machine: a step started now starts stopped
        self._follower = Follower()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
        # Run on a thread of its own that lives as long as the children: Linux sends the parent-death signal when the
        # *thread* that started a child ends (the loading thread that creates this ends at once).
        threading.Thread(target=self._run, daemon=True, name="specdemo-background").start()

    def _run(self) -> None:
        # Each step counts the page beside itself in the memory bound (specdemo/host/memory.py).
        environment = {**os.environ, memory.ROOT_VARIABLE: str(os.getpid())}
        for index, (label, command) in enumerate(self.steps, 1):
            self.step, self.index = label, index
            if not runs((label, command)):
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(skip_line(label, command) + "\n")
                self.passed_over.append(label)
                continue
            with self._lock:
                try:
                    with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
                        # Its own process group, so a stop reaches the processes it starts too (a conversion).
                        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                        stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
                                                        preexec_fn=_in_the_child, env=environment)
                except OSError:
                    self.returncode = -1
                    break
                if self._stopped:
                    self._signal(signal.SIGSTOP)
            self.returncode = self.process.wait()
            if self.returncode == memory.SKIPPED:  # it said why in the log; the next steps may still fit
                self.skipped.append(label)
                continue
            if self.returncode != 0:
                break
            self.finished.append(label)
            if self.on_step is not None:
                self.on_step(self, label)
        self.seconds = time.perf_counter() - self.started
        self.state = "done" if self.returncode in (None, 0, memory.SKIPPED) else "failed"  # None: none had to run
        if self.on_end is not None:
            self.on_end(self)

    def hold(self, stopped: bool) -> None:
        """Stop the work (SIGSTOP to the step's process group) or let it go on (SIGCONT)."""
        with self._lock:
            self._stopped = stopped
            self._signal(signal.SIGSTOP if stopped else signal.SIGCONT)

    def _signal(self, number: int) -> None:
        if self.state == "running" and self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, number)
            except (ProcessLookupError, PermissionError):  # it has just ended
                pass

    @property
    def tunes(self) -> bool:
        return any(label == PLANNING or label.startswith("tuning") for label, _ in filter(runs, self.steps))  # TUNING, kin

    def describe(self) -> str:
        """A few words for the model panel."""
        if self.state == "running":
            return f"{self.step} in the background, at low priority; applied as soon as it is done"
        skipped = f" ({', '.join(self.skipped)}: skipped, memory did not allow it)" if self.skipped else ""
        skipped += f" ({', '.join(self.passed_over)}: not run, it could not pay here)" if self.passed_over else ""
        if self.state == "done":
            return ("tuned" if self.tunes and TUNING not in self.skipped else "done") + \
                f" in the background; applied between visitors' runs{skipped}"
        return f"the background work failed while {self.step} (exit {self.returncode}); see {self.log_path}"

    def progress(self) -> Progress:
        """Where the work stands, for the page's line (serve/progress.py)."""
        return self._follower.read(self)

    def holds(self) -> int:
        """Anonymous memory the running step's processes hold now, in bytes."""
        process = self.process
        if self.state != "running" or process is None or process.poll() is not None:
            return 0
        return memory.tree_anonymous(process.pid)

    @property
    def held(self) -> bool:
        """Whether a visitor's run holds the machine, the work stopped meanwhile."""
        return self._stopped


def tunes_the_pair(steps: list) -> bool:
    """Whether `steps` tune the pair's target (and so measure its cost curve and batching noise afresh)."""
    return any(label == TUNING for label, _ in steps)


def configuration_tune(name: str) -> str:
    """The label of the step that tunes configuration `name`'s target."""
    return f"tuning the {name} configuration's target"


def runs(step: tuple) -> bool:
    """Whether a step of the work runs (a command), or is only said (why it could not pay here)."""
    return not isinstance(step[1], str)


def skip_line(label: str, why: str) -> str:
    """A step not run, in the terminal's and the work's log: one line."""
    return f"{label}: not run, as it could not change what runs here: {why}"


def cannot_pay(settings: RunSettings, costs, precision: str = "") -> str:
    """Why no draft the plan could choose (given `precision`: that precision's full head) could pay on `costs`, the
    page's pair's quick curve, at its best case (draft_choice.hope: its step as cheap as its bits and head allow, its
    drafts accepted at CEILING), so preparing or planning it could not change what runs here; "" when one could, or
    nothing is known."""
    from specdemo.learning import draft_choice

    if costs is None or not costs.draft_s:
        return ""
    running = machine_profile().resolve(settings.draft)  # the draft the curve was measured with
    pool = [replace(running, precision=precision, head_tokens=0)] if precision else \
        draft_choice.candidates(settings.draft, lambda candidate: True)
    config = sources.cached_folder(running) / "config.json"
    share = draft_choice.head_share(json.loads(config.read_text()) if config.is_file() else {})
    best = max((draft_choice.hope(s, running, 0, share, costs, settings.draft) for s in pool), key=lambda o: o.best_case)
    if draft_choice.could_change(best):
        return ""
    return (f"on this machine's cost curve {best.describe()} would give at best {best.best_case:.2f}× at any "
            f"acceptance it could reach{', and no other draft more' if not precision else ''}")


def background_steps(settings: RunSettings, model_bytes: int, log: Callable[[str], None] = print,
                     costs=None) -> list:
    """What this machine still needs: the draft's other weight precisions, so that the tune's draft plan can price them
    (a draft left to the plan, and only a 0.5B draft: ~1 min), beside the faithful race's other layout where the tune
    will race it (two conversions at once, memory allowing: ~20 s sooner than in turn); the tune when there is no choice for the pair's target
    or, for a faithful target, no faithful layout raced yet (target_choice, which tune runs first), and the memory
    bound leaves room for it beside the page (memory.tune_need, `model_bytes` the target's weights on disk); and each
    named configuration's models that are not prepared yet, then their targets' tunes, unless the configuration's target
    is a plugin layout that cannot beat the faithful target on specdemo's kernels here (target_choice.plugin_may_win).
    Each step checks the memory again as it goes, and waits or skips (memory.wait_for). Given `costs` (the page's pair's
    quick curve), a draft precision or a draft plan that could not pay here (cannot_pay) is a step not run, said in
    `log`."""
    from specdemo.learning import target_choice
    from specdemo.learning.candidates import CPU
    from specdemo.learning.draft_choice import to_prepare

    profile = machine_profile()
    unraced = settings.target.precision == FAITHFUL and profile.faithful_choice(settings.target) is None
    steps = []
    if settings.draft.precision == AUTO:
        steps += [(f"preparing the draft at {p}, for the draft plan", cannot_pay(settings, costs, p) or
                   [sys.executable, "-m", "specdemo", "prepare", "--draft-precision", p])
                  for p in to_prepare(settings.draft)
                  if not sources.is_prepared(replace(settings.draft, precision=p))]
    cpu = CPU.here()
    plugin_may_win = target_choice.plugin_may_win(profile.resolve_precision(settings.target).precision, cpu)
    room = memory.room()
    needed = memory.tune_need(model_bytes, sources.weights_bytes(profile.resolve_precision(settings.draft)))
    if unraced or profile.chosen(profile.resolve_precision(settings.target)) is None:  # tune races the layouts first
        if room.left >= needed:
            rivals = [p for p in kernels.runnable(FAITHFUL_PRECISIONS)
                      if not sources.is_prepared(replace(settings.target, precision=p))]
            if unraced and rivals and steps and runs(steps[-1]):  # the race's layout converted beside the draft
                label, command = steps.pop()
                why = "the faithful race" if plugin_may_win else "GenAI's lane"
                steps.append((f"{label}, and the target at {rivals[0]}, for {why}",
                              command + ["--target-precision", rivals[0]]))
            steps.append((TUNING, [sys.executable, "-m", "specdemo", "tune"]))
        else:
            log(f"not tuning this machine in the background: it needs about {memory.gib(needed)} of memory beside the "
                f"page and there is {room.describe()}; `python -m specdemo tune` does it when there is room")
    elif any(map(runs, steps)) or profile.needs_plan(settings.draft):  # tuned, but not every draft it could run priced
        steps.append((PLANNING, cannot_pay(settings, costs) or PLAN_COMMAND))
    idle = {name: "" if plugin_may_win or target.precision in (FAITHFUL, *FAITHFUL_PRECISIONS) else
            f"on this CPU ({cpu.describe()}) its {target.precision} target on OpenVINO's kernels is no faster than the "
            f"faithful target on specdemo's kernels, and its answers are another model's (measured on this CPU class, "
            f"not on this machine: its single step 1.06x ours; `python -m specdemo prepare --configuration {name}` "
            f"prepares it)" for name, (target, _) in CONFIGURATIONS.items()}
    steps += [(f"preparing the {name} configuration's models",
               idle[name] or [sys.executable, "-m", "specdemo", "prepare", "--configuration", name])
              for name, models in CONFIGURATIONS.items()
              if not all(sources.is_prepared(profile.resolve_precision(m)) for m in models)]
    # Every configuration's target runs tuned: the others' targets (the fastest one's INT4) are searched beside the
    # draft as tuned above, once their weights are prepared (the steps run in order).
    steps += [(configuration_tune(name),
               [sys.executable, "-m", "specdemo", "tune", "--configuration", name, "--target-only"])
              for name, (target, _) in CONFIGURATIONS.items()
              if (target.source, target.precision) != (settings.target.source, settings.target.precision)
              and profile.chosen(target) is None and room.left >= needed and not idle[name]]
    for label, why in [step for step in steps if not runs(step)]:
        log(skip_line(label, why))
    return steps
