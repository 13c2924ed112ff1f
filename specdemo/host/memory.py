"""How much memory specdemo may still take, asked before every heavy step (a conversion, a compile of tune's, a
background step): the bound on the anonymous memory of the app's whole process tree (SPECDEMO_MEMORY_BUDGET, 8 GiB
by default: what a free Hugging Face Space's 16 GB leaves beside the Space's own processes, with room to spare), and
what the machine and its cgroup have left (a Space is a container with a cgroup v2 `memory.max`; the kernel ends a
process that goes past it).

    room = memory.room()            # Room(budget, used, cgroup_left, machine_left); room.left in bytes
    memory.wait_for(2 * 2**30, "compiling the target", log)   # True once there is room; False after a while

Anonymous memory, not RSS: the model files a process maps are page cache the kernel can drop and read again, while
what the plugin repacks and what Python allocates stays until it is freed (memory.anonymous: each process's share). The tree is the app's:
SPECDEMO_MEMORY_ROOT names its first process (the page sets it for its background steps, so a step counts the page
beside itself); without it, this process and its children.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BUDGET_VARIABLE = "SPECDEMO_MEMORY_BUDGET"  # bytes, or with a unit: 8G, 7.5GiB, 6000M
ROOT_VARIABLE = "SPECDEMO_MEMORY_ROOT"  # the pid of the app's first process, whose tree the bound covers
DEFAULT_BUDGET = 8 * 2**30
UNLIMITED = 2**60  # a cgroup v1 limit above this is "no limit" (the kernel writes 9223372036854771712)
WAIT_S = 600.0  # how long a step waits for room (a visitor's run loading GenAI's copy of the models) before it skips
POLL_S = 5.0
SKIPPED = 75  # exit status of a command that left its work for lack of memory (EX_TEMPFAIL: try again later)
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}


class Short(Exception):
    """Memory does not allow a step now. The message is a sentence for users."""


@dataclass(frozen=True)
class Room:
    """The memory a step may take now, and where the figure comes from (bytes)."""

    budget: int  # the bound on the tree's anonymous memory
    used: int  # anonymous memory the tree holds now
    cgroup_left: int | None  # what the tightest cgroup limit above us leaves, reclaimable file pages aside; None: no limit
    machine_left: int  # MemAvailable

    @property
    def left(self) -> int:
        return min(self.budget - self.used, self.machine_left,
                   self.cgroup_left if self.cgroup_left is not None else self.machine_left)

    def describe(self) -> str:
        """e.g. "3.1 GiB left: the app holds 4.9 GiB of its 8.0 GiB bound; the cgroup leaves 9.2 GiB, the machine 20.1 GiB"."""
        cgroup = "" if self.cgroup_left is None else f"the cgroup leaves {gib(self.cgroup_left)}, "
        return (f"{gib(max(self.left, 0))} left: the app holds {gib(self.used)} of its {gib(self.budget)} bound; "
                f"{cgroup}the machine {gib(self.machine_left)}")


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def budget(environ=os.environ) -> int:
    """The bound in bytes: SPECDEMO_MEMORY_BUDGET (a number of bytes, or with a binary unit: 8G, 7.5GiB, 6000M), else
    8 GiB. Raises ValueError with a sentence for a value it cannot read."""
    text = environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([A-Za-z]*)", text)
    if not match or match.group(2).upper() not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"{BUDGET_VARIABLE}={text!r} is not an amount of memory; write e.g. 8G, 7.5GiB or 6000M")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def anonymous(pid: int, proc: Path = Path("/proc")) -> int:
    """A process's anonymous memory in bytes: Pss_Anon, so that the pages a parent and the child it forked share until
    the child runs another program count once between them, as their cgroup charges them (summed RssAnon counted a
    2.4 GiB conversion twice for the instant a child of it was forked); RssAnon where the kernel gives no Pss_Anon;
    0 for a process gone. Reading smaps_rollup walks the process's pages (0.1 s for a bench holding GenAI's
    pipelines): poll it in seconds, not milliseconds."""
    pss = _kib_field(proc / str(pid) / "smaps_rollup", "Pss_Anon:")
    return pss if pss is not None else resident_anonymous(pid, proc)


def resident_anonymous(pid: int, proc: Path = Path("/proc")) -> int:
    """A process's RssAnon in bytes (0 for a process gone): what `anonymous` counts for a process with no child
    sharing its pages, read from its status in microseconds, for samplers that poll every few milliseconds."""
    return _kib_field(proc / str(pid) / "status", "RssAnon:") or 0


def _kib_field(path: Path, key: str) -> int | None:
    """Bytes of the "<key> <n> kB" line of a /proc file, None where the file or the line is missing."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def tree(root: int, proc: Path = Path("/proc")) -> list[int]:
    """`root` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:  # the parent is the 2nd field after the command, which may hold spaces and parentheses
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_anonymous(root: int, proc: Path = Path("/proc")) -> int:
    """Anonymous memory of `root`'s whole process tree, in bytes (each process's `anonymous`)."""
    return sum(anonymous(pid, proc) for pid in tree(root, proc))


def app_root(environ=os.environ) -> int:
    """The app's first process: SPECDEMO_MEMORY_ROOT if it names a live process, else this one."""
    pid = environ.get(ROOT_VARIABLE, "")
    return int(pid) if pid.isdigit() and Path(f"/proc/{pid}").is_dir() else os.getpid()


def cgroup_left(proc_cgroup: str, mount: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the tightest memory limit over our cgroup and its ancestors leaves (its usage less the inactive file pages
    the kernel reclaims first), from /proc/self/cgroup's text: cgroup v1's memory controller
    (memory.limit_in_bytes, memory.usage_in_bytes, total_inactive_file) or cgroup v2 (memory.max, memory.current,
    inactive_file). None when no limit applies or none can be read."""
    v1 = next((line.split(":", 2)[2] for line in proc_cgroup.splitlines()
               if line.count(":") >= 2 and "memory" in line.split(":")[1].split(",")), None)
    v2 = next((line.split(":", 2)[2] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if v1 is not None:
        return _tightest(mount / "memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    if v2 is not None:
        return _tightest(mount, v2, "memory.max", "memory.current", "inactive_file")
    return None


def _tightest(base: Path, path: str, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """The least room over the cgroup at `path` under `base` and its ancestors (a container sees its own cgroup as /)."""
    folder = base / path.strip("/")
    if not folder.is_dir():
        folder = base
    lefts = []
    while True:
        limit = _number(folder / limit_file)
        if limit is not None and limit < UNLIMITED:
            usage = _number(folder / usage_file) or 0
            lefts.append(limit - max(usage - _stat(folder / "memory.stat", inactive_key), 0))
        if folder == base or base not in folder.parents:
            break
        folder = folder.parent
    return min(lefts) if lefts else None


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.isdigit() else int(text)


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def machine_left(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable in bytes (the kernel's estimate of what can be taken without swapping)."""
    return _kib_field(meminfo, "MemAvailable:") or 0


def room(environ=os.environ) -> Room:
    """The memory a step may take now: the bound less what the app's tree holds, within what the cgroup and the
    machine have left."""
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        proc_cgroup = ""
    return Room(budget(environ), tree_anonymous(app_root(environ)), cgroup_left(proc_cgroup), machine_left())


# ---- what the heavy steps need (bytes of anonymous memory at their peak, measured on the default pair)

def compile_need(weights: int, fresh: bool = False) -> int:
    """One compile of a model once it has run, imported from the compiled-model cache (OpenVINO's CACHE_DIR): the
    plugin repacks the weights (`weights`, the IR's .bin) into buffers of its own, plus the calls' working memory (the
    1.66 GB INT8 target held 1.61 GiB, the 0.33 GB INT4 draft 0.30 GiB). A `fresh` compile, the first of its graph,
    also keeps the graph's fused projection weights (graph.fuse_projections), half the weights again (2.30 GiB and
    0.42 GiB; OpenVINO 2026.4, AMX Xeon)."""
    return (weights * 3 // 2 if fresh else weights) + 2**28


def tune_need(target_weights: int, draft_weights: int) -> int:
    """`python -m specdemo tune` at its peak: two compiles of the target (the incumbent and a challenger, imported from
    the compiled-model cache) and the draft beside them, each holding about its weights (1.61 and 0.30 GiB for the
    default pair), the incumbent up to a fresh compile's half the weights more (on the AMX Xeon an import of the
    reference's blob held 2.3 GiB instead of 1.5 in 3 of 7 first tunes: the challenger then did not fit); and 0.5 GiB
    for the interpreter with the tokenizer (torch kept out), the calls' working memory and a fidelity check's logits.
    For the INT8 target and the INT4 draft 4.7 GiB; measured 3.7–4.1 GiB at its peak (2-core AMX Xeon, OpenVINO 2026.4)."""
    return target_weights * 5 // 2 + draft_weights + 2**29


def conversion_need(gguf_bytes: int) -> int:
    """Converting a model whose GGUF (or other weights file) has `gguf_bytes`, at its peak: the weights made so far
    beside one batch of f32 and NNCF's temporaries (gguf_import.BATCH_BYTES). Measured for INT8, the largest: 2.34 GiB
    for the 1.04 GiB GGUF of the 1.5B target, 1.35 GiB for the 0.46 GiB of the 0.5B draft (INT4 1.67, gguf-mixed 1.83
    and 0.81; 2-core AMX Xeon), about 0.56 GiB + 1.7 times the GGUF; an eighth of a GiB more for room."""
    return 5 * 2**27 + gguf_bytes * 7 // 4


def wait_for(need: int, what: str, log: Callable[[str], None] = print, wait_s: float = WAIT_S,
             poll_s: float = POLL_S, measure: Callable[[], Room] = room) -> bool:
    """Whether `need` bytes are left for `what` ("compiling the target at group 64"), waiting up to `wait_s` seconds
    for them (a visitor's run may hold memory for a while), each wait and the giving up said in a line."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        now = measure()
        if now.left >= need:
            if said:
                log(f"memory: {what} goes on ({now.describe()})")
            return True
        if time.monotonic() >= deadline:
            log(f"memory: skipping {what}: it needs about {gib(need)} and there is {now.describe()}")
            return False
        if not said:
            log(f"memory: {what} waits: it needs about {gib(need)} and there is {now.describe()}")
            said = True
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.01)))
