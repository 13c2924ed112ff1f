"""JSON as specdemo writes it (the machine profile, a run, a benchmark's results): strict, so that any reader parses
it. Python's json module writes NaN and Infinity, which are not JSON (browsers, jq and most other languages refuse
them); a figure that was not measured or is not defined is written as null instead, and the readers of these files
take null where they took NaN."""

from __future__ import annotations

import json
import math


def finite(value):
    """`value` (dicts, lists, tuples, numbers, strings: what json.dumps takes) with each NaN and ±infinity as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value, **options) -> str:
    """`value` as strict JSON text, non-finite numbers as null (`options`: json.dumps's, allow_nan excepted)."""
    return json.dumps(finite(value), allow_nan=False, **options)
