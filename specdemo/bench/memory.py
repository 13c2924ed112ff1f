"""The memory section: peak RSS of autoregressive vs speculative decoding, each in a fresh process (RSS never shrinks
back, and one process holding both models would charge the draft to autoregressive decoding too); and what each section
loads beside the bench's pair, so that the bench waits for room or skips a section rather than pass the memory bound
(specdemo/host/memory.py)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdemo import strict_json
from specdemo.bench.harness import Context
from specdemo.bench.schema import Figures
from specdemo.bench.settings import BY_NAME, CODE_INSTRUCTIONS
from specdemo.host import memory
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.lane import drain
from specdemo.run.engine import Engine
from specdemo.settings import RunSettings


@dataclass(frozen=True)
class Peaks:
    """One mode's memory in a process of its own, bytes."""

    rss_loaded_bytes: int  # after loading and a short warm-up
    peak_rss_generating_bytes: int
    peak_rss_process_bytes: int  # loading and compiling included
    # Anonymous memory (RssAnon), what the memory bound counts (specdemo/host/memory.py): no mapped files.
    peak_anon_generating_bytes: int
    peak_anon_process_bytes: int
    private_bytes: int  # RSS counts the memory-mapped IR weights too (file pages the kernel may drop); this does not
    kv_cache_bytes: dict[str, int]  # by model, at the end
    tokens: int


@dataclass(frozen=True)
class Memory(Figures):
    """The memory section: each mode in a process of its own."""

    max_new_tokens: int
    autoregressive: Peaks
    speculative: Peaks


# The transformers peer holds both models in f32: TRANSFORMERS_F32 times their IR's weights.
TRANSFORMERS_F32 = 4  # f32 bytes over INT8 IR bytes per weight (an INT4 draft's are 8: counted in the draft's copies)


def section_need(name: str, target_bytes: int, draft_bytes: int, genai_k_values: tuple[int, ...] = ()) -> int:
    """Bytes of anonymous memory section `name` takes beside the bench's pair, about (its Section.copies)."""
    if name == "transformers":
        return TRANSFORMERS_F32 * target_bytes + 2 * TRANSFORMERS_F32 * draft_bytes + 2**30
    no_genai = name == "k" and not genai_k_values  # the K sweep without GenAI's lanes loads nothing beside the pair
    targets, drafts = (0, 0) if no_genai or name not in BY_NAME else BY_NAME[name].copies
    return targets * memory.compile_need(target_bytes) + drafts * memory.compile_need(draft_bytes) + 2**28


def room_for(need: int, what: str, log, holding=lambda: memory.tree_anonymous(os.getpid())) -> bool:
    """Whether `need` bytes fit beside the bench, waiting for room where other processes may free it (memory.wait_for).
    Between sections nothing of the bench's own tree is freed, so a need beyond the bound less what the tree holds (its
    pair) is skipped at once, not after wait_for's ten minutes."""
    bound, held = memory.budget(), holding()
    if need > bound - held:
        log(f"memory: skipping {what}: it needs about {memory.gib(need)} and the {memory.gib(bound)} bound leaves "
            f"{memory.gib(bound - held)} beside what the bench holds (SPECDEMO_MEMORY_BUDGET sets the bound)")
        return False
    return memory.wait_for(need, what, log)


def run_memory(ctx: Context) -> Memory:
    """Peak RSS of a process that only decodes autoregressively vs one that decodes speculatively."""
    n = ctx.sweep_tokens
    peaks = []
    root = str(Path(__file__).resolve().parents[2])  # the folder holding specdemo/, for the child's imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    for mode in (AUTOREGRESSIVE, SPECULATIVE):
        ctx.log(f"memory: {mode} in a fresh process")
        child = subprocess.run([sys.executable, "-c", "from specdemo.bench import memory; memory.child()"],
                               input=pickle.dumps((ctx.settings, mode, CODE_INSTRUCTIONS[0], n)),  # ours to ours, as is
                               capture_output=True, env=env)
        if child.returncode != 0:
            raise RuntimeError(f"the {mode} memory probe failed:\n{child.stderr.decode(errors='replace')[-2000:]}")
        peaks.append(Peaks(**json.loads(child.stdout.decode().strip().splitlines()[-1])))
    return Memory(n, *peaks)


def child() -> None:
    """The memory probe's process: (settings, mode, instruction, n) pickled on stdin; measure, then print one JSON line
    on stdout."""
    print(strict_json.dumps(asdict(measure_memory(*pickle.load(sys.stdin.buffer)))))


def measure_memory(settings: RunSettings, mode: str, instruction: str, n: int) -> Peaks:
    """In this process: load, warm up, generate `n` tokens, sampling RSS and anonymous memory every 5 ms throughout
    (bytes); sampled, not read from getrusage: on Linux a child inherits its parent's peak RSS."""
    import psutil

    process = psutil.Process()
    samples: list[tuple[int, int]] = []  # (RSS, RssAnon) every 5 ms
    done = threading.Event()

    def sample():
        while not done.wait(0.005):
            samples.append((process.memory_info().rss, memory.resident_anonymous(process.pid)))  # no child here

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        engine = Engine.load(settings, with_draft=mode == SPECULATIVE)
        generation = replace(settings.generation, max_new_tokens=n)
        drain(getattr(engine, mode)(instruction, replace(generation, max_new_tokens=8)))
        loaded = (process.memory_info().rss, memory.resident_anonymous(process.pid))
        generating = len(samples)  # the samples from here on are the generation's
        summary = drain(getattr(engine, mode)(instruction, generation)).summary
    finally:
        done.set()
        sampler.join()
    usage = process.memory_info()
    during, throughout = [loaded, *samples[generating:]], [*samples, loaded]
    return Peaks(loaded[0], max(rss for rss, _ in during), max(rss for rss, _ in throughout),
                 max(anon for _, anon in during), max(anon for _, anon in throughout), usage.rss - usage.shared,
                 summary.kv_cache_bytes, summary.tokens)
