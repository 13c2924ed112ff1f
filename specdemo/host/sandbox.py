"""Running code a model wrote, contained by the kernel: each program in a sandbox of its own (time, memory, process and
file limits, no network, no view of the machine's files or processes, nothing outliving its run); it passes only if it
ran to its last line. Built with util-linux's `unshare` and `setpriv`; sandbox_init.py is the first process inside.
- New mount, PID, network, IPC and UTS namespaces and a new session: the program sees only its own processes, cannot
  signal the caller or read its /proc, and has no network (its loopback is its own, and down).
- A private root: /usr, /etc and this interpreter's installation read-only (no setuid, no devices), /dev's null, zero,
  full, random and urandom, its own /proc, and /tmp (its cwd and HOME), a small tmpfs, the only place it can write,
  gone with it.
- No capabilities and no way to gain any (empty bounding set, no_new_privs): user 65534 when the caller runs as root,
  else root of a user namespace mapping only the caller, stripped by securebits.
- Hard limits per process (address space, CPU seconds, file size, no core), and bounds over the whole program:
  PROCESS_LIMIT tasks and `memory_bytes`. As root with writable cgroups, a cgroup of the run's own under the caller's
  (v1's memory and pids, or v2's where the caller's cgroup delegates both), kernel-enforced, whose counters of refused
  forks and OOM kills say a bound was hit. Elsewhere a weaker fallback: RLIMIT_NPROC on the program's user (all its
  processes; as root, user 65534's across the machine) and the first process summing the tree's Pss every POLL_S,
  which misses what is allocated between two looks and memory no process maps (memfd, pipe buffers, the kernel's).
  A tree over a bound is ended at once: "process limit", "memory limit".
- A wall clock kept by the namespace's first process, which the program cannot signal; when it exits the kernel kills
  everything left in the PID namespace (setsid and double-forked descendants too) before the run returns, then the
  run's cgroup is removed, and any a killed caller left. stderr goes to a file, stdout nowhere.
- An end mark: a pass needs exit status 0 and a random mark written only once the program's last line has run
  (sandbox_init.py); sys.exit(0), os._exit(0), exec or a signal before the end fails.
The program runs under this interpreter's base installation (a venv's folder may be closed to user 65534), `-I`, with
the standard library. Not bubblewrap: not installed by default, and as root it maps the program's user onto root
outside, the owner of every root-only file it shows; util-linux is on every Debian, and setpriv switches to a real
unprivileged user. Where none of this is possible (not Linux, no util-linux, neither root nor unprivileged user
namespaces), `run_program` raises SandboxUnavailable rather than run the code unconfined; `missing()` says why.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from specdemo import strict_json
from specdemo.host.sandbox_init import Plan

TIME_LIMIT_S = 10.0  # wall clock per program; HumanEval's own harness allows 3 s, tests here include slow reference code
MEMORY_LIMIT_BYTES = 1 << 30  # address space of each process, and memory of the whole program
PROCESS_LIMIT = 64  # processes and threads of the whole program
FILE_LIMIT_BYTES = 1 << 20  # largest file the program may write
SCRATCH_BYTES = 16 << 20  # its /tmp: everything it writes, together
SCRATCH_FILES = 1024  # and how many files and folders
NOBODY = 65534  # the user and group the program runs as when the caller runs as root

_SETUP_S = 5.0  # allowance beyond the time limit for building and tearing down a sandbox, before the caller kills it
_REAP_S = 5.0  # how long a run's cgroup may take to empty once its sandbox is gone
_SHOWN = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64")  # of the host, read-only, when present
_INIT = str(Path(__file__).with_name("sandbox_init.py"))
_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
_TAIL_BYTES = 8192  # of the program's stderr, for the reason
_CGROUP_PREFIX = "specdemo-sandbox-"  # then the caller's process id: a cgroup whose caller is gone is swept
# Per cgroup hierarchy (v1's "memory" and "pids", v2's single one as ""), the counter that says a bound was hit.
_COUNTERS = {"memory": {"memory": ("memory.oom_control", "oom_kill")}, "pids": {"process": ("pids.events", "max")},
             "": {"memory": ("memory.events", "oom_kill"), "process": ("pids.events", "max")}}


class SandboxUnavailable(RuntimeError):
    """Generated code cannot be contained on this machine; the message is one sentence saying why and what to do."""


@dataclass(frozen=True)
class Verdict:
    """What running one program came to."""

    passed: bool  # it ran to its last line and exited with status 0
    reason: str  # "passed", "failed: <last line of stderr>", "failed: left before its end (exit status 0)",
    # "timed out after 10 s", "memory limit", "process limit", "file size limit", "CPU time limit"
    seconds: float  # wall time of the whole sandbox, its setup included


def run_program(source: str, time_limit_s: float = TIME_LIMIT_S, memory_bytes: int = MEMORY_LIMIT_BYTES) -> Verdict:
    """Run `source` in a sandbox under the limits above; passed when it runs to its last line and exits with status 0.
    Raises SandboxUnavailable, having run nothing, where this machine cannot contain it."""
    if refusal := missing():
        raise SandboxUnavailable(refusal)
    return _contain(source, time_limit_s, memory_bytes)


@functools.cache
def missing() -> str | None:
    """None when generated code can be contained here (checked once, by running an empty program in a sandbox);
    otherwise one sentence saying why not and how to allow it."""
    if sys.platform != "linux":
        return "generated code runs only in a sandbox made of Linux namespaces: run the bench on Linux"
    if absent := [tool for tool in ("unshare", "setpriv") if _tool(tool) is None]:
        return (f"generated code runs only in a sandbox made with util-linux's unshare and setpriv, and this machine "
                f"lacks {', '.join(absent)}: install util-linux (apt-get install util-linux)")
    try:
        verdict = _contain("pass", TIME_LIMIT_S, MEMORY_LIMIT_BYTES)
    except SandboxUnavailable as error:
        failure = str(error)
    else:
        if verdict.passed:
            return None
        failure = f"the sandbox for generated code failed to run an empty program ({verdict.reason})"
    return (f"{failure}: run the bench as root (in a container, one allowed to create namespaces), or allow unprivileged "
            "user namespaces (sysctl user.max_user_namespaces=10000 kernel.unprivileged_userns_clone=1; on Ubuntu also "
            "kernel.apparmor_restrict_unprivileged_userns=0)")


def _contain(source: str, time_limit_s: float, memory_bytes: int) -> Verdict:
    """One program through one sandbox, in a cgroup of its own where the machine gives one; raises SandboxUnavailable
    when the sandbox itself cannot be built."""
    with tempfile.TemporaryDirectory(prefix="specdemo-exec-") as outer:
        Path(outer, "program.py").write_text(source, encoding="utf-8")
        os.mkdir(os.path.join(outer, "root"))  # where the private root is mounted, inside the mount namespace only
        cgroup = _make_cgroup(memory_bytes)
        try:
            how, stderr, seconds = _sandbox(_plan(outer, time_limit_s, memory_bytes, cgroup), time_limit_s)
        finally:
            _remove_cgroup(cgroup)
    if how[0] == "finished":
        return Verdict(True, "passed", seconds)
    if how[0] == "timeout":
        return Verdict(False, f"timed out after {time_limit_s:g} s", seconds)
    if how[0] == "limit":
        return Verdict(False, f"{how[1]} limit", seconds)
    status = int(how[1]) if how[0] == "exit" else -int(how[1])
    if status == 0:
        return Verdict(False, "failed: left before its end (exit status 0)", seconds)
    return Verdict(False, _reason(status, stderr), seconds)


def _sandbox(plan: Plan, time_limit_s: float) -> tuple[list[str], str, float]:
    """Run the namespace's first process on `plan`: the words of its ending line (["timeout"] when the caller had to
    kill it), the tail of the program's stderr, and the seconds it all took."""
    outer = plan.outer
    with open(os.path.join(outer, "ending"), "w+b") as ending, open(os.path.join(outer, "stderr"), "w+b") as stderr:
        start = time.perf_counter()
        init = subprocess.Popen([*_namespaces(), sys.executable, "-I", "-S", _INIT, strict_json.dumps(asdict(plan))],
                                stdin=subprocess.DEVNULL, stdout=ending, stderr=stderr, env=_ENV,
                                start_new_session=True)
        try:
            init.wait(timeout=time_limit_s + _SETUP_S)
        except subprocess.TimeoutExpired:
            _stop(init)
            return ["timeout"], "", time.perf_counter() - start
        seconds = time.perf_counter() - start
        ending.seek(0)
        how = ending.read().decode("ascii", "replace").split()
        stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _TAIL_BYTES))
        text = stderr.read().decode("utf-8", "replace")
    if not how:
        raise SandboxUnavailable(f"the sandbox for generated code failed to start "
                                 f"({_last_line(text) or f'exit status {init.returncode}'})")
    return how, text, seconds


def _stop(unshare: subprocess.Popen) -> None:
    """Kill a sandbox the caller gave up on, and wait until nothing of it is left: unshare's --kill-child passes the
    kill on to its one child, the namespace's init, which the kernel lets exit only once it has killed all the rest."""
    try:
        init = os.pidfd_open(int(Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()[0]))
    except (OSError, IndexError):
        init = None  # not started yet, or the kernel does not list children: the namespace ends on its own
    unshare.kill()
    unshare.wait()
    if init is not None:
        select.select([init], [], [], _REAP_S)  # readable once it has exited
        os.close(init)


def _namespaces() -> list[str]:
    """unshare's command line up to the init's: new namespaces, the init as PID 1, killed if unshare is."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [_tool("unshare"), *user, "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child", "--"]


def _plan(outer: str, time_limit_s: float, memory_bytes: int, cgroup: dict[str, str]) -> Plan:
    """What sandbox_init.py builds and runs."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    shown = [path for path in _SHOWN if os.path.lexists(path)]
    for folder in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        if not any(folder == s or folder.startswith(s + "/") for s in shown):
            shown.append(folder)
    limits = {"RLIMIT_AS": memory_bytes, "RLIMIT_CPU": int(time_limit_s) + 1, "RLIMIT_FSIZE": FILE_LIMIT_BYTES,
              "RLIMIT_CORE": 0}
    if not cgroup:  # the fallback: it counts every process of the program's user, so it bounds the tree
        limits["RLIMIT_NPROC"] = PROCESS_LIMIT
    return Plan(outer, shown, NOBODY if os.geteuid() == 0 else 0, SCRATCH_BYTES, SCRATCH_FILES, _ENV,
                [*_identity(), python, "-I"], time_limit_s, limits, _cgroup_plan(cgroup), PROCESS_LIMIT, memory_bytes)


def _cgroup_plan(cgroup: dict[str, str]) -> dict | None:
    """Plan.cgroup: the cgroup.procs the program joins, and per bound the file and key counting its hits."""
    if not cgroup:
        return None
    return {"procs": [os.path.join(path, "cgroup.procs") for path in cgroup.values()],
            "counters": {bound: (os.path.join(cgroup[hierarchy], name), key)
                         for hierarchy in cgroup for bound, (name, key) in _COUNTERS[hierarchy].items()}}


def _make_cgroup(memory_bytes: int) -> dict[str, str]:
    """A cgroup for one run under the caller's own, in each hierarchy that bounds memory or processes, with the run's
    bounds written: {hierarchy: its folder}; empty where the machine gives none (the fallback then bounds the tree)."""
    made = {}
    try:
        for hierarchy, parent in _cgroup_parents().items():
            _sweep(parent)
            made[hierarchy] = os.path.join(parent, f"{_CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
            os.mkdir(made[hierarchy])
            for name, value in _limits(hierarchy, memory_bytes).items():
                if os.path.exists(os.path.join(made[hierarchy], name)):  # those on swap: only where swap is accounted
                    Path(made[hierarchy], name).write_text(str(value))
    except OSError:
        _remove_cgroup(made)
        return {}
    return made


def _limits(hierarchy: str, memory_bytes: int) -> dict[str, int]:
    """The files that bound a cgroup of `hierarchy`, in the order they must be written, and their values."""
    if hierarchy == "memory":  # v1: memory, then memory and swap together, which may not be set below it
        return {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes}
    if hierarchy == "pids":
        return {"pids.max": PROCESS_LIMIT}
    return {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": PROCESS_LIMIT}


def _remove_cgroup(cgroup: dict[str, str]) -> None:
    """Remove a run's cgroup folders. Its processes died with the namespace, but the kernel may not have released
    them all yet: retry a while, killing any still listed."""
    deadline = time.monotonic() + _REAP_S
    for path in cgroup.values():
        while os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError as error:
                if error.errno != errno.EBUSY:
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the sandbox's cgroup {path} still holds processes {_REAP_S:g} s after its "
                                       "run: kill them and remove the folder") from error
                for pid in Path(path, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.01)


def _sweep(parent: str) -> None:
    """Remove the cgroups a caller left behind when it was killed mid-run (their names hold its process id), once they
    are empty: their sandboxes end on their own clocks, and their processes are none of this caller's to kill."""
    for name in os.listdir(parent):
        owner = name[len(_CGROUP_PREFIX):].split("-")[0]
        if name.startswith(_CGROUP_PREFIX) and owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            with contextlib.suppress(OSError):  # still busy, or another caller swept it first
                os.rmdir(os.path.join(parent, name))


def _cgroup_parents() -> dict[str, str]:
    """The caller's own cgroups that can bound a tree's memory and processes, by hierarchy ("memory" and "pids" on
    cgroup v1, "" for v2's single one); empty where the caller cannot make cgroups under them: not root, controllers
    absent, cgroups mounted read-only, or a v2 cgroup that does not delegate memory and pids to its children."""
    if os.geteuid() != 0:
        return {}
    try:
        parents = _cgroup_folders(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
        delegated = Path(parents[""], "cgroup.subtree_control").read_text().split() if "" in parents else []
    except OSError:
        return {}
    if "" in parents and not {"memory", "pids"} <= set(delegated):
        return {}
    return parents if parents and all(os.access(path, os.W_OK) for path in parents.values()) else {}


def _cgroup_folders(own: str, mountinfo: str) -> dict[str, str]:
    """Where a process's cgroups are, from its /proc/<pid>/cgroup and mountinfo: v1's memory and pids where both are
    mounted (a hybrid machine has them there), else v2's."""
    paths = {}  # hierarchy -> the cgroup's path within it
    for line in own.splitlines():
        _, controllers, path = line.split(":", 2)
        paths.update((controller, path) for controller in (controllers.split(",") if controllers else [""]))
    mounts = {}  # hierarchy -> (the part of it mounted, where)
    for line in mountinfo.splitlines():
        fields, _, filesystem = line.partition(" - ")
        kind, _, options = filesystem.split()[:3]
        if kind in ("cgroup", "cgroup2"):
            for hierarchy in options.split(",") if kind == "cgroup" else [""]:
                mounts[hierarchy] = tuple(fields.split()[3:5])
    wanted = ("memory", "pids") if {"memory", "pids"} <= paths.keys() & mounts.keys() else ("",)
    folders = {}
    for hierarchy in wanted:
        if hierarchy not in paths or hierarchy not in mounts:
            return {}
        root, point = mounts[hierarchy]
        relative = os.path.relpath(paths[hierarchy], root)
        if relative == ".." or relative.startswith("../"):
            return {}  # the cgroup is not under the part of the hierarchy mounted here
        folders[hierarchy] = os.path.normpath(os.path.join(point, relative))
    return folders


def _identity() -> list[str]:
    """setpriv's command line up to the program's: who it runs as, with no capabilities and no way to gain any."""
    drop = ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    if os.geteuid() == 0:
        return [_tool("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *drop]
    # A user namespace that maps only the caller has no other user to switch to: its root gives up root's powers instead.
    return [_tool("setpriv"), "--securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked,"
            "+keep_caps_locked", *drop]


def _tool(name: str) -> str | None:
    """Where util-linux's `name` is; only system folders, which the private root shows too."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _reason(status: int, stderr: str) -> str:
    """A short reason from a failed program's exit status (negative: the signal that ended it) and the last line it
    printed."""
    last = _last_line(stderr)
    # Errno 12 and 11: memory or a fork the kernel refused, which the fallback's looks at the tree may have missed.
    # Not "can't start new thread": the address space for its stack may be what ran out.
    if "MemoryError" in last or "[Errno 12] Cannot allocate memory" in last or status == -signal.SIGSEGV and not last:
        return "memory limit"
    if "[Errno 11] Resource temporarily unavailable" in last:
        return "process limit"
    if "File too large" in last or status == -signal.SIGXFSZ:
        return "file size limit"
    if status in (-signal.SIGXCPU, -signal.SIGKILL) and not last:
        return "CPU time limit"
    return f"failed: {last}" if last else f"failed: exit status {status}"
