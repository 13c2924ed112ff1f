"""The results of a bench run (benchmarks.json: Results.to_json): its runs are the table (table.py), found by their
lanes' typed fields (OURS_AR, ...), never by labels; each section's figures a Figures (Sections gives each section's
type), Skipped where the section could not run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from specdemo.bench.table import SCHEMA, Run, row
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE

if TYPE_CHECKING:  # the sections' own modules import this one
    from specdemo.bench.gating import Gating
    from specdemo.bench.humaneval import HumanEval
    from specdemo.bench.kernels import Kernels
    from specdemo.bench.memory import Memory
    from specdemo.bench.settings import BenchSettings
    from specdemo.bench.targets import Target
    from specdemo.bench.watching import Watching
    from specdemo.decoding.costs import CostModel
    from specdemo.decoding.planner import Plan
    from specdemo.host.machine import Machine
    from specdemo.models.loading import Facts
    from specdemo.settings import RunSettings

# (framework, kind) of the lanes the report names.
OURS_AR = ("specdemo", AUTOREGRESSIVE)
OURS_SPEC = ("specdemo", SPECULATIVE)
GENAI_AR = ("genai", AUTOREGRESSIVE)
GENAI_SPEC = ("genai", SPECULATIVE)
HF_SPEC = ("transformers", SPECULATIVE)


@dataclass(frozen=True, kw_only=True)
class Figures:
    """What a section keeps of its run that the table does not hold (each section's own fields), and its timing."""

    seconds: float = math.nan  # the section's own time, stamped by bench.run
    load_average_end: list[float] | None = None  # the 1, 5, 15 minute load after it, stamped by bench.run


@dataclass(frozen=True)
class Skipped(Figures):
    """A section that could not run here."""

    skipped: str  # why, in a sentence: "llama.cpp: skipped (pip install -r requirements-llamacpp.txt)"


@dataclass(frozen=True)
class GenAICompile:
    """What GenAI's peers were compiled with."""

    target: dict  # the target's compile properties (ours, fitted to what GenAI accepts), CACHE_DIR left out
    draft: dict  # the draft's, likewise
    differs: str  # in words, where they differ from ours ("" where they do not)


@dataclass(frozen=True)
class Paper(Figures):
    """The paper's experiment; its lanes' times, speedups and ratios are the table's."""

    k: int  # the K of fixed-K lanes and GenAI's (Context.k)
    k_label: str  # how our lanes chose K (Context.k_label)
    k_policy: str  # its rule: "fixed", "adaptive" or "auto"
    genai_compile: GenAICompile
    genai_target: str | None  # the precision GenAI's target ran at where ours ran specdemo's kernels, else None
    genai_draft: str | None  # likewise for the draft
    # kind -> stats.COMPONENTS -> share of wall time, our lanes at the longest N
    time_shares: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Agreement:
    """How far our greedy text follows llama.cpp's on one instruction (the first pass)."""

    instruction: int
    same_tokens: int  # tokens both wrote before they part
    of: int  # the shorter answer's tokens: same_tokens equals it where they never part


@dataclass(frozen=True)
class LlamaCpp(Figures):
    """llama.cpp on the GGUF files; its lanes, llama-bench's and llama-speculative-simple's rows are the table's."""

    k: int
    k_label: str
    max_new_tokens: int
    threads: int  # llama.cpp's
    version: str  # llama-cpp-python's
    system_info: str  # llama.cpp's CPU features
    kernels_isa: str | None  # our kernels' path where a lane ran gguf-native, else None
    weights: dict[str, str]  # our lanes' precision by role: "target", "draft"
    text_agreement: list[Agreement]


@dataclass(frozen=True)
class FidelitySection(Figures):
    """Each target precision against the GGUF it came from."""

    examples: int  # built-in answers teacher forced
    candidates: list  # results.fidelity.Fidelity, one per precision


@dataclass(frozen=True)
class Nodes(Figures):
    """Where a target call's time goes (nodes.py)."""

    tokens_per_call: list[int]  # [1, K + 1]: a decode step and a verify call
    gguf_read_bytes: int | None  # weights the GGUF's matmuls read per token; None without a GGUF
    targets: list  # nodes.TargetNodes, one per target precision


@dataclass(frozen=True)
class Row:
    """What a sweep keeps of one of its speculative lanes that the table does not hold: its label (the lanes' own
    figures are the table's: stats.sweep_rows)."""

    label: str


@dataclass(frozen=True)
class Head(Row):
    """A draft LM head of the vocab sweep."""

    head_tokens: int  # asked (0: the full head)
    rows_kept: int  # rows the trimmed head holds
    draft_step_costed_s: float  # the draft step its warm-up measured (nan: not measured)


@dataclass(frozen=True)
class Pair(Row):
    """A (target, draft) pair of the precision sweep."""

    target: str  # precision
    draft: str
    draft_bytes: int  # the draft's size on disk


@dataclass(frozen=True)
class KvCache(Row):
    """A KV cache precision of the kv sweep."""

    kv_cache_precision: str  # as the target's runtime reports it, "(default)" where none was asked


@dataclass(frozen=True)
class Sweep(Figures):
    """A sweep section (k, vocab, lookup, precision, kv)."""

    max_new_tokens: int
    rows: list[Row]  # one per speculative lane the sweep reports (k: stats.Counterfactual)
    k: int | None = None  # the fixed K of its lanes, where it has one (precision, kv, lookup)
    k_label: str = ""  # how its lanes chose K (precision, kv); "": say "K = k"
    counterfactuals: list[dict] = field(default_factory=list)  # k: each answer's walk (Counterfactual.to_dict)

    def facts(self) -> dict[str, Row]:
        return {row.label: row for row in self.rows}


@dataclass(frozen=True)
class Sections:
    """Each section's figures as its runner made them, a field by its name in settings.REGISTRY and in its order (held
    by a test); None where it did not run."""

    paper: Paper | None = None
    k: Sweep | None = None
    vocab: Sweep | None = None
    lookup: Sweep | None = None
    transformers: Figures | Skipped | None = None  # its lanes, their K and N: the table's
    llamacpp: LlamaCpp | Skipped | None = None
    fidelity: FidelitySection | Skipped | None = None
    nodes: Nodes | None = None
    kernels: Kernels | Skipped | None = None
    precision: Sweep | None = None
    kv: Sweep | None = None
    memory: Memory | None = None
    watching: Watching | None = None
    humaneval: HumanEval | Skipped | None = None
    gating: Gating | None = None

    def ran(self) -> dict[str, Figures]:
        """The sections that ran, by name, in the order they ran: as benchmarks.json keeps them."""
        return {f.name: figures for f in fields(self) if (figures := getattr(self, f.name)) is not None}

    to_json = ran


@dataclass(frozen=True)
class Results:
    """A bench run's results, as the report and the plots read them; to_json is benchmarks.json, in this order."""

    command: str = ""  # for the report's "reproduce" line
    started: str = ""  # ISO time, UTC
    machine: Machine | None = None
    bench: BenchSettings | None = None
    run_settings: RunSettings | None = None
    sections: Sections = Sections()
    models: dict[str, Facts] = field(default_factory=dict)  # by role: "target", "draft"
    # Profile.tune_record() as written ({} when the machine was not tuned): file, trials [Trial dicts], draft_plan
    # {precision, head_tokens, options, planned_at} or null; report_tables.tuned reads it back
    tune: dict | None = None
    costs: CostModel | None = None  # measured at warm-up, frozen
    warm_up_s: float = 0.0
    plan: Plan | None = None  # the planner's for the first code instruction
    sample_run: dict | None = None  # the run record `show` renders (run.json, not in benchmarks.json); None: unfinished
    skipped_for_memory: list[str] = field(default_factory=list)  # sections the memory bound left no room for
    costs_end: CostModel | None = None  # as the sections' runs corrected it
    runs: list[Run] = field(default_factory=list)  # every section's runs: the table
    targets: list[Target] = field(default_factory=list)
    seconds: float = math.nan  # the whole run's
    load_average_end: list[float] | None = None

    def to_json(self) -> dict:
        head = {"schema": SCHEMA, "command": self.command, "started": self.started, "machine": self.machine,
                "bench": self.bench, "run_settings": self.run_settings, "sections": self.sections,
                "models": self.models, "tune": self.tune, "costs": self.costs, "warm_up_s": self.warm_up_s,
                "plan": self.plan.to_dict() if self.plan else None}
        skipped = {"skipped_for_memory": self.skipped_for_memory} if self.skipped_for_memory else {}
        return {**head, **skipped, "costs_end": self.costs_end, "table": [row(r) for r in self.runs],
                "targets": self.targets, "seconds": self.seconds, "load_average_end": self.load_average_end}
