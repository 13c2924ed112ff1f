"""The memory section: peak RSS of autoregressive vs speculative decoding, each in a fresh process; and what each
section loads beside the bench's own pair, so that the bench waits for room or skips a section rather than go past the
memory bound (specdemo/host/memory.py).

A fresh process per mode: RSS never shrinks back, and one process holding both models would charge
the draft to autoregressive decoding too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from specdemo import strict_json
from specdemo.bench.harness import Context
from specdemo.bench.settings import BY_NAME, CODE_INSTRUCTIONS
from specdemo.host import memory
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import GenerationSettings, KPolicy, ModelSettings, RunSettings


# The transformers peer holds both models in f32: TRANSFORMERS_F32 times their IR's weights.
TRANSFORMERS_F32 = 4  # f32 bytes over INT8 IR bytes per weight (an INT4 draft's are 8: counted in the draft's copies)


def section_need(name: str, target_bytes: int, draft_bytes: int, genai_k_values: tuple[int, ...] = ()) -> int:
    """Bytes of anonymous memory section `name` takes beside the bench's pair, about (its Section.copies)."""
    if name == "transformers":
        return TRANSFORMERS_F32 * target_bytes + 2 * TRANSFORMERS_F32 * draft_bytes + 2**30
    no_genai = name == "k" and not genai_k_values  # the K sweep without GenAI's lanes loads nothing beside the pair
    targets, drafts = (0, 0) if no_genai or name not in BY_NAME else BY_NAME[name].copies
    return targets * memory.compile_need(target_bytes) + drafts * memory.compile_need(draft_bytes) + 2**28


def run_memory(ctx: Context) -> dict:
    """Peak RSS of a process that only decodes autoregressively vs one that decodes speculatively."""
    n = ctx.sweep_tokens
    figures = {"max_new_tokens": n}
    root = str(Path(__file__).resolve().parents[2])  # the folder holding specdemo/, for the child's imports
    for mode in (AUTOREGRESSIVE, SPECULATIVE):
        ctx.log(f"memory: {mode} in a fresh process")
        request = strict_json.dumps({"settings": asdict(ctx.settings), "mode": mode, "instruction": CODE_INSTRUCTIONS[0], "n": n})
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from specdemo.bench import memory; memory.child(sys.argv[1])", request],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))},
        )
        if child.returncode != 0:
            raise RuntimeError(f"the {mode} memory probe failed:\n{child.stderr[-2000:]}")
        figures[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    return figures


def child(request: str) -> None:
    """The memory probe's process: measure, then print one JSON line on stdout."""
    r = json.loads(request)
    s = r["settings"]
    generation = GenerationSettings(**{**s["generation"], "k_policy": KPolicy(**s["generation"]["k_policy"])})
    settings = RunSettings(ModelSettings(**s["target"]), ModelSettings(**s["draft"]), generation)
    print(strict_json.dumps(measure_memory(settings, r["mode"], r["instruction"], r["n"])))


def measure_memory(settings: RunSettings, mode: str, instruction: str, n: int) -> dict:
    """In this process: load, warm up, generate `n` tokens, sampling RSS and anonymous memory every 5 ms throughout
    (bytes).

    Sampled rather than read from getrusage: on Linux a child inherits its parent's peak RSS.
    """
    import threading

    import psutil

    process = psutil.Process()
    peak = {"process": 0, "generating": 0, "anon_process": 0, "anon_generating": 0}
    done = threading.Event()

    def sample():
        while not done.wait(0.005):
            rss, anon = process.memory_info().rss, memory.resident_anonymous(process.pid)  # no child here
            peak["process"] = max(peak["process"], rss)
            peak["generating"] = max(peak["generating"], rss)
            peak["anon_process"] = max(peak["anon_process"], anon)
            peak["anon_generating"] = max(peak["anon_generating"], anon)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        engine = Engine.load(settings, with_draft=mode == SPECULATIVE)
        generation = replace(settings.generation, max_new_tokens=n)
        drain(getattr(engine, mode)(instruction, replace(generation, max_new_tokens=8)))
        loaded = process.memory_info().rss
        peak["generating"], peak["anon_generating"] = loaded, memory.resident_anonymous(process.pid)
        summary = drain(getattr(engine, mode)(instruction, generation)).summary
    finally:
        done.set()
        sampler.join()
    usage = process.memory_info()
    return {
        "rss_loaded_bytes": loaded,  # after loading and a short warm-up
        "peak_rss_generating_bytes": peak["generating"],
        "peak_rss_process_bytes": peak["process"],  # loading and compiling included
        # Anonymous memory (RssAnon), what the memory bound counts (specdemo/host/memory.py): no mapped files.
        "peak_anon_generating_bytes": peak["anon_generating"],
        "peak_anon_process_bytes": peak["anon_process"],
        # RSS counts the memory-mapped IR weights too (file pages the kernel may drop); this does not.
        "private_bytes": usage.rss - usage.shared,
        "kv_cache_bytes": summary.kv_cache_bytes,
        "tokens": summary.tokens,
    }
