"""Running code a model wrote, contained by the kernel: each program in a sandbox of its own, with time, memory and
file limits, no network, no view of the machine's files or processes, and nothing that outlives its run.

How (util-linux's `unshare` and `setpriv`; sandbox_init.py is the first process inside):
- new mount, PID, network, IPC and UTS namespaces and a new session: the program sees only its own processes, cannot
  signal the bench or read its /proc, and has no network at all (its loopback is its own, and down);
- a private root: /usr, /etc and this interpreter's installation bound read-only (no setuid, no devices), /dev's null,
  zero, full, random and urandom, its own /proc, and /tmp (its working directory and HOME), a small tmpfs that is the
  only place it can write and that vanishes with it. Nothing else of the machine is there to read, write or delete;
- an unprivileged identity with no capabilities and no way to gain any (empty bounding set, no_new_privs): user 65534
  when the bench runs as root; otherwise root of a user namespace that maps only the caller, stripped by securebits;
- hard resource limits on address space, CPU seconds, the size of any file it writes, and core files;
- a wall-clock limit kept by the namespace's first process, which the program cannot signal; when that process exits
  (the program ended or its time ran out), the kernel kills everything left in the PID namespace, setsid and
  double-forked descendants included, before the run returns. No pipe is read: stderr goes to a file, stdout nowhere.
The program runs under this interpreter's base installation (a virtual environment's folder may be closed to user
65534), `-I`, with the standard library. Not bubblewrap: it is not installed by default, and run as root it would map
the program's user onto root outside, the owner of every root-only file it shows (such as /etc's); util-linux is on
every Debian, and setpriv switches to a real unprivileged user.

Where the machine cannot offer this (not Linux, no util-linux, neither root nor unprivileged user namespaces),
`run_program` raises SandboxUnavailable instead of running the code unconfined; `missing()` gives the one sentence.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specdemo import strict_json

TIME_LIMIT_S = 10.0  # wall clock per program; HumanEval's own harness allows 3 s, tests here include slow reference code
MEMORY_LIMIT_BYTES = 1 << 30  # address space of the program
FILE_LIMIT_BYTES = 1 << 20  # largest file the program may write
SCRATCH_BYTES = 16 << 20  # its /tmp: everything it writes, together
SCRATCH_FILES = 1024  # and how many files and folders
NOBODY = 65534  # the user and group the program runs as when the bench runs as root

_SETUP_S = 5.0  # allowance beyond the time limit for building and tearing down a sandbox, before the bench kills it
_SHOWN = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64")  # of the host, read-only, when present
_INIT = str(Path(__file__).with_name("sandbox_init.py"))
_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
_TAIL_BYTES = 8192  # of the program's stderr, for the reason


class SandboxUnavailable(RuntimeError):
    """Generated code cannot be contained on this machine; the message is one sentence saying why and what to do."""


@dataclass(frozen=True)
class Verdict:
    """What running one program came to."""

    passed: bool  # it ran to the end with exit status 0
    reason: str  # "passed", "failed: <last line of stderr>", "timed out after 10 s", "memory limit", "file size limit"
    seconds: float  # wall time of the whole sandbox, its setup included


def run_program(source: str, time_limit_s: float = TIME_LIMIT_S, memory_bytes: int = MEMORY_LIMIT_BYTES) -> Verdict:
    """Run `source` in a sandbox under the limits above; passed when it exits with status 0. Raises SandboxUnavailable,
    having run nothing, where this machine cannot contain it."""
    refusal = missing()
    if refusal:
        raise SandboxUnavailable(refusal)
    return _contain(source, time_limit_s, memory_bytes)


@functools.cache
def missing() -> str | None:
    """None when generated code can be contained here (checked once, by running an empty program in a sandbox);
    otherwise one sentence saying why not and how to allow it."""
    if sys.platform != "linux":
        return "generated code runs only in a sandbox made of Linux namespaces: run the bench on Linux"
    absent = [tool for tool in ("unshare", "setpriv") if _tool(tool) is None]
    if absent:
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
    """One program through one sandbox; raises SandboxUnavailable when the sandbox itself cannot be built."""
    with tempfile.TemporaryDirectory(prefix="specdemo-exec-") as outer:
        Path(outer, "program.py").write_text(source, encoding="utf-8")
        os.mkdir(os.path.join(outer, "root"))  # where the private root is mounted, inside the mount namespace only
        with open(os.path.join(outer, "ending"), "w+b") as ending, open(os.path.join(outer, "stderr"), "w+b") as stderr:
            start = time.perf_counter()
            init = subprocess.Popen([*_namespaces(), sys.executable, "-I", "-S", _INIT,
                                     strict_json.dumps(_plan(outer, time_limit_s, memory_bytes))],
                                    stdin=subprocess.DEVNULL, stdout=ending, stderr=stderr, env=_ENV,
                                    start_new_session=True)
            try:
                init.wait(timeout=time_limit_s + _SETUP_S)
            except subprocess.TimeoutExpired:
                init.kill()  # unshare's --kill-child passes this on to the namespace's init, and the kernel to the rest
                init.wait()
                return Verdict(False, f"timed out after {time_limit_s:g} s", time.perf_counter() - start)
            seconds = time.perf_counter() - start
            ending.seek(0)
            how = ending.read().decode("ascii", "replace").split()
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _TAIL_BYTES))
            text = stderr.read().decode("utf-8", "replace")
    if not how:
        raise SandboxUnavailable(f"the sandbox for generated code failed to start "
                                 f"({_last_line(text) or f'exit status {init.returncode}'})")
    if how[0] == "timeout":
        return Verdict(False, f"timed out after {time_limit_s:g} s", seconds)
    status = int(how[1]) if how[0] == "exit" else -int(how[1])
    if status == 0:
        return Verdict(True, "passed", seconds)
    return Verdict(False, _reason(status, text), seconds)


def _namespaces() -> list[str]:
    """unshare's command line up to the init's: new namespaces, the init as PID 1, killed if unshare is."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [_tool("unshare"), *user, "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child", "--"]


def _plan(outer: str, time_limit_s: float, memory_bytes: int) -> dict:
    """What sandbox_init.py builds and runs (its fields are read there)."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    shown = [path for path in _SHOWN if os.path.lexists(path)]
    for folder in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        if not any(folder == s or folder.startswith(s + "/") for s in shown):
            shown.append(folder)
    return {"outer": outer, "show": shown, "owner": NOBODY if os.geteuid() == 0 else 0,
            "scratch_bytes": SCRATCH_BYTES, "scratch_files": SCRATCH_FILES, "env": _ENV,
            "command": [*_identity(), python, "-I", "program.py"], "time_limit_s": time_limit_s,
            "limits": {"RLIMIT_AS": memory_bytes, "RLIMIT_CPU": int(time_limit_s) + 1, "RLIMIT_FSIZE": FILE_LIMIT_BYTES,
                       "RLIMIT_CORE": 0}}


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
    if "MemoryError" in last or status == -signal.SIGSEGV and not last:
        return "memory limit"
    if "File too large" in last or status == -signal.SIGXFSZ:
        return "file size limit"
    if status in (-signal.SIGXCPU, -signal.SIGKILL) and not last:
        return "CPU time limit"
    return f"failed: {last}" if last else f"failed: exit status {status}"
