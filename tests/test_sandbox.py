"""The sandbox generated code runs in (bench/sandbox.py): its limits, and each way out of it that a program could try,
shut; where the machine cannot build it, a refusal instead of running the code unconfined."""

import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from specdemo.bench import sandbox

MARGIN_S = 5.0  # for building and tearing down a sandbox on a loaded 2-core machine


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
