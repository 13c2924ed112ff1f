"""A run to take home: one finished side-by-side run (its Record, record.py) as one JSON object.

`generate --json` prints it, `generate --save FILE` and the page's download write it, and
`python -m specdemo show FILE [FILE …]` reads it back and renders it, several side by side, so runs
from two machines can be compared. Keys (SCHEMA 1):

    schema, instruction, configuration ("faithful", "fastest", "custom"), settings (RunSettings), machine (machine.describe), models (per role: the model panel's
    facts and `compile_properties`), autoregressive / speculative (token_ids, text, tokens, rounds, summary),
    measured_speedup, parting (greedy lanes that part: index, tokens, margin per lane in logits, verdict, noise,
    suspect; else null), batching_noise (fidelity.BatchingNoise),
    warm_up_s, costs, plan, counterfactual (greedy only, else null), failures

Record.to_json writes these keys and Record.from_json reads them back; this module writes and reads the file, and
renders saved runs side by side (`show`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specdemo import strict_json
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.figures import BOTH, SHOW, figure, placed, value
from specdemo.results.record import SCHEMA, Record
from specdemo.results.would import Counterfactual


def dumps(record: Record) -> str:
    """The run as strict JSON text (a figure not measured is null): what `--json` prints and a saved run holds."""
    return strict_json.dumps(record.to_json(), ensure_ascii=False)


def save(record: Record, path: Path) -> None:
    path.write_text(dumps(record), encoding="utf-8")


def load(path: Path) -> Record:
    """A saved run, or ValueError with a sentence: not a file, not JSON, or not a specdemo run."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON: save a run with `generate --save FILE` or the page's download") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA or SPECULATIVE not in run:
        raise ValueError(f"{path} is not a specdemo run (schema {SCHEMA}): save one with `generate --save FILE`")
    return Record.from_json(run)


def _figure_rows() -> list[tuple]:
    """`show`'s rows of the figures placed there (specdemo/results/figures.py): a row per lane for a figure each lane has."""
    rows = []
    for f in placed(SHOW):
        if f.lane == BOTH:
            rows += [(f"{lane} {f.label}", lambda r, f=f, lane=lane: f.format(getattr(r.lanes[lane].summary, f.key)))
                     for lane in (AUTOREGRESSIVE, SPECULATIVE)]
        else:
            rows.append((f.label, lambda r, f=f: f.format(value(f, {lane: r.lanes[lane].summary
                                                                 for lane in (AUTOREGRESSIVE, SPECULATIVE)}))))
    return rows


MACHINE_ROWS = (  # (label, how to read it from a Record); a public page's download says no more than its costs' CPU
    ("CPU", lambda r: r.machine.get("cpu") or (r.costs.cpu if r.costs is not None and r.costs.cpu else "–")),
    ("CPU flags", lambda r: " ".join(f.replace("avx512_", "").replace("avx512f", "avx512").replace("_", "-")
                                     for f in r.machine.get("cpu_features", [])) or "–"),
    ("cores", lambda r: str(r.machine.get("logical_cores", "–"))),
    ("OpenVINO", lambda r: r.machine.get("packages", {}).get("openvino", "–")),
    ("configuration", lambda r: r.configuration),
    ("target / draft", lambda r: " / ".join(f"{m['name'].split('-Instruct')[0].split('-')[-1]} {m['precision']}"
                                            for m in r.models.values())),
)
COUNTERFACTUAL_ROWS = (
    ("best fixed K (would have)", lambda r: _best_fixed(r.would)),
    ("oracle (would have)", lambda r: figure("measured_speedup").format(r.would.oracle.speedup) if r.would else "–"),
)


def _best_fixed(would: Counterfactual | None) -> str:
    if not would or not would.fixed:
        return "–"
    best = would.best_fixed()
    return f"K = {best.k}, {figure('measured_speedup').format(best.speedup)}"


def compare(runs: list[Record], names: list[str]) -> str:
    """Saved runs side by side: machine, models, speeds, acceptance, what each K would have given; then each
    instruction (they may differ) and where each run's drafts failed."""
    table = []
    for label, read in (*MACHINE_ROWS, *_figure_rows(), *COUNTERFACTUAL_ROWS):
        cells = []
        for run in runs:
            try:
                cells.append(read(run))
            except (KeyError, TypeError, IndexError, ZeroDivisionError, AttributeError):  # not in this run's file
                cells.append("–")
        table.append((label, cells))
    width = min(40, max(len(cell) for _, cells in table for cell in cells + [Path(n).name for n in names]))
    lines = [f"{'':26}" + "".join(f"{Path(n).name[:width]:>{width + 2}}" for n in names)]
    lines += [f"{label:26}" + "".join(f"{cell[:width]:>{width + 2}}" for cell in cells) for label, cells in table]
    for name, run in zip(names, runs):
        lines.append(f"\n{name}: {run.instruction[:200]!r}")
        if run.parting is not None:
            lines.append(f"  {run.parting.sentence()}")
        for failure in run.failures[:4]:
            examples = ", ".join(f"{d!r} → {w!r}" for d, w in failure.examples)
            lines.append(f"  drafts failed on {failure.kind}: {failure.count} (e.g. {examples})")
    return "\n".join(lines)
