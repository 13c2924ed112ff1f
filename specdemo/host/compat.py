"""What our stack needs to run well here, in one place: the torchvision workaround, keeping torch out of
a serving process, and the OpenVINO compile configuration shared by every lane."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specdemo.settings import ModelSettings


def keep_torch_out() -> None:
    """For a process that only serves the models: make `import torch` fail from now on.

    transformers imports torch whenever it is installed, which costs a serving process ~6 s of start-up
    and ~350 MB it never uses (tokenizers and chat templates need no torch). Conversion, which does
    need it, runs in a child process (specdemo/models/convert.py). Call this before transformers is imported.
    """
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # importlib then answers "not installed"
    # transformers says "PyTorch was not found. Models won't be available …" when imported without torch, which reads
    # like a broken install; here it is the plan. Import it now with its advisory warnings off, and turn them on again.
    previous = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        if previous is None:
            del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = previous


def hide_broken_torchvision() -> None:
    """Make transformers run without torchvision when torchvision cannot load.

    optimum-intel depends on torchvision, but the only torchvision built for torch 2.13 on PyPI
    links CUDA libraries the CPU-only torch lacks; importing it then raises, and transformers
    imports it whenever it is installed. Text models never need it, so hide it.
    """
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # importlib.util.find_spec now answers None


def compile_config(settings: ModelSettings, cache_dir: Path | None) -> dict:
    """The options every compile of our models uses: the page, the CLI, the bench and GenAI's peer lanes
    compile with these, so their figures compare the same plugin settings."""
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    precision, kv = settings.inference_precision, settings.kv_cache_precision
    if settings.device.upper().startswith("CPU"):
        # Measured on a 2-core AVX-512/BF16 CPU with INT8/INT4 weights: f32 activations are as fast as
        # the bf16 default and keep batched and single-token logits close (bf16 rounds logits near 20 to
        # steps of 0.125, so exact ties flip). With f32 activations the plugin would store the KV cache
        # in f16, which made a decode step ~12% slower than an f32 (or u8) cache; f32 also rolls back
        # exactly and costs 57 KB per token for the 1.5B target.
        precision = precision or "f32"
        kv = kv or "f32"
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    if kv:
        config["KV_CACHE_PRECISION"] = kv
    if settings.num_threads:
        config["INFERENCE_NUM_THREADS"] = settings.num_threads
    if settings.dynamic_quantization_group_size >= 0:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = settings.dynamic_quantization_group_size
    if cache_dir is not None:
        config["CACHE_DIR"] = str(cache_dir)
    return config
