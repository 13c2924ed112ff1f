"""The stores that came before the machine profile (tune/, costs/), imported once into a new profile so a machine
tuned and measured by an older specdemo keeps what it learnt."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdemo import strict_json
from specdemo.host import machine


def import_stores(home: Path) -> dict:
    """Sections read from `home`'s old files: tune/<machine>.json, costs/<key>.json, costs/<key>.noise.json and
    costs/acceptance-<pair>.json. Damaged files are skipped."""
    data: dict = {"tune": _read(_tune_path(home)) if (home / "tune").is_dir() else {}}
    data["tune"].pop("version", None)
    costs, noise, acceptance = {}, {}, {}
    for path in sorted((home / "costs").glob("*.json")) if (home / "costs").is_dir() else []:
        content = _read(path)
        if not content:
            continue
        if path.name.startswith("acceptance-"):
            acceptance[path.stem.removeprefix("acceptance-")] = content
        elif path.name.endswith(".noise.json"):
            noise[path.name.removesuffix(".noise.json")] = content
        elif "costs" in content:
            costs[path.stem] = content
    data.update(costs=costs, noise=noise, acceptance=acceptance)
    return {name: section for name, section in data.items() if section}


def _tune_path(home: Path) -> Path:
    """Where the tune file of this machine was kept (one per CPU and OpenVINO version, version 1)."""
    facts = machine.compile_facts()
    key = strict_json.dumps({"version": 1, "cpu": facts["cpu"], "flags": facts["flags"], "openvino": facts["openvino"]},
                     sort_keys=True)
    return home / "tune" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
