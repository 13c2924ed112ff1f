"""The finished runs offered for download: each written to a folder of this user's alone in the temp folder (the app's
own, host/private_temp.py), named by its run id (which no one else's page is told), and removed an hour after
(Gradio's copy it serves is cleaned by the page's delete_cache)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from specdemo.results import runfile
from specdemo.results.record import Record

RUN_FILE_AGE_S = 3600.0  # a run's file is offered for download this long; older ones are removed at the next save


def runs_folder() -> Path:
    """Where this process writes the runs offered for download: in its temp folder, read when asked (the app makes that
    folder its own before anything is served)."""
    return Path(tempfile.gettempdir()) / "specdemo-runs"


def save_run(record: Record, run_id: str, folder: Path) -> str:
    """Write a finished run for the page's download, readable by this user alone; returns the file's path. Files older
    than RUN_FILE_AGE_S go first."""
    folder.mkdir(mode=0o700, exist_ok=True)
    remove_old_runs(folder, RUN_FILE_AGE_S)
    path = folder / f"specdemo-run-{time.strftime('%Y%m%d-%H%M%S')}-{run_id}.json"
    runfile.save(record, path)
    path.chmod(0o600)  # Gradio's copy keeps the mode (shutil.copy2) in a folder anyone may read
    return str(path)


def remove_old_runs(folder: Path, age_s: float) -> int:
    """Remove the run files in `folder` last written more than `age_s` seconds ago; how many went."""
    removed, now = 0, time.time()
    for path in folder.glob("specdemo-run-*.json"):
        try:
            if now - path.stat().st_mtime > age_s:
                path.unlink()
                removed += 1
        except OSError:  # removed by another process meanwhile
            pass
    return removed
