"""The sandbox generated code runs in (host/sandbox.py): its limits, on each process and on the whole program (by a
cgroup and by the fallback), a pass only for a program that ran to its end, and each way out of it that a program could
try, shut; where the machine cannot build it, a refusal instead of running the code unconfined."""

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from specdemo.host import sandbox

MARGIN_S = 5.0  # for building and tearing down a sandbox on a loaded 2-core machine
CGROUP_PARENTS = sandbox._cgroup_parents()  # where runs make their cgroups here, even while a test hides them


def _processes_with(token: str) -> list[int]:
    """The machine's processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass  # it ended meanwhile
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _sleepers(count: int, token: str) -> str:
    """Program text that starts `count` children sleeping 30 s, each with `token` on its command line (sleep sums its
    arguments, so a token like 0.123 names them at no cost), and returns once it has."""
    return ("import os\n"
            f"for _ in range({count}):\n"
            "    if os.fork() == 0:\n"
            f"        os.execv('/usr/bin/sleep', ['sleep', '30', {token!r}])\n")


def _token() -> str:
    return f"0.{uuid.uuid4().int % 10 ** 15:015d}"


def _cgroups_left() -> list[Path]:
    """The cgroups this process's runs made that are still there."""
    return [path for parent in CGROUP_PARENTS.values()
            for path in Path(parent).glob(f"{sandbox._CGROUP_PREFIX}{os.getpid()}-*")]


@pytest.fixture(params=["cgroup", "fallback"])
def tree_bound(request, monkeypatch) -> str:
    """What bounds the whole program: a cgroup of the run's own, or the fallback that machines without one get
    (RLIMIT_NPROC on its user, its first process summing the tree's memory)."""
    if request.param == "fallback":
        monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: {})
    elif not CGROUP_PARENTS:
        pytest.skip("the bench cannot make cgroups here: it needs root and cgroups mounted writable")
    return request.param


# ---- what a program gets


def test_a_correct_program_passes():
    verdict = sandbox.run_program("import json\nprint(json.dumps([1, 2]))\nassert sum(range(4)) == 6\n")
    assert verdict.passed and verdict.reason == "passed"


def test_an_endless_loop_is_stopped_at_the_time_limit():
    start = time.perf_counter()
    verdict = sandbox.run_program("while True:\n    pass\n", time_limit_s=1.0)
    assert not verdict.passed and verdict.reason in ("timed out after 1 s", "CPU time limit")
    assert time.perf_counter() - start < 1.0 + MARGIN_S


def test_a_program_that_grabs_memory_is_stopped_by_the_memory_limit():
    verdict = sandbox.run_program("block = bytearray(2 << 30)\n", memory_bytes=256 << 20)
    assert not verdict.passed and verdict.reason == "memory limit"


def test_a_file_larger_than_the_limit_cannot_be_written():
    limit = sandbox.FILE_LIMIT_BYTES
    verdict = sandbox.run_program(f"open('big', 'wb').write(b'x' * {2 * limit})\n")
    assert not verdict.passed and verdict.reason == "file size limit"
    # what did get written stops at the limit, however it is written
    verdict = sandbox.run_program(
        "import os\n"
        f"for mode in ('wb', 'ab'):\n    try:\n        open('big', mode).write(b'x' * {2 * limit})\n"
        "    except OSError:\n        pass\n"
        f"assert os.path.getsize('big') <= {limit}, os.path.getsize('big')\n")
    assert verdict.passed, verdict.reason


def test_generated_code_runs_in_a_private_scratch_directory_with_a_bare_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_SANDBOX_PROBE", "secret")
    monkeypatch.chdir(tmp_path)
    verdict = sandbox.run_program(
        "import os\nopen('leak.txt', 'w').write('x')\n"
        "assert 'SPECDEMO_SANDBOX_PROBE' not in os.environ, sorted(os.environ)\n"
        "assert os.getcwd() == os.environ['HOME'] == '/tmp', os.getcwd()\n")
    assert verdict.passed, verdict.reason
    assert not (tmp_path / "leak.txt").exists()


def test_generated_code_holds_no_privileges():
    verdict = sandbox.run_program(
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "for cap in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'):\n"
        "    assert int(status[cap], 16) == 0, (cap, status[cap])\n"
        "assert status['NoNewPrivs'].strip() == '1'\n")
    assert verdict.passed, verdict.reason


# ---- bounds on the whole program, not on each process


def test_a_program_cannot_start_more_processes_than_the_limit(tree_bound):
    token = _token()
    try:
        verdict = sandbox.run_program(_sleepers(300, token))
        assert not verdict.passed and verdict.reason == "process limit"
        assert _processes_with(token) == [] and _cgroups_left() == []
    finally:
        _kill(_processes_with(token))


def test_children_cannot_together_hold_more_memory_than_the_limit(tree_bound):
    """4 children of 150 MB each, every one under the 256 MB a process may map: stopped before they all hold it."""
    verdict = sandbox.run_program(
        "import os, time\nchildren = []\n"
        "for _ in range(4):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n        block = b'x' * (150 << 20)\n        time.sleep(8)\n        os._exit(0)\n"
        "    children.append(child)\n"
        "for child in children:\n    os.waitpid(child, 0)\n", memory_bytes=256 << 20)
    assert not verdict.passed and verdict.reason == "memory limit"
    assert verdict.seconds < 8.0  # stopped at once, not when the children let go
    assert _cgroups_left() == []


def test_a_sandbox_the_bench_has_to_kill_leaves_no_process_and_no_cgroup(tree_bound, monkeypatch):
    monkeypatch.setattr(sandbox, "_SETUP_S", -2.0)  # the bench gives up before the sandbox's own clock does
    token = _token()
    try:
        verdict = sandbox.run_program(_sleepers(8, token) + "import time\ntime.sleep(30)\n", time_limit_s=3.0)
        assert verdict.reason == "timed out after 3 s"
        assert _processes_with(token) == [] and _cgroups_left() == []
    finally:
        _kill(_processes_with(token))


def test_a_cgroup_left_by_a_killed_bench_is_removed_by_the_next_run():
    if not CGROUP_PARENTS:
        pytest.skip("the bench cannot make cgroups here: it needs root and cgroups mounted writable")
    gone = subprocess.Popen(["true"])
    gone.wait()  # its process id now names no bench
    stale = [Path(parent, f"{sandbox._CGROUP_PREFIX}{gone.pid}-left") for parent in CGROUP_PARENTS.values()]
    try:
        for folder in stale:
            folder.mkdir()
        assert sandbox.run_program("pass\n").passed
        assert [folder for folder in stale if folder.exists()] == []
    finally:
        for folder in stale:
            if folder.exists():
                folder.rmdir()


def test_the_cgroups_are_found_on_v1_hybrid_and_v2_machines():
    hybrid = ("41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
              "35 31 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
              "38 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n")
    assert sandbox._cgroup_folders("8:pids:/\n4:memory:/jobs/7\n0::/\n", hybrid) == {
        "memory": "/sys/fs/cgroup/memory/jobs/7", "pids": "/sys/fs/cgroup/pids"}
    unified = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert sandbox._cgroup_folders("0::/system.slice/bench.service\n", unified) == {
        "": "/sys/fs/cgroup/system.slice/bench.service"}
    # a container that sees only its own part of the hierarchy, mounted where the whole would be
    container = "50 40 0:33 /docker/ab /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" \
                "51 40 0:36 /docker/ab /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    assert sandbox._cgroup_folders("8:pids:/docker/ab\n4:memory:/docker/ab/run\n", container) == {
        "memory": "/sys/fs/cgroup/memory/run", "pids": "/sys/fs/cgroup/pids"}
    assert sandbox._cgroup_folders("8:pids:/elsewhere\n4:memory:/docker/ab\n", container) == {}
    assert sandbox._cgroup_folders("4:memory:/jobs/7\n", hybrid) == {}  # v1 memory without pids, no v2 line


# ---- a pass only for a program that ran to its end


@pytest.mark.parametrize("leaving", ["import sys\nsys.exit(0)\n", "raise SystemExit\n", "import os\nos._exit(0)\n",
                                     "import os\nos.execv('/usr/bin/true', ['true'])\n",
                                     "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\nos._exit(0)\n"],
                         ids=["sys.exit", "SystemExit", "os._exit", "exec", "closing its output"])
def test_a_program_that_leaves_with_status_0_before_its_end_fails(leaving):
    verdict = sandbox.run_program(leaving + "ran_to_the_end = True\n")
    assert not verdict.passed and verdict.reason == "failed: left before its end (exit status 0)"


def test_a_program_cannot_forge_the_mark_of_its_end():
    """All it can read of its run (its stdin, its own and the init's command line and environment, its source),
    written to every descriptor it could guess, before leaving with status 0."""
    verdict = sandbox.run_program(
        "import os, sys\nseen = os.read(0, 4096) + sys.stdin.buffer.read()\n"
        "for path in ('/proc/self/cmdline', '/proc/self/environ', '/proc/1/cmdline', '/proc/1/environ', __file__):\n"
        "    try:\n        seen += open(path, 'rb').read()\n    except OSError:\n        pass\n"
        "for fd in range(1, 64):\n"
        "    try:\n        os.write(fd, seen)\n    except OSError:\n        pass\n"
        "os._exit(0)\n")
    assert not verdict.passed


def test_a_program_runs_as_the_main_module_of_its_own_file():
    verdict = sandbox.run_program("import sys\nx = 1\nassert __name__ == '__main__' and sys.modules['__main__'].x == 1\n"
                                  "assert __file__ == '/tmp/program.py', __file__\n")
    assert verdict.passed, verdict.reason


# ---- the ways out, each shut


def test_generated_code_cannot_write_outside_its_scratch_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    name = f"specdemo-escape-{uuid.uuid4().hex}"
    targets = [outside / "escaped.txt", Path("/tmp") / name, Path("/var/tmp") / name, Path("/dev/shm") / name,
               Path.home() / name]
    try:
        sandbox.run_program(f"for path in {[str(t) for t in targets]!r}:\n"
                            "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\n")
        assert [t for t in targets if t.exists()] == []
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_generated_code_cannot_read_a_private_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret is 31337")
    secret.chmod(0o600)
    verdict = sandbox.run_program(f"raise SystemExit(open({str(secret)!r}).read())\n")
    assert "31337" not in verdict.reason


def test_generated_code_cannot_connect_to_the_loopback_even_through__socket():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        verdict = sandbox.run_program(
            "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.settimeout(3)\n"
            f"s.connect(('127.0.0.1', {port}))\n")
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    assert not verdict.passed


def test_generated_code_cannot_signal_the_bench():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        verdict = sandbox.run_program(
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}):\n"
            "    try:\n        os.kill(pid, signal.SIGUSR1)\n    except OSError:\n        pass\n")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == [] and verdict.passed, verdict.reason


def test_nothing_a_program_starts_outlives_its_run():
    token = f"specdemo-left-behind-{uuid.uuid4().hex}"
    try:
        verdict = sandbox.run_program(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', {token!r}],\n"
            "                 start_new_session=True, stderr=subprocess.DEVNULL)\n")  # returns once it has started
        assert verdict.passed, verdict.reason
        assert _processes_with(token) == []
    finally:
        _kill(_processes_with(token))


def test_a_descendant_holding_stderr_does_not_hold_up_the_run():
    token = f"specdemo-holds-stderr-{uuid.uuid4().hex}"
    start = time.perf_counter()
    try:
        verdict = sandbox.run_program(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}], start_new_session=True)\n",
            time_limit_s=2.0)
        assert time.perf_counter() - start < 2.0 + MARGIN_S
        assert verdict.passed, verdict.reason
    finally:
        _kill(_processes_with(token))


def test_generated_code_cannot_delete_a_file_through_the_bench_s_proc_entry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    sandbox.run_program(
        "import os\n"
        f"for pid in (os.getppid(), {os.getpid()}):\n"
        "    try:\n        os.remove(f'/proc/{pid}/cwd/victim.txt')\n    except OSError:\n        pass\n")
    assert victim.read_text() == "keep me"


# ---- where the machine cannot build it


def test_without_a_sandbox_generated_code_is_refused_in_one_sentence(tmp_path, monkeypatch):
    sentence = "generated code runs only in a sandbox, which cannot start here (probe): run the bench as root"
    monkeypatch.setattr(sandbox, "missing", lambda: sentence)
    ran = tmp_path / "ran"
    with pytest.raises(sandbox.SandboxUnavailable) as refusal:
        sandbox.run_program(f"open({str(ran)!r}, 'w').write('unconfined')\n")
    assert str(refusal.value) == sentence and not ran.exists()


def test_without_util_linux_the_refusal_says_to_install_it(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name, path=None: None)
    refusal = sandbox.missing.__wrapped__()
    assert "this machine lacks unshare, setpriv: install util-linux" in refusal and "\n" not in refusal


def test_a_sandbox_that_cannot_start_is_refused_with_how_to_allow_one(monkeypatch):
    monkeypatch.setattr(sandbox, "_namespaces", lambda: ["/usr/bin/false"])  # as unshare without the right to
    refusal = sandbox.missing.__wrapped__()
    assert refusal.startswith("the sandbox for generated code failed to start (exit status 1): run the bench as root")
    assert "unprivileged user namespaces" in refusal and "\n" not in refusal
