"""The run's one table: every run of every section a Run, its lane a Lane, written to benchmarks.json as "table"
under "schema" SCHEMA and read back into the same types; the one place the bench reads its results by key. A lane's
label is for people only: what a lane is (framework, kind, the lane its speedup is over, K) lives in fields, by which
the statistics, the report and the plots pair lanes, so renaming a label changes a table's text and nothing else.

Files before schema 2 kept each section's runs inside it (sections.<name>.runs, the paper's by_tokens.<N>.runs and
genai_defaults.runs): `load` converts those, their prefill unmeasured (nan). Rows before schema 3 carry no setting:
the paper's GenAI-defaults pass is told apart in files before schema 2 only (no file of schema 2 ran the paper).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable, Literal, get_args

from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.metrics import Summary
from specdemo.results.parting import Parting
from specdemo.results.record import known

Framework = Literal["specdemo", "genai", "transformers", "llamacpp"]
Kind = Literal[AUTOREGRESSIVE, SPECULATIVE]
KMode = Literal["fixed", "adaptive", "auto"]
GENAI_DEFAULTS = "GenAI's defaults"  # Run.setting of the paper's pass with GenAI on its own compile defaults


@dataclass
class Output:
    """What a lane's one generation gives back: ours, or a peer's from its own process (peers.py)."""

    ids: list[int]  # new token ids (the stop token included)
    wall_s: float  # seconds of the whole call, prompt ids in hand to last token
    first_s: float  # seconds from the prompt ids in hand to the first new token (a peer's as its own metrics time it)
    summary: Summary | None = None  # ours; None for a peer
    proposed: int = 0  # draft tokens offered for verification (ours: from the summary; a peer: its own count)
    accepted: int = 0  # of them, kept by the target
    rounds: list = field(default_factory=list)  # our loops' round records (events.Round); [] for a peer
    tokens: list = field(default_factory=list)  # our loops' TokenEvents (their margins judge a parting); [] for a peer
    noise: object = None  # the target compile's fidelity.BatchingNoise, where measured (ours)
    produced: int | None = None  # new tokens where a tool counts them and shows none (llama-bench); else len(ids)


@dataclass(frozen=True)
class Lane:
    """One way of generating in a section, and what it is compared with."""

    label: str  # for people only: "ours speculative", "K=3", "GenAI K=4", "head 16k"
    framework: Framework
    kind: Kind
    baseline: Lane | None = None  # the autoregressive lane a speculative lane's speedup is over
    reference: Lane | None = None  # the lane whose token ids this one should reproduce; None = the section's first
    k: int | None = None  # draft tokens per round (fixed K; adaptive K's start); None when autoregressive or auto
    k_policy: KMode | None = None  # how a speculative lane picks K; None when autoregressive
    drafter: str | None = None  # the strategy drafting (a peer's: its counterpart's, Strategy.counterpart); None: AR
    models: str = ""  # what it runs, with precisions: "qwen2.5-coder-1.5b int8 + qwen2.5-coder-0.5b int4"
    # (instruction, prompt ids, max new tokens) -> Output; None in runs built by hand (tests)
    generate: Callable[[str, list[int], int], Output] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.framework not in get_args(Framework) or self.kind not in get_args(Kind):
            raise ValueError(f"lane {self.label!r}: unknown framework {self.framework!r} or kind {self.kind!r}")
        if self.kind == SPECULATIVE and self.baseline is None:
            raise ValueError(f"speculative lane {self.label!r} needs the autoregressive baseline its speedup is over")

    def fields(self) -> dict:
        """The typed fields as JSON (not the label nor generate): lanes are named there by their labels."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("label", "generate")}
        return {name: value.label if isinstance(value, Lane) else value for name, value in values.items()}

    def bare(self) -> Lane:
        """This lane without its generate (nor its baseline's and reference's): what the table keeps, so a kept run
        holds no pipeline alive after its section."""
        strip = lambda lane: lane.bare() if lane is not None else None  # noqa: E731
        return replace(self, baseline=strip(self.baseline), reference=strip(self.reference), generate=None)


@dataclass(frozen=True)
class Run:
    """One generation in one lane: a row of the table. Its time is split as a peer's own tools split it: the prefill
    (prompt ids in hand to the first new token), and the decoding of the tokens after it, whose rate (decode_rate) is
    what the report's ratios compare."""

    lane: Lane
    instruction: int  # index into the section's instructions
    repeat: int  # pass over the instructions, from 0
    max_new_tokens: int
    wall_s: float  # seconds of the whole call, prompt ids in hand to last token
    tokens: int  # new tokens produced
    prefill_s: float = math.nan  # seconds to the first new token (nan: not measured, as in files before schema 2)
    same_as_reference: bool = True  # token ids equal to the lane's reference (by default the section's first lane)
    summary: Summary | None = None  # ours; None for a peer
    proposed: int = 0  # draft tokens offered for verification (ours and the peers that count them)
    accepted: int = 0  # of them, kept by the target
    parting: Parting | None = None  # where ours parted from its reference, judged, if both are ours
    section: str = ""  # the bench section that ran it (stamped by Context.keep)
    machine: str = ""  # the CPU it ran on (stamped by Context.keep)
    # the pass of its section it ran in, where a section runs its lanes again under another setting (schema.GENAI_DEFAULTS:
    # the paper's GenAI on its own compile defaults); "" for the section's own (stamped by Context.keep)
    setting: str = ""
    ids: list[int] = field(default_factory=list, repr=False, compare=False)  # new token ids (not written to JSON)
    rounds: list = field(default_factory=list, repr=False, compare=False)  # our events.Round records (not in JSON)

    @property
    def per_token_s(self) -> float:
        return self.wall_s / self.tokens if self.tokens else math.nan

    @property
    def decode_s(self) -> float:
        """Seconds of the tokens after the first."""
        return self.wall_s - self.prefill_s

    @property
    def decode_rate(self) -> float:
        """Tokens after the first per second of their time: llama-bench's tg, GenAI's 1 / TPOT."""
        return (self.tokens - 1) / self.decode_s if self.tokens > 1 and self.decode_s > 0 else math.nan


# 2: the table, with each run's prefill (time to the first token) apart from its decoding; 3: each run's setting;
# 4: the sections keep no figure the table holds (humaneval: its lanes, speedups and pass@1 went, its verdicts stay;
# transformers: its K, N and dtype; lookup: its rows of bare labels)
SCHEMA = 4

# what a lane's field is where JSON holds null
_LANE_FIELDS = {"framework": None, "kind": None, "k": None, "k_policy": None, "drafter": None, "models": ""}


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
            lanes[section, label] = Lane(label, **{k: d.get(k) or default for k, default in _LANE_FIELDS.items()},
                                         baseline=lane(section, d["baseline"]), reference=lane(section, d["reference"]))
        return lanes[section, label]

    return [Run(lane(r["section"], r["lane"]), r["instruction"], r["repeat"], r["max_new_tokens"], r["wall_s"],
                r["tokens"], measured(r.get("prefill_s")), r.get("same_as_reference", True), *_drafting(r),
                known(Parting, r["parting"]) if r.get("parting") else None, r["section"], r.get("machine", ""),
                r.get("setting", "")) for r in rows]


def _drafting(r: dict) -> tuple[Summary | None, int, int]:
    """(our Summary or None, drafts proposed, accepted) of a row; before schema 2 a peer's counts were its summary."""
    summary = r.get("summary") or {}
    source = r if "proposed" in r else summary
    return known(Summary, summary) if "mode" in summary else None, source.get("proposed", 0), source.get("accepted", 0)


def measured(value) -> float:
    """A figure JSON holds: nan where it holds null (not measured)."""
    return math.nan if value is None else float(value)
