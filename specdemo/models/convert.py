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

from specdemo import strict_json
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
        log = sources.log_path(folder)
        to_parent.write(strict_json.dumps({"error": f"could not convert {settings.source}: {type(error).__name__}: {error} "
                                             f"(details in {log})"}) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
