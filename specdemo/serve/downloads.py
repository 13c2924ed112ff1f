"""A finished run as the public page hands it out: the run's JSON (runfile.py) in the last update of the turn that made
it, for that visitor's page to save, never a file served at a path (Gradio serves a path to whoever asks for it, so the
run would be bound to its URL, not to its session: issue 62). Nothing is written.

What a public page need not hand out is left out: this machine's details (CPU model and flags, cores, RAM, kernel,
Python and package versions, its load now or while its costs were measured) and where its models lie on its disk. The
CPU the figures were measured on stays, as the page's cost note says it. The CLI's `--save` and the bench keep them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from specdemo.results import runfile
from specdemo.results.record import Record


@dataclass(frozen=True)
class Download:
    """One finished run, for its page's download button."""

    name: str  # the file name the browser saves it as: specdemo-run-<when>-<run id>.json
    text: str  # the run's JSON (runfile.py's schema), as the public page hands it out (public)


def download(record: Record, run_id: str) -> Download:
    """The finished run `record` of the run `run_id`, for its own page to save."""
    return Download(f"specdemo-run-{time.strftime('%Y%m%d-%H%M%S')}-{run_id}.json", runfile.dumps(public(record)))


def public(record: Record) -> Record:
    """`record` without the machine's details and its models' places on disk (the module's docstring)."""
    costs = replace(record.costs, host={}) if record.costs is not None else None
    models = {role: {key: value for key, value in facts.items() if key != "source"}
              for role, facts in record.models.items()}
    return replace(record, machine={}, costs=costs, models=models)
