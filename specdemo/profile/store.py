"""The machine profile's one file: SPECDEMO_HOME/profile/<machine>.json, one per CPU and OpenVINO version, holding
every section of what this machine has learnt. Written only through `update`: under an exclusive lock, read afresh,
changed, written beside and renamed over, so a page, a tune in another terminal and the background work can all
write without losing each other's changes; readers never see half a file.

    {"schema": 1, "machine": {cpu, flags, openvino},
     "tune": {...}, "costs": {key: {...}}, "noise": {key: {...}}, "acceptance": {pair: {...}}}
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from specdemo import strict_json
from specdemo.profile.legacy import import_stores

SCHEMA = 1  # bump when a section's meaning changes; a profile of another schema is started afresh
SECTIONS = ("tune", "costs", "noise", "acceptance")
_LEGACY = ("legacy",)  # what Store._seen holds while there is no profile file and the older stores stand in


def path_for(home: Path, facts: dict) -> Path:
    """The profile file under `home` of the machine `facts` (machine.compile_facts()) describe."""
    key = json.dumps({"schema": SCHEMA, **facts}, sort_keys=True)
    return home / "profile" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


class Store:
    """One profile file, read lazily and again whenever another process has replaced it."""

    def __init__(self, path: Path, facts: dict, legacy_home: Path | None = None):
        self.path = path
        self.facts = facts  # machine.compile_facts(): what the file is valid for, written into it
        self.legacy_home = legacy_home  # where the stores before the profile lived (imported once, on first write)
        self._data: dict = {}
        self._seen: tuple | None = None  # (inode, mtime_ns, size) of the file last read: each write is a new inode

    def read(self) -> dict:
        """The whole profile (treat as read-only); {} sections when there is none yet or it is damaged."""
        seen = self._stat()
        if seen is None and self._seen != _LEGACY:  # no profile yet: an older specdemo's stores, read once
            self._data, self._seen = self._legacy(), _LEGACY
        elif seen is not None and seen != self._seen:
            self._data, self._seen = _parse(self.path), seen
        return self._data

    def section(self, name: str) -> dict:
        value = self.read().get(name)
        return value if isinstance(value, dict) else {}

    def update(self, name: str, change: Callable[[dict], dict]) -> dict:
        """Replace section `name` by change(its current content), atomically; returns the new content."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path.with_suffix(".lock")):
            data = _parse(self.path) if self.path.is_file() else self._legacy()
            current = data.get(name) if isinstance(data.get(name), dict) else {}
            data[name] = change(dict(current))
            data.update(schema=SCHEMA, machine=self.facts)
            scratch = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            text = strict_json.dumps(data, indent=1)
            scratch.write_text(text)
            scratch.replace(self.path)
            # Kept as a read would find it (JSON's keys and numbers), without reading the file back.
            self._data, self._seen = json.loads(text), self._stat()
        return self._data[name]

    def _stat(self) -> tuple | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def _legacy(self) -> dict:
        return import_stores(self.legacy_home) if self.legacy_home is not None else {}


def _parse(path: Path) -> dict:
    """A profile file's content, or {} for a damaged one or one of another schema (only what it held is lost)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else {}


@contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
