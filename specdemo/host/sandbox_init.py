"""The first process inside a sandbox (host/sandbox.py starts it through `unshare`): it builds the program's private
root, runs the program there under its identity, limits and wall clock, watches the bounds over the program's whole
tree, and writes how it ended. Run as `python -I -S sandbox_init.py <Plan as JSON>`; its one line on stdout is
"finished" (exit status 0 after the last line), "exit <status>", "signal <number>", "timeout", "limit process" or
"limit memory"; a root it could not build is a traceback on stderr and nothing on stdout.

As PID 1 of the new PID namespace, when it exits (the program ended, its time ran out or its tree hit a bound) the
kernel kills every process left in the namespace before `unshare`, and so the caller, sees it go. The program cannot
signal it: it is another user or, inside a user namespace, the namespace's init, which the kernel shields from every
signal it keeps no handler for. Single-threaded, so limits are set (and the cgroup joined) between fork and exec; it
stays out of the program's cgroup, where an OOM kill could take the judge.

The end mark: the program runs under RUNNER, which reads a random mark from stdin (a pipe this process filled and
closed, drained before any of the program runs), runs program.py as __main__ and, only if its last line returns, writes
the mark to FINISHED_FD, an anonymous file of this process's; leaving early in any way (sys.exit, os._exit, exec, a
signal) leaves no mark. No file, argument or variable the program can read holds the mark, but code written to dig it
out of its own interpreter (RUNNER's frame) could forge it, as such code could rewrite its tests: the mark tells an
early exit from a finished run; it does not make hostile code grade itself honestly.
"""

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

# mount(2) flags, from linux/mount.h
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
DEVICES = ("null", "zero", "full", "random", "urandom")  # all of /dev the program gets
POLL_S = 0.02  # how often the bounds over the tree are looked at, and how late the program's end may be seen
FINISHED_FD = 3  # where RUNNER writes the mark once the program's last line has returned
RUNNER = ("import os, runpy\n"
          "def finish(mark):\n"
          "    runpy.run_path('/tmp/program.py', run_name='__main__')\n"
          f"    os.write({FINISHED_FD}, mark)\n"
          "finish(os.read(0, 64))\n")


@dataclass(frozen=True)
class Plan:
    """What to build and run, and the bounds to watch."""

    outer: str  # the caller's folder for this program: program.py, and the empty folder the root is mounted on
    show: list[str]  # host folders shown read-only at the same place (show)
    owner: int  # the user and group owning the scratch /tmp
    scratch_bytes: int  # the scratch /tmp's size
    scratch_files: int  # and how many files it holds
    env: dict[str, str]  # the program's whole environment
    command: list[str]  # the program's interpreter, under its identity (setpriv ...)
    time_limit_s: float  # wall clock
    limits: dict[str, int]  # hard resource limits of the program's processes, by their resource.RLIMIT_* names
    cgroup: dict | None  # the cgroup.procs the program joins and per bound its counter (open_cgroup); None: none
    processes: int  # the bound on tasks over the whole tree, where no cgroup counts them
    memory_bytes: int  # likewise on its memory


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_PAGE = os.sysconf("SC_PAGE_SIZE")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); raises OSError naming the target."""
    encoded = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if _libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount on {target}: {os.strerror(errno)}")


def show(root: str, path: str) -> None:
    """Make the host's `path` appear at the same place under `root`: a symlink as the same symlink, a folder bound
    read-only, without setuid or devices."""
    inside = root + path
    os.makedirs(os.path.dirname(inside), exist_ok=True)
    if os.path.islink(path):
        os.symlink(os.readlink(path), inside)
        return
    os.makedirs(inside, exist_ok=True)
    mount(path, inside, None, MS_BIND | MS_REC)
    # Read-only takes a second call; noexec, where the host has it, must be kept (a user namespace may not drop it).
    noexec = MS_NOEXEC if os.statvfs(path).f_flag & os.ST_NOEXEC else 0
    mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | noexec)


def build_root(plan: Plan) -> None:
    """A tmpfs root holding the shown host folders read-only, a few devices, this namespace's /proc and a writable
    scratch /tmp with the program in it; then this process moves into it (chroot, cwd /tmp)."""
    root = os.path.join(plan.outer, "root")  # an empty folder of the caller's; the mounts exist only in here
    mount("specdemo-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path in plan.show:
        show(root, path)
    os.mkdir(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # PID 1's namespace: the program's own
    os.mkdir(root + "/tmp")
    owner = plan.owner
    mount("specdemo-scratch", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0700,uid={owner},gid={owner},size={plan.scratch_bytes},nr_inodes={plan.scratch_files}")
    with open(os.path.join(plan.outer, "program.py"), "rb") as source, open(root + "/tmp/program.py", "wb") as copy:
        copy.write(source.read())
    mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/tmp")


def open_cgroup(cgroup: dict | None) -> dict | None:
    """The files of the program's cgroup (None: there is none), opened while they are in sight (the private root has
    no /sys): the cgroup.procs the program joins, and per bound the counter that says it was hit."""
    if cgroup is None:
        return None
    return {"procs": [os.open(path, os.O_WRONLY) for path in cgroup["procs"]],
            "counters": {bound: (os.open(path, os.O_RDONLY), key) for bound, (path, key) in cgroup["counters"].items()}}


def count(fd: int, key: str) -> int:
    """The value of the `key <n>` line of a cgroup file (memory.events, pids.events, memory.oom_control)."""
    for line in os.pread(fd, 4096, 0).decode().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def tree_usage() -> tuple[int, dict[str, int]]:
    """Tasks (threads included, as RLIMIT_NPROC counts them) and resident bytes by process of every process in this
    PID namespace but this one: the program's whole tree, from the namespace's own /proc."""
    tasks, resident = 0, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == "1":
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        except OSError:
            continue  # it ended meanwhile
        tasks += int(fields[17])  # num_threads, field 20 of proc(5)
        resident[pid] = int(fields[21]) * _PAGE  # rss in pages, field 24
    return tasks, resident


def proportional_bytes(pid: str, resident: int) -> int:
    """A process's share of the memory it maps (Pss: a page mapped by n processes counts 1/n in each), so that a
    forked tree's shared pages count once; its resident bytes, never less, where the kernel cannot say."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resident


def bound_hit(plan: Plan, cgroup: dict | None) -> str | None:
    """Which bound over the program's whole tree it has hit so far, if any: "process" or "memory". With a cgroup, its
    kernel counters (forks refused at pids.max, OOM kills at the memory limit); without, the tree counted in /proc:
    resident bytes first, cheap and never less than Pss, then Pss, which walks page tables, only when they are over."""
    if cgroup is not None:
        return next((bound for bound, (fd, key) in cgroup["counters"].items() if count(fd, key) > 0), None)
    tasks, resident = tree_usage()
    if tasks >= plan.processes:  # RLIMIT_NPROC refuses the next fork
        return "process"
    limit = plan.memory_bytes
    over = sum(resident.values()) > limit and sum(proportional_bytes(*item) for item in resident.items()) > limit
    return "memory" if over else None


def open_finish_line() -> int:
    """FINISHED_FD, an anonymous file that RUNNER writes the mark to; nothing in the sandbox has a path to it. Opened
    first, while FINISHED_FD is the lowest free descriptor."""
    fd = os.memfd_create("specdemo-finished")
    if fd != FINISHED_FD:
        os.dup2(fd, FINISHED_FD)
        os.close(fd)
    return FINISHED_FD


def run(plan: Plan, cgroup: dict | None, finished: int) -> str:
    """Run the program (setpriv, then the interpreter under RUNNER) and watch it until it ends, its tree hits a bound
    or its time runs out; how it ended."""
    mark = os.urandom(16).hex().encode()
    mark_out, mark_in = os.pipe()
    os.write(mark_in, mark)  # far below a pipe's buffer: it never blocks
    os.close(mark_in)

    def confine() -> None:  # in the child, before exec: into the cgroup ("0" is the writer), then hard limits
        for fd in cgroup["procs"] if cgroup else []:
            os.write(fd, b"0")
        for name, value in plan.limits.items():
            resource.setrlimit(getattr(resource, name), (value, value))

    program = subprocess.Popen([*plan.command, "-c", RUNNER], cwd="/tmp", env=plan.env, stdin=mark_out,
                               stdout=subprocess.DEVNULL, pass_fds=(finished,), preexec_fn=confine)
    os.close(mark_out)
    if stopped := watch(program, plan, cgroup):
        return stopped
    status = program.returncode
    if status == 0 and mark in os.pread(finished, plan.limits["RLIMIT_FSIZE"], 0):
        return "finished"
    return f"signal {-status}" if status < 0 else f"exit {status}"


def watch(program: subprocess.Popen, plan: Plan, cgroup: dict | None) -> str | None:
    """Wait for the program, looking at the bounds over its tree every POLL_S: "limit <bound>" or "timeout" when it
    was stopped, None when it ended within them."""
    deadline = time.monotonic() + plan.time_limit_s
    while True:
        ended = program.poll() is not None
        if bound := bound_hit(plan, cgroup):  # after the poll: a bound hit as the program ended still counts
            return f"limit {bound}"
        if ended:
            return None
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(POLL_S)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's own handler would make PID 1 signalable from inside
    finished = open_finish_line()
    plan = Plan(**json.loads(sys.argv[1]))
    cgroup = open_cgroup(plan.cgroup)
    build_root(plan)
    ending = run(plan, cgroup, finished)
    sys.stdout.write(ending + "\n")
    sys.stdout.flush()
    os._exit(0)  # at once: the kernel then kills whatever the program left behind


if __name__ == "__main__":
    main()
