"""Long use: 200 generations the way the page runs them hold memory, Python objects, threads and the work
per run steady. Tiny random models. Figures: docs/reliability.md."""

import ctypes
import ctypes.util
import gc
import queue
import threading

import numpy as np
import psutil
import pytest

from specdemo.settings import GenerationSettings
from specdemo.names import AUTOREGRESSIVE, LANES, SPECULATIVE
from specdemo.serve.lanes import LaneRun, follow, start_lanes
from specdemo.serve.values import ONE_AFTER_ANOTHER

pytestmark = pytest.mark.slow  # about a minute

OBJECTS_EVERY = 5  # runs between counts of live Python objects (a full collection costs a tenth of a second)


def live_rss(process: psutil.Process) -> int:
    """The process's RSS in bytes once glibc has returned its free heap pages to the system.

    Freed memory that glibc keeps for reuse is not a leak, yet after a long test session (real models loaded and
    dropped) it kept RSS growing ~20 KB per tiny generation for 50+ runs, then stopped. A leak is live memory,
    which no trim releases. Elsewhere than glibc, plain RSS."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)
    return process.memory_info().rss


def soak(engines: dict, runs: int, settings: GenerationSettings, instructions: list[str]) -> dict[str, list]:
    """Run both lanes `runs` times the way the page does (worker threads, inbox, follow), cycling through
    `instructions`. After each run: the process's RSS in bytes, the CPU seconds the run took and what each
    lane did (token ids and model calls); after every OBJECTS_EVERY-th run, the live Python objects.

    CPU seconds, not wall seconds: on a shared machine another process can stretch a run's wall time at
    any moment, while the work a run does is what a leak or a growing structure would change."""
    process = psutil.Process()
    measures = {"rss": [], "cpu_s": [], "objects": [], "work": []}
    for i in range(runs):
        instruction = instructions[i % len(instructions)]
        jobs = {  # as the page's Generate builds them
            AUTOREGRESSIVE: lambda cancel: engines[AUTOREGRESSIVE].autoregressive(instruction, settings, cancel),
            SPECULATIVE: lambda cancel: engines[SPECULATIVE].speculative(instruction, settings, cancel),
        }
        lanes = {name: LaneRun() for name in LANES}
        inbox = queue.SimpleQueue()
        cpu = sum(process.cpu_times()[:2])
        threads = start_lanes(jobs, ONE_AFTER_ANOTHER, threading.Event(), inbox)
        for _ in follow(lanes, threads, inbox):
            pass
        measures["cpu_s"].append(sum(process.cpu_times()[:2]) - cpu)
        assert all(lane.summary and not lane.error for lane in lanes.values())
        measures["work"].append((instruction, *((tuple(e.id for e in lane.events), lane.summary.target_calls,
                                                 lane.summary.draft_calls) for lane in lanes.values())))
        if i % OBJECTS_EVERY == 0:
            gc.collect()
            measures["objects"].append(len(gc.get_objects()))
        measures["rss"].append(live_rss(process))
    return measures


def slope(values: list[float]) -> float:
    """Least-squares change per run."""
    return float(np.polyfit(np.arange(len(values)), values, 1)[0])


def least_growth(values: list[float], stretches: int = 4) -> float:
    """The smallest growth per run over `stretches` equal stretches of runs.

    A leak grows in every stretch; a one-off step (an allocator arena for a new thread, a buffer sized
    for a longer prompt, a cache filling) lands in one stretch only."""
    size = len(values) // stretches
    return min(slope(values[i : i + size]) for i in range(0, size * stretches, size))


def test_200_generations_hold_memory_objects_threads_and_work_steady(tiny_engine):
    """After 80 warm-up generations (the allocator settles), 200 more: live RSS may grow less than 16 KB per
    generation (one leaked KV cache of these tiny models is ~25 KB per model), live Python objects not
    at all, each instruction makes the same model calls every time, and every worker thread ends."""
    engines = {AUTOREGRESSIVE: tiny_engine, SPECULATIVE: tiny_engine}
    instructions = [" ".join(f"w{(7 * i + j) % 500 + 2}" for j in range(5 + 3 * i)) for i in range(10)]
    settings = GenerationSettings(max_new_tokens=24)
    threads_before = threading.active_count()
    soak(engines, 40, settings, instructions)
    measures = soak(engines, 100, settings, instructions)

    kb_per_generation = least_growth(measures["rss"]) / 2 / 1024
    assert kb_per_generation < 16, f"RSS grows {kb_per_generation:.1f} KB per generation in every stretch of 25 runs"
    objects_per_run = least_growth(measures["objects"]) / OBJECTS_EVERY
    assert objects_per_run < 0.5, f"{objects_per_run:.1f} more live Python objects after every run"
    assert len(set(measures["work"])) == len(instructions)  # greedy: the same tokens and calls on every repeat
    assert threading.active_count() == threads_before
    # A backstop for growth that adds no objects (a string or buffer that lengthens): the runs' CPU time.
    # Medians of 50 runs, and a margin other processes cannot reach by contending for the cores.
    early, late = np.median(measures["cpu_s"][:50]), np.median(measures["cpu_s"][50:])
    assert late < 3 * early, f"runs grew from {early * 1000:.1f} to {late * 1000:.1f} CPU ms"
