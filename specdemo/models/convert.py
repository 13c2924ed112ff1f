"""The conversion child: `python -m specdemo.models.convert SETTINGS_JSON FOLDER` (started by specdemo.models.sources).

Converts one model with export.convert. Progress and a final error, if any, go to the parent as JSON
lines on the standard output it was started with; everything the converters print themselves (NNCF's
tables, transformers' tracer warnings, optimum's logs) goes to the standard error, which the parent
points at a log file under SPECDEMO_HOME/logs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specdemo import errors, strict_json
from specdemo.models import export, sources
from specdemo.settings import ModelSettings


def main(argv: list[str]) -> int:
    settings, folder = ModelSettings(**json.loads(argv[1])), Path(argv[2])
    to_parent = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # from here on, whatever prints to standard output lands in the log

    def report(fraction: float, message: str) -> None:
        to_parent.write(strict_json.dumps({"fraction": fraction, "message": message}) + "\n")

    try:
        export.convert(settings, folder, report)
    except sources.ModelSourceError as error:
        to_parent.write(strict_json.dumps({"error": str(error)}) + "\n")
        return 1
    except Exception as error:  # noqa: BLE001 - told to the parent as one sentence; the traceback is in the log
        import traceback

        traceback.print_exc()
        to_parent.write(strict_json.dumps({"error": failure(settings, error, sources.log_path(folder))}) + "\n")
        return 1
    return 0


def failure(settings: ModelSettings, error: Exception, log: Path) -> str:
    """What the parent says of a failed conversion: the disk's errors with what to do (a full disk: free space), any
    other as its type and words; where the details are."""
    reason = errors.disk_sentence(error) if isinstance(error, OSError) and error.errno else \
        f"{type(error).__name__}: {error}"
    return f"could not convert {settings.source}: {reason} (details in {log})"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
