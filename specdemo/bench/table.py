"""The run's one table: every run of every section (harness.Run), written to benchmarks.json as "table" under
"schema" SCHEMA and read back into the same types. The one place the bench reads its results by key: JSON's boundary.

Files before schema 2 kept each section's runs inside it (sections.<name>.runs, the paper's by_tokens.<N>.runs and
genai_defaults.runs): `load` converts those, their prefill left unmeasured (nan), as they did not time it. Rows before
schema 3 carry no setting: the paper's GenAI-defaults pass is told apart in files before schema 2 only (no file of
schema 2 ran the paper).
"""

from __future__ import annotations

import math
from dataclasses import asdict, fields

from specdemo.bench.harness import Lane, Run
from specdemo.bench.schema import GENAI_DEFAULTS
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.metrics import Summary
from specdemo.results.parting import Parting

# 2: the table, with each run's prefill (time to the first token) apart from its decoding; 3: each run's setting
SCHEMA = 3

_LANE_KEYS = ("framework", "kind", "k", "k_policy", "drafter", "models")


def row(run: Run) -> dict:
    """One run as JSON: its lane's label and fields, its figures, and the decode rate derived from them (for readers
    of the file; `load` derives it again)."""
    return {"section": run.section, "setting": run.setting, "machine": run.machine, "lane": run.lane.label,
            **run.lane.fields(),
            "instruction": run.instruction, "repeat": run.repeat, "max_new_tokens": run.max_new_tokens,
            "wall_s": run.wall_s, "tokens": run.tokens, "prefill_s": run.prefill_s, "decode_s": run.decode_s,
            "decode_tokens_per_s": run.decode_rate, "same_as_reference": run.same_as_reference,
            "proposed": run.proposed, "accepted": run.accepted,
            "parting": asdict(run.parting) if run.parting else None,
            "summary": run.summary.to_dict() if run.summary else None}


def load(results: dict) -> list[Run]:
    """The runs of a benchmarks.json (parsed): its table, or, in a file before schema 2, its sections' runs."""
    if results.get("schema", 1) > SCHEMA:
        raise ValueError(f"a bench results file of schema {results['schema']}: this specdemo reads up to {SCHEMA}")
    if "table" in results:
        return _runs(results["table"])
    rows, machine = [], results.get("machine", {}).get("cpu", "")
    for name, section in results.get("sections", {}).items():
        passes = [("", section), *(("", one) for one in section.get("by_tokens", {}).values()),
                  (GENAI_DEFAULTS, section.get("genai_defaults", {}))]
        rows += [{"section": name, "setting": setting, "machine": machine, **r}
                 for setting, one in passes for r in one.get("runs", []) if "lane" in r]
    return _runs(_with_lane_fields(rows))


def _with_lane_fields(rows: list[dict]) -> list[dict]:
    """Rows of the oldest files, whose runs named their lane by label alone, with the fields guessed from the label
    ("GenAI K=4": GenAI's, speculative) and a speculative lane's baseline the first autoregressive lane of its
    framework in its section."""
    for r in rows:
        if "framework" not in r:
            label = r["lane"].lower()
            kind = AUTOREGRESSIVE if AUTOREGRESSIVE in label else SPECULATIVE
            framework = next((f for prefix, f in _PREFIXES if label.startswith(prefix)), "specdemo")
            r.update(framework=framework, kind=kind, baseline=None, reference=None)
    baselines = {}
    for r in rows:
        if r["kind"] == AUTOREGRESSIVE:
            baselines.setdefault((r["section"], r["framework"]), r["lane"])
            baselines.setdefault((r["section"], None), r["lane"])
    for r in rows:
        if r["kind"] == SPECULATIVE and not r["baseline"]:
            r["baseline"] = baselines.get((r["section"], r["framework"]), baselines.get((r["section"], None)))
    return rows


_PREFIXES = (("genai", "genai"), ("transformers", "transformers"), ("llama.cpp", "llamacpp"))


def _runs(rows: list[dict]) -> list[Run]:
    """Runs from JSON rows; lanes rebuilt once per (section, label), a baseline or reference by its label."""
    described = {(r["section"], r["lane"]): r for r in rows}
    lanes: dict[tuple[str, str], Lane] = {}

    def lane(section: str, label: str | None) -> Lane | None:
        if label is None or (section, label) not in described:
            return None
        if (section, label) not in lanes:
            d = described[section, label]
            lanes[section, label] = Lane(label, baseline=lane(section, d["baseline"]),
                                         reference=lane(section, d["reference"]), **{k: d.get(k) or (
                                             "" if k == "models" else None) for k in _LANE_KEYS})
        return lanes[section, label]

    return [Run(lane(r["section"], r["lane"]), r["instruction"], r["repeat"], r["max_new_tokens"], r["wall_s"],
                r["tokens"], _number(r.get("prefill_s")), r.get("same_as_reference", True), *_drafting(r),
                _parting(r.get("parting")), r["section"], r.get("machine", ""), r.get("setting", "")) for r in rows]


def _drafting(r: dict) -> tuple[Summary | None, int, int]:
    """(our Summary or None, drafts proposed, accepted) of a row; before schema 2 a peer's counts were its summary."""
    summary = r.get("summary") or {}
    ours = Summary(**{f.name: summary[f.name] for f in fields(Summary) if f.name in summary}) if "mode" in summary else None
    source = r if "proposed" in r else summary
    return ours, source.get("proposed", 0), source.get("accepted", 0)


def _parting(d: dict | None) -> Parting | None:
    return Parting(**{f.name: d[f.name] for f in fields(Parting) if f.name in d}) if d else None


def _number(value) -> float:
    return math.nan if value is None else float(value)
