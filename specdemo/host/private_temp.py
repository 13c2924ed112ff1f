"""The app's temporary files in a folder only its user can open (issue 62). In the shared temp folder Gradio keeps its
copies of what it serves (each run's download among them) in /tmp/gradio/<hash>/, 0755: any user of the host could list
the run files' names and ask the page for them by path. A folder of the process's own, made by mkdtemp (0700, a name no
one can take first), holds Gradio's cache and a child's scratch instead (a run's download is no file at all now: it
travels in its own turn's last update, serve/downloads.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def use_private_temp() -> Path:
    """Make a fresh 0700 folder inside the system's temp folder the temp folder of this process (tempfile's, so Gradio's
    cache lands in it) and of its children (TMPDIR); removed at exit. Call it before Gradio is
    imported: it names its cache folders at import."""
    folder = Path(tempfile.mkdtemp(prefix="specdemo-"))
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
