"""The first process inside a sandbox (bench/sandbox.py starts it through util-linux's `unshare`): it builds the
program's private root, runs the program there under its identity, limits and wall clock, and writes how it ended.

It is root of the new namespaces and PID 1 of the new PID namespace, so when it exits, whether the program ended or its
time ran out, the kernel kills every process left in the namespace before `unshare` (and so the bench) sees it go. The
program cannot signal it: it is another user, or, inside a user namespace, the namespace's init, which the kernel
shields from every signal it keeps no handler for. It is single-threaded, so the limits are set between fork and exec.

Run as `python -I -S sandbox_init.py <plan>`, the plan being JSON (fields below, filled in by sandbox.py). Writes one
line to its standard output: "exit <status>", "signal <number>" or "timeout". A failure to build the root is a
traceback on its standard error and nothing on its standard output.
"""

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys

# mount(2) flags, from linux/mount.h
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
DEVICES = ("null", "zero", "full", "random", "urandom")  # all of /dev the program gets

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


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


def build_root(plan: dict) -> None:
    """A tmpfs root holding the shown host folders read-only, a few devices, this namespace's /proc and a writable
    scratch /tmp with the program in it; then this process moves into it (chroot, cwd /tmp)."""
    root = os.path.join(plan["outer"], "root")  # an empty folder of the bench's; the mounts exist only in here
    mount("specdemo-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path in plan["show"]:
        show(root, path)
    os.mkdir(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # PID 1's namespace: the program's own
    os.mkdir(root + "/tmp")
    owner = plan["owner"]
    mount("specdemo-scratch", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0700,uid={owner},gid={owner},size={plan['scratch_bytes']},nr_inodes={plan['scratch_files']}")
    with open(os.path.join(plan["outer"], "program.py"), "rb") as source, open(root + "/tmp/program.py", "wb") as copy:
        copy.write(source.read())
    mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/tmp")


def run(plan: dict) -> str:
    """Run the program (setpriv, then the interpreter) and wait for it, at most the time limit; how it ended."""

    def limit() -> None:  # in the child, before exec: hard limits, which it cannot raise again
        for name, value in plan["limits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))

    program = subprocess.Popen(plan["command"], cwd="/tmp", env=plan["env"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, preexec_fn=limit)
    try:
        status = program.wait(timeout=plan["time_limit_s"])
    except subprocess.TimeoutExpired:
        return "timeout"
    return f"signal {-status}" if status < 0 else f"exit {status}"


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's own handler would make PID 1 signalable from inside
    plan = json.loads(sys.argv[1])
    build_root(plan)
    ending = run(plan)
    sys.stdout.write(ending + "\n")
    sys.stdout.flush()
    os._exit(0)  # at once: the kernel then kills whatever the program left behind


if __name__ == "__main__":
    main()
