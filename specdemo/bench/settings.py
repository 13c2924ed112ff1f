"""What a bench run measures: the instructions, the paper's figures, the targets, and BenchSettings
with its two presets (FULL and QUICK)."""

from __future__ import annotations

from dataclasses import dataclass

from specdemo.decoding.drafters import MASKED
from specdemo.settings import GenerationSettings

CODE_INSTRUCTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that performs binary search on a sorted list.",
]

# Edits whose answer repeats most of the input: where prompt lookup finds its drafts.
_SNIPPET = '''def average(values):
    total = 0
    count = 0
    for value in values:
        total = total + value
        count = count + 1
    if count == 0:
        return 0
    return total / count


def largest(values):
    best = values[0]
    for value in values:
        if value > best:
            best = value
    return best
'''
EDIT_INSTRUCTIONS = [
    f"Add type hints to both functions. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
    f"Rename the parameter `values` to `numbers` everywhere. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
    f"Add a one-line docstring to each function. Reply with the complete code only.\n\n```python\n{_SNIPPET}```",
]

# The paper's measurements: new tokens N -> (autoregressive s, speculative s), Dolly v2 12B target, 3B draft.
PAPER = {40: (19.87, 13.61), 100: (44.25, 26.97)}


def paper_speedup(n: int) -> float:
    """The paper's speedup at N = `n` (its autoregressive seconds over its speculative ones)."""
    autoregressive_s, speculative_s = PAPER[n]
    return autoregressive_s / speculative_s


@dataclass(frozen=True)
class Section:
    """One section of a bench run, registered in REGISTRY: what it loads, and its runner, report parts and plots, named
    as "module:function" (".sweeps" is specdemo.bench.sweeps) and imported by bench.found() when called, so that this
    module stays light for the CLI's flags. A new section is one module holding the three, one line here and its field
    in schema.Sections."""

    name: str  # for --only and as its key in benchmarks.json
    run: str  # its runner: Context -> the figures the report and the plots read (schema.Figures)
    # Its parts of the report: (the § they go in, (sections, plots, the table's runs) -> markdown, "" when there is
    # nothing to say), the parts of one § in the order their sections run. A part may read other sections (§2 sets ours
    # beside the peers).
    report: tuple[tuple[int, str], ...]
    plots: tuple[str, ...] = ()  # its painters: results -> a figure, or None; draw_x writes benchmarks-x.png
    # Copies of (target, draft) compiles it loads beside the bench's pair at its peak, estimated from what it loads
    # (memory.section_need prices them). GenAI's two pipelines (plain, speculative: K is a per-call setting) hold two
    # targets and a draft; every section drops its pipelines when it ends (bench.run), so none is counted twice.
    copies: tuple[int, int] = (0, 0)
    quick: bool = False  # QUICK runs it
    opt_in: bool = False  # only --only runs it: humaneval executes the code the models write (and takes most of an hour)


REGISTRY = (  # in the order they run
    Section("paper", ".sections:run_paper", ((1, ".report:paper_section"), (6, ".report_tables:breakdown_section")),
            (".plots:draw_paper", ".plots:draw_breakdown"), copies=(2, 1), quick=True),
    Section("k", ".sweeps:run_k", ((3, ".report_tables:k_section"),), (".plots:draw_k",), copies=(2, 1), quick=True),
    Section("vocab", ".sweeps:run_vocab", ((3, ".report_tables:vocab_section"),), copies=(0, 1), quick=True),
    Section("lookup", ".sweeps:run_lookup", ((4, ".report_tables:lookup_section"),), copies=(2, 0), quick=True),
    # holds both models in f32: memory.section_need prices it from their weights
    Section("transformers", ".sections:run_transformers", ((2, ".report:peers_section"),), (".plots:draw_peers",),
            quick=True),
    # an optional peer that loads two more copies of the target: the full run measures it
    Section("llamacpp", ".sections:run_llamacpp", ((7, ".report_gguf:llamacpp_section"),)),
    Section("fidelity", ".sections:run_fidelity", ((7, ".report_gguf:fidelity_section"),), copies=(1, 0)),
    Section("nodes", ".sections:run_nodes", ((7, ".report_gguf:nodes_section"),), copies=(1, 0)),
    # one layer of each shape, all blocks' copies (0.5 GB: the file's bytes and gguf-mixed's), beside the pair
    Section("kernels", ".kernels:run_kernels", ((7, ".kernels:kernels_section"),)),
    # one other target at a time, and the INT8 and FP16 drafts (1.8 GB: about 6 INT4 drafts) throughout; measured 4.3 GiB
    # beside the pair (gguf-mixed + INT4, AMX Xeon), where this asks 4.8
    Section("precision", ".sweeps:run_precision", ((3, ".report_tables:precision_section"),), (".plots:draw_precision",),
            copies=(1, 6)),
    # both models at two other KV precisions, all interleaved; measured 4.0 GiB beside the pair, where this asks 4.2
    Section("kv", ".sweeps:run_kv", ((3, ".report_tables:kv_section"),), copies=(2, 2)),
    Section("memory", ".memory:run_memory", ((5, ".report_tables:memory_section"),), copies=(1, 1)),
    Section("watching", ".watching:run_watching", ((8, ".watching:watching_section"),)),
    Section("humaneval", ".humaneval:run_section", ((9, ".humaneval:humaneval_section"),),
            (".plots:draw_humaneval",), copies=(2, 1), opt_in=True),
    # gated rounds priced on synthetic compute-bound curves: the pair alone, no timing worth comparing across sections
    Section("gating", ".gating:run_gating", ((3, ".gating:gating_section"),), opt_in=True),
)
SECTIONS = tuple(s.name for s in REGISTRY)
OPT_IN = tuple(s.name for s in REGISTRY if s.opt_in)
BY_NAME = {s.name: s for s in REGISTRY}

# The targets: what "as fast as the best" means here (judged in targets.py).
TARGET_GENAI_RATIO = 1.0  # our speculative time / GenAI's C++ speculative time, at most
TARGET_SPEEDUP = 2.0  # speculative over autoregressive on code instructions, at least
TARGET_TRANSFORMERS = 3.0  # transformers assisted time / our speculative time, at least
TARGET_OVERHEAD = 0.05  # our loop's time outside model calls and rollbacks, at most (share of wall)
TARGET_AUTO_SPEEDUP = 2.2  # auto K over autoregressive on an AVX-512/AMX CPU (issue 8; 1.3 on an AVX2-only CPU)
TARGET_PREDICTION_ERROR = 0.10  # predicted vs measured speedup, per instruction median


@dataclass(frozen=True)
class BenchSettings:
    """What one bench run measures. QUICK and FULL are the two presets."""

    mode: str = "full"  # a name for the report
    instructions: int = 5  # code instructions per section (the first n of CODE_INSTRUCTIONS)
    repeats: int = 1  # passes over the instructions after the warm-up
    paper_tokens: tuple[int, ...] = (40, 100)  # N of the paper experiment
    sweep_tokens: int = 100  # N of the sweeps (capped by --max-new-tokens)
    k_values: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # fixed K of the sweep, plus adaptive and auto
    head_tokens: tuple[int, ...] = (8000, 16000, 32000, 64000, 0)  # draft LM head sizes of the vocab section (0 = full)
    genai_k_values: tuple[int, ...] = (2, 4, 6, 8)  # K at which GenAI's speculative pipeline joins the sweep
    genai_defaults_instructions: int = 3  # a pass with GenAI on its own compile defaults (0 = none)
    target_precisions: tuple[str, ...] = ("int8", "gguf-mixed", "gguf-native", "gguf", "int4")  # native: where it runs
    draft_precisions: tuple[str, ...] = ("int4", "int8", "fp16", "gguf-native", "gguf-q4")  # ours: where they run
    kv_cache_precisions: tuple[str, ...] = ("u8", "f16", "")  # "" = our default (f32 on CPU)
    transformers_instructions: int = 3  # transformers is slow on CPU: fewer instructions
    transformers_tokens: int = 40
    lookup_instructions: int = 3  # of EDIT_INSTRUCTIONS
    warmup_tokens: int = 16  # tokens of each lane's warm-up run
    watching_repeats: int = 4  # runs of each way (CLI, page API, page in Chromium) in the watching section
    humaneval_problems: int = 50  # the first n HumanEval problems (the notebook averages over 50)
    humaneval_tokens: int = 320  # new tokens per HumanEval answer, at most (a whole function, code only)
    sections: tuple[str, ...] = tuple(s for s in SECTIONS if s not in OPT_IN)

    def __post_init__(self):
        if unknown := set(self.sections) - set(SECTIONS):
            raise ValueError(f"unknown bench section {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
        if not 1 <= self.instructions <= len(CODE_INSTRUCTIONS):
            raise ValueError(f"instructions must be between 1 and {len(CODE_INSTRUCTIONS)}, got {self.instructions}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")
        if not 1 <= self.humaneval_problems <= 164:
            raise ValueError(f"--problems must be between 1 and 164 (HumanEval's problems), got {self.humaneval_problems}")


FULL = BenchSettings()
# A couple of minutes: the default pair only (no conversions), two instructions, short outputs.
QUICK = BenchSettings(mode="quick", instructions=2, paper_tokens=(40,), sweep_tokens=40, k_values=(1, 2, 4, 8),
                      head_tokens=(16000, 0), genai_k_values=(), genai_defaults_instructions=0, target_precisions=(),
                      draft_precisions=(), kv_cache_precisions=(), transformers_instructions=1, transformers_tokens=16,
                      lookup_instructions=1, sections=tuple(s.name for s in REGISTRY if s.quick))


def check_generation(generation: GenerationSettings) -> None:
    """The bench compares greedy outputs token for token with its peers; refuse what would break that."""
    if not generation.greedy:
        raise ValueError("the benchmark measures greedy decoding (its peers are compared token for token); drop --temperature")
    if generation.drafter != MASKED:
        raise ValueError("the benchmark's speculative lanes use the draft model; prompt lookup has its own section (--only lookup)")
