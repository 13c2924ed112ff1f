"""The machine profile's one file: SPECDEMO_HOME/profile/<machine>.json, one per CPU and OpenVINO version, holding
every section of what this machine has learnt. Written only through `update`: under an exclusive lock, read afresh,
changed, written beside and renamed over, so a page, a tune in another terminal and the background work can all
write without losing each other's changes; readers never see half a file.

    {"schema": 1, "machine": {cpu, flags, openvino},
     "tune": {...}, "costs": {key: {...}}, "noise": {key: {...}}, "acceptance": {pair: {...}}}

Nothing learnt is lost to a bad moment. A file that is not a profile of this schema (damaged by hand, a crash of
the disk) is kept aside as <name>.damaged-<time>.json before a new one is started. A read that fails for another
reason (too many open files) is tried again, then that write is given up rather than made from an empty read. A home
that refuses writes (a full disk, a read-only home) is left exactly as it was and this process writes no more to it.
Each of these is said in one logged line; what was not written is kept in this process's memory, so a measured cost
curve still serves its runs.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable

from specdemo import strict_json

SCHEMA = 1  # bump when a section's meaning changes; a profile of another schema is kept aside and started afresh
SECTIONS = ("tune", "costs", "noise", "acceptance")
READ_TRIES = 3  # reads of the file before a write is given up (a transient EMFILE, EIO)
READ_PAUSE_S = 0.05  # between those reads
REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}  # a home that will not take writes

_log = logging.getLogger(__name__)


def path_for(home: Path, facts: dict) -> Path:
    """The profile file under `home` of the machine `facts` (machine.compile_facts()) describe."""
    key = strict_json.dumps({"schema": SCHEMA, **facts}, sort_keys=True)
    return home / "profile" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def tunes_on(home: Path, cpu: dict) -> list[dict]:
    """The tune sections of every profile under `home` made on this CPU (`cpu`: machine.compile_facts()'s cpu and
    flags), whatever OpenVINO made them: read without asking OpenVINO its build, for a command that loads none (clean)."""
    tunes = []
    for path in sorted((home / "profile").glob("*.json")):
        try:
            data = _profile(path.read_bytes())
        except OSError:
            continue
        machine = data.get("machine") if data else None
        if isinstance(machine, dict) and all(machine.get(key) == value for key, value in cpu.items()):
            tunes.append(_section(data, "tune"))
    return tunes


class Store:
    """One profile file, read lazily and again whenever another process has replaced it, with the changes this
    process kept in memory only laid over it."""

    def __init__(self, path: Path, facts: dict):
        self.path = path
        self.facts = facts  # machine.compile_facts(): what the file is valid for, written into it
        self.refused = ""  # why the home refused a write ("No space left on device"): this process writes no more
        self._seen: tuple | None = None  # (inode, mtime_ns, size) of the file last read: each write is a new inode
        self._unsaved: list[tuple[str, Callable[[dict], dict]]] = []  # changes kept in memory, replayed over each read
        self._view: dict = {}  # the file's content as last read or written, _unsaved laid over it: what read() returns

    def read(self) -> dict:
        """The whole profile (treat as read-only); {} sections when there is none yet or it is damaged."""
        seen = self._stat()
        if seen is None and self._seen is not None:  # the file was removed (`clean`, by hand): nothing learnt now
            self._take({}, None)
        elif seen is not None and seen != self._seen:
            try:
                self._take(_profile(self.path.read_bytes()) or {}, seen)
            except OSError:
                pass  # keep what was read before; the next read tries again
        return self._view

    def section(self, name: str) -> dict:
        return _section(self.read(), name)

    def update(self, name: str, change: Callable[[dict], dict], save: bool = True) -> dict:
        """Replace section `name` by change(its current content) and return it as this process now sees it: written
        to the file when `save` (and the home takes writes), else, or when the write could not be made, kept in this
        process's memory only (and applied again over each newer file another process writes)."""
        if not (save and not self.refused and self._write(name, change)):
            self.read()
            self._unsaved.append((name, change))
            self._view = {**self._view, name: change(_section(self._view, name))}
        return _section(self._view, name)

    def _write(self, name: str, change: Callable[[dict], dict]) -> bool:
        """Whether `change` was written to the file; False (said in one logged line) when it was given up."""
        scratch = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path.with_suffix(".lock")):
                data = self._read_locked()
                data[name] = change(_section(data, name))
                data.update(schema=SCHEMA, machine=self.facts)
                text = strict_json.dumps(data, indent=1)
                scratch.write_text(text)
                scratch.replace(self.path)
                # Kept as a read would find it (JSON's keys and numbers), without reading the file back.
                self._take(json.loads(text), self._stat())
            return True
        except OSError as error:
            with suppress(OSError):
                scratch.unlink(missing_ok=True)
            reason = error.strerror or str(error)
            if error.errno in REFUSED:
                self.refused = reason
                _log.warning(f"specdemo cannot write the machine profile {self.path} ({reason}): it is left as it was, "
                             "and learning is off until specdemo starts again")
            else:
                _log.warning(f"specdemo could not read or write the machine profile {self.path} ({reason}): it is left "
                             "as it was, and this change serves this process only")
            return False

    def _read_locked(self) -> dict:
        """The file's content, read under the lock: {} when there is none yet, or once a file that is not a profile of
        this schema was kept aside. The last OSError when it cannot be read, try after try."""
        for attempt in range(READ_TRIES):
            try:
                raw = self.path.read_bytes()
                break
            except FileNotFoundError:
                return {}
            except OSError:
                if attempt == READ_TRIES - 1:
                    raise
                time.sleep(READ_PAUSE_S)
        data = _profile(raw)
        if data is None:
            self._keep_aside()
            return {}
        return data

    def _keep_aside(self) -> None:
        """Rename the file that is not a profile beside itself, never to be overwritten (called under the lock)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside, n = self.path.with_name(f"{self.path.stem}.damaged-{stamp}.json"), 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.stem}.damaged-{stamp}-{n}.json")
        self.path.rename(aside)
        _log.warning(f"the machine profile {self.path} was damaged or of another schema: kept aside as {aside.name}, "
                     "and a new one started")

    def _take(self, data: dict, seen: tuple | None) -> None:
        """Take `data` as the file's content (`seen`: its stat) and lay the changes kept in memory over it."""
        self._seen, view = seen, data
        for name, change in self._unsaved:
            view = {**view, name: change(_section(view, name))}
        self._view = view

    def _stat(self) -> tuple | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _profile(raw: bytes) -> dict | None:
    """A profile file's content, or None when it is not one of this schema (damaged, or another schema's)."""
    try:
        data = json.loads(raw)  # NaN is taken: an older specdemo wrote it
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def _section(data: dict, name: str) -> dict:
    """A copy of one section of `data`; {} when it has none, or not a dict."""
    value = data.get(name)
    return dict(value) if isinstance(value, dict) else {}


@contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
