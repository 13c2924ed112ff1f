"""The built-in answers specdemo measures with (assets/):

- calibration.json: code instructions with answers, for the draft's first acceptance prior, tune's fidelity check,
  the batching noise and the bench's fidelity section;
- prose.json: prose instructions with the default target's own greedy answers, where near-ties are common, for
  tune's identity check (with the code answers);
- languages.json: instructions in French, Chinese and Russian with the default target's own greedy answers (80 tokens
  each, 2026-11-30), for the draft plan (with the code and prose answers, draft_plan_answers).

Each is a list of {"instruction", "answer"}.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CALIBRATION = ASSETS / "calibration.json"
PROSE = ASSETS / "prose.json"
LANGUAGES = ASSETS / "languages.json"
# What the draft plan measures a draft's acceptance on: the kinds of instruction the page offers (code, prose, other
# languages). A trimmed LM head keeps the tokens most frequent in Python's standard library (models/vocab.py), so code
# alone hid what it loses elsewhere: on the 2-core Zen 4, the 0.5B draft's 32k head agreed with the target on 90 % of
# the code answers' tokens (full head 94 %) but on 31 % of a Chinese answer's (85 %), where speculation then gave 1.0×
# against 1.3-1.4×.
DRAFT_PLAN_ANSWERS = (CALIBRATION.name, PROSE.name, LANGUAGES.name)


def code_answers() -> list[dict]:
    return _read(CALIBRATION)


def prose_answers() -> list[dict]:
    return _read(PROSE)


def draft_plan_answers() -> list[dict]:
    return [example for name in DRAFT_PLAN_ANSWERS for example in _read(ASSETS / name)]


def _read(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
