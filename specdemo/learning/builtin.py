"""The built-in answers specdemo measures with (assets/):

- calibration.json: code instructions with answers, for the draft's first acceptance prior, tune's fidelity check,
  the batching noise and the bench's fidelity section;
- prose.json: prose instructions with the default target's own greedy answers, where near-ties are common, for
  tune's identity check (with the code answers).

Each is a list of {"instruction", "answer"}.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CALIBRATION = ASSETS / "calibration.json"
PROSE = ASSETS / "prose.json"


def code_answers() -> list[dict]:
    return _read(CALIBRATION)


def prose_answers() -> list[dict]:
    return _read(PROSE)


def _read(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
