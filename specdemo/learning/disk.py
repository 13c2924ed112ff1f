"""What specdemo keeps on disk under SPECDEMO_HOME, how big each part is, and removing what can go.

    models/<version>/<model>-<precision>   converted IRs (the default pair is needed; others are optional)
    ov_cache/                               OpenVINO's compiled-model cache (rebuilt on the next start)
    bench/hf/, bench/gguf/                  the benchmark's float32 copies for transformers, GGUF files for llama.cpp
    profile/                                what this machine learnt: tune, call costs, α history (small)
    vocab/                                  token rankings for trimmed draft heads (small)
    .<model>-<random>/                      scratch of a conversion that was killed (never needed)
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from specdemo.host import machine
from specdemo.learning.profile import choices
from specdemo.learning.profile.store import tunes_on
from specdemo.models import sources
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET, DRAFT_PRECISION, FAITHFUL_PRECISIONS

KINDS = ("compiled", "bench", "other-models", "old-versions", "scratch")


@dataclass(frozen=True)
class Item:
    """One thing on disk."""

    path: Path
    bytes: int
    kind: str  # one of KINDS, or "default-models" / "measurements" (kept: clean never removes them)
    what: str  # a few words for the listing


def folder_bytes(path: Path) -> int:
    """Bytes of every file under `path` (or of `path` itself when it is a file); 0 when it is gone."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def inventory(home: Path | None = None) -> list[Item]:
    """Everything under SPECDEMO_HOME, each sorted into a kind."""
    home = home or sources.specdemo_home()
    items: list[Item] = []
    # the default pair: the draft as any tune of this CPU runs it (under whichever OpenVINO: the listing loads none) and
    # at DRAFT_PRECISION (the plan's incumbent, run once prepared), the target at each faithful layout (the one it runs,
    # and the one raced against it)
    tunes = tunes_on(home, machine.cpu_facts()) or [{}]
    pair = [choices.resolve_precision(DEFAULT_DRAFT, tune) for tune in tunes] + \
        [replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION)] + \
        [replace(DEFAULT_TARGET, precision=p) for p in FAITHFUL_PRECISIONS]
    defaults = {sources.cached_folder(model).name for model in pair}
    models = home / "models"
    for version in sorted(models.iterdir()) if models.is_dir() else []:
        if not version.is_dir():
            continue
        for folder in sorted(version.iterdir()):
            if not folder.is_dir():
                continue
            if folder.name.startswith("."):
                items.append(Item(folder, folder_bytes(folder), "scratch", "left by a killed conversion"))
            elif version.name != sources.CACHE_VERSION:
                items.append(Item(folder, folder_bytes(folder), "old-versions", f"converted by an older specdemo ({version.name})"))
            elif folder.name in defaults:
                items.append(Item(folder, folder_bytes(folder), "default-models", "the default pair (needed)"))
            else:
                items.append(Item(folder, folder_bytes(folder), "other-models", "another model or precision"))
    for name, kind, what in (
        ("ov_cache", "compiled", "OpenVINO's compiled-model cache (rebuilt on the next start)"),
        ("bench", "bench", "the benchmark's float32 copies for transformers and GGUF files for llama.cpp"),
        ("profile", "measurements", "what this machine learnt: tune, call costs, acceptance history"),
        ("vocab", "measurements", "token rankings for trimmed draft heads"),
        ("tune", "old-versions", "an older specdemo's compile choices (of models converted before cache v3)"),
        ("costs", "old-versions", "an older specdemo's cost curves (of models converted before cache v3)"),
    ):
        path = home / name
        if path.exists():
            items.append(Item(path, folder_bytes(path), kind, what))
    return items


def remove(items: list[Item], kinds: set[str]) -> list[Item]:
    """Delete the items of `kinds` (never the default models or the measurements); return what went."""
    unknown = kinds - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kind {', '.join(sorted(unknown))}; choose from {', '.join(KINDS)}")
    gone = [item for item in items if item.kind in kinds]
    for item in gone:
        if item.path.is_dir():
            shutil.rmtree(item.path, ignore_errors=True)
        else:
            item.path.unlink(missing_ok=True)
    return gone


def size(n_bytes: float) -> str:
    """Bytes in binary units, the one way specdemo writes sizes (page, CLI, report): "1.66 GiB", "314.7 MiB"."""
    for unit in ("bytes", "KiB", "MiB"):
        if n_bytes < 1024:
            return f"{n_bytes:.0f} {unit}" if unit == "bytes" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.2f} GiB"
