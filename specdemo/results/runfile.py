"""A run to take home: one finished side-by-side run as one JSON object.

`generate --json` prints it, `generate --save FILE` and the page's download write it, and
`python -m specdemo show FILE [FILE …]` reads it back and renders it, several side by side, so runs
from two machines can be compared. Keys (SCHEMA 1):

    schema, instruction, configuration ("faithful", "fastest", "custom"), settings (RunSettings), machine (machine.describe), models (per role: the model panel's
    facts and `compile_properties`), autoregressive / speculative (token_ids, text, tokens, rounds, summary),
    measured_speedup, parting (greedy lanes that part: index, tokens, margin per lane in logits, verdict, noise,
    suspect; else null), batching_noise (fidelity.BatchingNoise),
    warm_up_s, costs, plan, counterfactual (greedy only, else null), failures
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from specdemo import strict_json
from specdemo.decoding.events import TokenEvent
from specdemo.host import machine
from specdemo.host.compat import compile_config
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.failures import where_drafts_fail
from specdemo.results.figures import BOTH, SHOW, figure, placed, value
from specdemo.results.lane import Result
from specdemo.results.metrics import measured_speedup
from specdemo.results.parting import Parting
from specdemo.text import clean_instruction

SCHEMA = 1


def lane_dict(result: Result) -> dict:
    """One lane: its ids and text, its tokens, its round records and its summary."""
    return {"token_ids": result.ids, "text": result.text, "tokens": [_token_dict(t) for t in result.tokens],
            "rounds": [r.to_dict() for r in result.rounds], "summary": result.summary.to_dict()}


def _token_dict(event: TokenEvent) -> dict:
    keep = ("id", "text", "source", "step", "t", "rejected")  # what a reader of one run needs
    return {key: round(value, 6) if key == "t" else value for key, value in event.to_dict().items() if key in keep}


def run_dict(instruction: str, settings, engine, autoregressive: Result, speculative: Result, would,
             parted: Parting | None) -> dict:
    """The whole run in the schema above. `settings` is the RunSettings the engine was loaded with and ran; `would` and
    `parted` what the run judged of it (sidebyside.Record: the counterfactual, where greedy lanes part)."""
    tokenizer = engine.tokenizer
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    special = set(getattr(tokenizer, "all_special_ids", []))
    models = {"target": engine.target, "draft": engine.draft}
    return {
        "schema": SCHEMA,
        "instruction": clean_instruction(instruction),  # as the model saw it (lone surrogates made U+FFFD)
        "configuration": settings.configuration,
        "settings": asdict(settings),
        "machine": machine.describe(),
        "models": {role: {**model.describe(), "compile_properties": compile_config(model.settings, None)}
                   for role, model in models.items() if model is not None},
        AUTOREGRESSIVE: lane_dict(autoregressive),
        SPECULATIVE: lane_dict(speculative),
        "measured_speedup": measured_speedup(autoregressive.summary, speculative.summary),
        # greedy lanes that part: where, the tokens, the target's margin there in each lane, the verdict
        "parting": asdict(parted) if parted is not None else None,
        # how far the target's batched calls moved a top-2 gap from its single steps (fidelity.BatchingNoise)
        "batching_noise": engine.noise.to_dict() if getattr(engine, "noise", None) is not None else None,
        "warm_up_s": engine.warm_up_s,
        "costs": engine.costs.to_dict() if engine.costs is not None else None,
        "plan": speculative.plan.to_dict() if speculative.plan is not None else None,
        "counterfactual": would.to_dict() if would is not None else None,
        "failures": [asdict(f) for f in where_drafts_fail(speculative.tokens, decode, special)],
    }


def dumps(run: dict) -> str:
    """The run as strict JSON text (a figure not measured is null): what `--json` prints and a saved run holds."""
    return strict_json.dumps(run, ensure_ascii=False)


def save(run: dict, path: Path) -> None:
    path.write_text(dumps(run), encoding="utf-8")


def load(path: Path) -> dict:
    """A saved run, or ValueError with a sentence: not a file, not JSON, or not a specdemo run."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON: save a run with `generate --save FILE` or the page's download") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA or SPECULATIVE not in run:
        raise ValueError(f"{path} is not a specdemo run (schema {SCHEMA}): save one with `generate --save FILE`")
    return run


def _figure_rows() -> list[tuple]:
    """`show`'s rows of the figures placed there (specdemo/results/figures.py): a row per lane for a figure each lane has."""
    rows = []
    for f in placed(SHOW):
        if f.lane == BOTH:
            rows += [(f"{lane} {f.label}", lambda r, f=f, lane=lane: f.format(r[lane]["summary"][f.key]))
                     for lane in (AUTOREGRESSIVE, SPECULATIVE)]
        else:
            rows.append((f.label, lambda r, f=f: f.format(value(f, {lane: r[lane]["summary"]
                                                                 for lane in (AUTOREGRESSIVE, SPECULATIVE)}))))
    return rows


MACHINE_ROWS = (  # (label, how to read it from a run)
    ("CPU", lambda r: r["machine"]["cpu"]),
    ("CPU flags", lambda r: " ".join(f.replace("avx512_", "").replace("avx512f", "avx512").replace("_", "-")
                                     for f in r["machine"]["cpu_features"]) or "–"),
    ("cores", lambda r: str(r["machine"]["logical_cores"])),
    ("OpenVINO", lambda r: r["machine"]["packages"]["openvino"]),
    ("configuration", lambda r: r.get("configuration", "–")),
    ("target / draft", lambda r: " / ".join(f"{m['name'].split('-Instruct')[0].split('-')[-1]} {m['precision']}"
                                            for m in r["models"].values())),
)
COUNTERFACTUAL_ROWS = (
    ("best fixed K (would have)", lambda r: _best_fixed(r["counterfactual"])),
    ("oracle (would have)", lambda r: figure("measured_speedup").format(r["counterfactual"]["oracle"]["speedup"])
     if r["counterfactual"] else "–"),
)


def _best_fixed(would: dict | None) -> str:
    if not would or not would["fixed"]:
        return "–"
    best = max(would["fixed"], key=lambda w: w["speedup"])
    return f"K = {best['k']}, {figure('measured_speedup').format(best['speedup'])}"


def compare(runs: list[dict], names: list[str]) -> str:
    """Saved runs side by side: machine, models, speeds, acceptance, what each K would have given; then each
    instruction (they may differ) and where each run's drafts failed."""
    table = []
    for label, read in (*MACHINE_ROWS, *_figure_rows(), *COUNTERFACTUAL_ROWS):
        cells = []
        for run in runs:
            try:
                cells.append(read(run))
            except (KeyError, TypeError, IndexError, ZeroDivisionError):
                cells.append("–")
        table.append((label, cells))
    width = min(40, max(len(cell) for _, cells in table for cell in cells + [Path(n).name for n in names]))
    lines = [f"{'':26}" + "".join(f"{Path(n).name[:width]:>{width + 2}}" for n in names)]
    lines += [f"{label:26}" + "".join(f"{cell[:width]:>{width + 2}}" for cell in cells) for label, cells in table]
    for name, run in zip(names, runs):
        lines.append(f"\n{name}: {run['instruction'][:200]!r}")
        if run.get("parting"):
            lines.append(f"  {Parting(**run['parting']).sentence()}")
        for failure in run.get("failures", [])[:4]:
            examples = ", ".join(f"{d!r} → {w!r}" for d, w in failure["examples"])
            lines.append(f"  drafts failed on {failure['kind']}: {failure['count']} (e.g. {examples})")
    return "\n".join(lines)
