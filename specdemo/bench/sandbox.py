"""Running code a model wrote: one program per child process, with a time limit, a memory limit, no network and a
throwaway working directory.

This is containment for honest mistakes (an endless loop, a huge list, a stray file write), not a security boundary
against hostile code: the child runs as this user. What it does:
- a new Python (`-I`: no user site, no PYTHON* variables, no current directory on the path) in a fresh temporary
  directory that is deleted afterwards, with an environment of PATH and HOME (the temporary directory) only;
- before the program's first line, in the child itself (no preexec hook, which is unsafe in a process with threads):
  resource limits on address space, CPU seconds, the size of any file it writes and core files, as hard limits it
  cannot raise again; a wall-clock limit on top, after which its whole process group is killed;
- no network: a private network namespace where the kernel allows it (root, or unprivileged user namespaces), and in
  any case socket creation replaced by a function that raises.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

TIME_LIMIT_S = 10.0  # wall clock per program; HumanEval's own harness allows 3 s, tests here include slow reference code
MEMORY_LIMIT_BYTES = 1 << 30  # address space of the child
FILE_LIMIT_BYTES = 1 << 20  # largest file the child may write

# Runs in the child before the program: the limits, then no network.
_PRELUDE = """\
import os as _os, resource as _resource, socket as _socket
for _limit, _value in (("RLIMIT_AS", {memory}), ("RLIMIT_CPU", {cpu}), ("RLIMIT_FSIZE", {file}), ("RLIMIT_CORE", 0)):
    _resource.setrlimit(getattr(_resource, _limit), (_value, _value))
try:
    _os.unshare(_os.CLONE_NEWNET)
except (AttributeError, OSError):
    pass
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled while running generated code")
_socket.socket = _socket.create_connection = _socket.socketpair = _no_network
del _os, _resource, _socket, _limit, _value, _no_network
"""


@dataclass(frozen=True)
class Verdict:
    """What running one program came to."""

    passed: bool  # it ran to the end with exit status 0
    reason: str  # "passed", "failed: <last line of stderr>", "timed out after 10 s", "memory limit"
    seconds: float


def run_program(source: str, time_limit_s: float = TIME_LIMIT_S, memory_bytes: int = MEMORY_LIMIT_BYTES) -> Verdict:
    """Run `source` in a child process under the limits above; passed when it exits with status 0."""
    import time

    with tempfile.TemporaryDirectory(prefix="specdemo-exec-") as scratch:
        path = os.path.join(scratch, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_PRELUDE.format(memory=memory_bytes, cpu=int(time_limit_s) + 1, file=FILE_LIMIT_BYTES) + source)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "LANG": "C.UTF-8"}
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-I", path], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, stderr = child.communicate(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.communicate()
            return Verdict(False, f"timed out after {time_limit_s:g} s", time.perf_counter() - start)
        finally:
            _kill_group(child)  # anything it left running in its group
        seconds = time.perf_counter() - start
    if child.returncode == 0:
        return Verdict(True, "passed", seconds)
    return Verdict(False, _reason(child.returncode, stderr.decode("utf-8", "replace")), seconds)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reason(returncode: int, stderr: str) -> str:
    """A short reason from a failed child's exit status and the last line of what it printed."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if "MemoryError" in last or returncode == -signal.SIGSEGV and not last:
        return "memory limit"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not last:
        return "CPU time limit"
    return f"failed: {last[:200]}" if last else f"failed: exit status {returncode}"
