"""The compile settings a tune races on this machine: what the CPU offers (CPU), what a model's weights hold (Layout),
and from those the challengers that can beat a setting (challengers).

Which kernels OpenVINO's CPU plugin runs depends on the CPU and on the weights, so no setting is best everywhere, and
most settings cannot win on a given CPU class at all. Its source (OpenVINO 2025–2026, intel_cpu) says which:

* dynamic quantization of activations (the int8 dot-product kernels) needs VNNI (avx512_vnni or avx_vnni), f32
  activations and 8- or 4-bit weights; its group must be a multiple of 16, and a group that does not divide the
  weights' own groups (a GGUF's Q6_K blocks of 16, Q4_K of 32, NNCF's 128) or the rows falls to the slow path;
* bf16 or f16 inference turns dynamic quantization off, and with 8- or 4-bit weights on a VNNI CPU the int8 kernels
  win even where AMX runs bf16 (on the AMX Xeon bf16 took 2.0 times as long for the INT8 target, 1.7 times for the
  INT4 draft; on a Zen 5 it also parted the lanes 3 times as often): bf16 (avx512_bf16, amx_bf16) and f16
  (avx512_fp16, amx_fp16) are raced only where dynamic quantization cannot run anyway (f16 weights, no VNNI);
* a KV-cache precision changes only the bytes a call reads from the cache: at the CONTEXT tokens a race runs, an
  f32 cache is under 1.5 % of the default pair's weights, so u8 or f16 cannot be MARGIN faster there (f16 without
  avx512_fp16 is slower still);
* threads only where there are cores to spare (4 or more).

So `challengers` offers a tune (specdemo/learning/tune.py), from our defaults and one setting at a time, only what can
win here; the rules are tested on an AMX Xeon's, a Zen 4's and an AVX2-only EPYC's flags (tests/learning/test_tune.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specdemo.host import machine
from specdemo.learning.profile.choices import DEFAULT, Setting
from specdemo.learning.race import CONTEXT, MARGIN
from specdemo.models import kernels

GROUP_SIZES = (16, 32, 64, 128, 256)  # dynamic quantization's groups: multiples of the kernels' 16 lanes (0: off)
PLUGIN_GROUP = 32  # the group the CPU plugin takes when a compile leaves it (-1, as DEFAULT does)
KV_PRECISIONS = ("f32", "u8", "f16")
DIMENSIONS = ("dynamic_quantization_group_size", "inference_precision", "kv_cache_precision", "num_threads")
DIMENSION_NAMES = {"dynamic_quantization_group_size": "dynamic-quantization group size",
                   "inference_precision": "inference precision", "kv_cache_precision": "KV-cache precision",
                   "num_threads": "threads"}


@dataclass(frozen=True)
class CPU:
    """What the CPU offers the plugin's kernels, from its flags (/proc/cpuinfo), and the cores this process may use."""

    flags: frozenset[str]
    cores: int

    @staticmethod
    def here() -> "CPU":
        return CPU(frozenset(machine.cpu_features() + _extra_flags()), machine.usable_cores())

    @property
    def vnni(self) -> bool:
        """int8 dot products: what dynamic quantization's kernels need (oneDNN's avx512_core_vnni or avx2_vnni)."""
        return bool({"avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def int8_unit_beyond_ours(self) -> bool:
        return kernels.plugin_unit_beyond_ours(self.flags)

    def describe(self) -> str:
        """The CPU's class in words, e.g. "AVX-512 with VNNI and BF16, no AMX"."""
        if "amx_bf16" in self.flags:
            return "AMX" + (" with FP16" if "amx_fp16" in self.flags else "")
        if "avx512f" in self.flags:
            extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if flag in self.flags]
            return f"AVX-512{' with ' + ' and '.join(extras) if extras else ''}, no AMX"
        return "AVX2" + (" with VNNI" if "avx_vnni" in self.flags else " without VNNI")


@dataclass(frozen=True)
class Layout:
    """What a model's IR holds that the rules read."""

    compressed: bool  # some weights are in 8 or 4 bits (dynamic quantization applies to those only)
    groups: frozenset[int]  # the group sizes of its grouped weights (none: per channel, or not compressed)
    rows: frozenset[int]  # the lengths of its compressed weights' rows (the MatMuls' inputs)
    kv_share: float  # an f32 KV cache of race.CONTEXT tokens over the weights' bytes

    @staticmethod
    def of(folder: Path) -> "Layout":
        """Read from the IR's XML (each constant's element type and shape) and config.json."""
        shapes = [(kind, [int(n) for n in shape.split(",")]) for kind, shape in
                  re.findall(r'<data element_type="(u4|i4|u8|i8|nf4)" shape="([0-9, ]+)"', (folder / "openvino_model.xml")
                             .read_text(errors="replace"))]
        weights = [shape for _, shape in shapes if len(shape) >= 2 and shape[-1] > 1]  # zero points end in 1
        config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        heads = config.get("num_attention_heads", 1)
        per_token = 2 * 4 * config.get("num_hidden_layers", 0) * config.get("num_key_value_heads", heads) * \
            config.get("head_dim", config.get("hidden_size", 0) // heads)  # keys and values, f32
        size = (folder / "openvino_model.bin").stat().st_size if (folder / "openvino_model.bin").is_file() else 0
        return Layout(bool(weights), frozenset(s[-1] for s in weights if len(s) >= 3),
                      frozenset(math.prod(s[1:]) for s in weights), per_token * CONTEXT / size if size else 0.0)

    def groups_allowed(self) -> list[int]:
        """The dynamic-quantization groups that divide every group of the weights and every row, smallest first."""
        return [g for g in GROUP_SIZES if all(w % g == 0 for w in self.groups) and all(r % g == 0 for r in self.rows)]


def challengers(current: Setting, dimension: str, cpu: CPU, layout: Layout) -> list[Setting]:
    """The settings that can beat `current` in `dimension` on this CPU class with these weights, the most promising
    first; none: nothing to race there (the module's docstring says why)."""
    group = current.dynamic_quantization_group_size if current.dynamic_quantization_group_size != -1 else PLUGIN_GROUP
    if dimension == "dynamic_quantization_group_size":
        if not (cpu.vnni and layout.compressed and current.inference_precision in ("", "f32")):
            return []
        allowed = layout.groups_allowed()
        values = [g for g in reversed(allowed) if g > group or group not in allowed]
    elif dimension == "inference_precision":
        quantizes = cpu.vnni and layout.compressed  # bf16 and f16 would switch dynamic quantization off
        values = [] if quantizes else [p for p, flags in (("bf16", {"avx512_bf16", "amx_bf16"}),
                                                          ("f16", {"avx512_fp16", "amx_fp16"})) if flags & cpu.flags]
    elif dimension == "kv_cache_precision":
        values = (["u8"] + (["f16"] if "avx512_fp16" in cpu.flags else [])) if layout.kv_share >= MARGIN else []
    else:
        values = [cpu.cores - 1] if cpu.cores >= 4 else []
    return [replace(current, **{dimension: value}) for value in values if value != getattr(current, dimension)]


def nothing_to_race(cpu: CPU, layout: Layout) -> bool:
    """Whether no dimension offers the defaults a challenger here (an AVX2-only CPU without VNNI, on 2 cores)."""
    return not any(challengers(DEFAULT, dimension, cpu, layout) for dimension in DIMENSIONS)


def _extra_flags() -> list[str]:
    """Flags tune asks about beyond machine.cpu_features (f16 arithmetic)."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return []
    return [f for f in ("avx512_fp16", "amx_fp16") if f in flags]
