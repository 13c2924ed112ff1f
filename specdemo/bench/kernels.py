"""One layer's MatMul, several ways, against this machine's read bandwidth (issue 47's first step): specdemo's
BlockMatMul over the file's own blocks on each ISA path this CPU runs, its own way (the gemm on packed panels, where it
has one) and its dot products of each row (llama.cpp's arithmetic, "…/dots"), and the CPU plugin's MatMul on the same
weights as `gguf-mixed` lays them (Q4_K as i4 in groups of 32 plus the offsets' MatMul; Q6_K per channel in i8).

For M activation rows a call (1: a step; K + 1: a verification; more: a prefill's piece), each path's median time a
layer and the GB/s it streams the tensor's bytes at (the file's for BlockMatMul, though its packed panels are 1.06×
them for Q4_K, 1.01× for Q6_K; the IR's for the plugin), beside the read bandwidth measured in the same run by as many
threads as the compiles use. A call runs the layer of every block side by side (e.g. each ffn_up of 28 blocks), so its
weights come from memory as a step's do (one 7.7 MB layer stays in a 260 MiB L3 between calls) and the threads stay as
busy as in a step (a lone node pays their wake-up).
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.bench import llamacpp
from specdemo.bench.report_tables import table
from specdemo.bench.schema import Figures, Sections, Skipped
from specdemo.models import kernels
from specdemo.models.block_matmul import block_matmul
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.gguf_import import BlockWeights

BANDWIDTH_BYTES = 1 << 30  # the read pass's buffer: far above any L3 these machines have


@dataclass(frozen=True)
class Timing:
    """One way's call at one M, per layer."""

    ms: float  # median milliseconds
    gbs: float  # GB/s its weights stream at
    bytes: int  # of its weights, as this way reads them (the file's for BlockMatMul, the IR's for the plugin)


@dataclass(frozen=True)
class Layer:
    """The table of the module's docstring for one layer name of one GGUF block kind."""

    layer: str  # "ffn_up"
    layers: int  # of the model's blocks, one call running them all
    kind: str  # the GGUF block kind: "Q4_K", "Q6_K", …
    shape: list[int]  # of one layer's weight: (rows, columns)
    threads: int
    bandwidth_gbs: float  # the read bandwidth measured in the same run (read_bandwidth)
    ways: dict[str, dict[int, Timing]]  # way -> M -> its call


@dataclass(frozen=True)
class Kernels(Figures):
    cpu_isas: list[str]  # kernels.supported_isas()
    layers: list[Layer]


def read_bandwidth(threads: int, repeats: int = 5) -> float:
    """Bytes a second `threads` threads read from memory together (the best of `repeats` passes), each thread its part of
    a buffer far larger than the caches: through the kernels' read pass (kernels.read: loads only), or where the kernels
    do not run, numpy's reduction (its arithmetic makes it read ~15 % slower: the shares of the bandwidth read higher)."""
    buffer = np.ones(BANDWIDTH_BYTES // 8, dtype=np.int64)
    parts = np.array_split(buffer, threads)
    read = kernels.read if kernels.unavailable() is None else np.bitwise_or.reduce
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=read, args=(part,)) for part in parts]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, buffer.nbytes / (time.perf_counter() - start))
    return best


def compile_layers(file: GGUFFile, tensors: list[str], way: str, threads: int) -> tuple[ov.CompiledModel, int]:
    """x (1, M, columns) → x · Wᵀ for each of `tensors` (one shape), the `way` ("blocks": BlockMatMul; "gguf-mixed": the
    plugin's MatMul), compiled on the CPU with `threads`; and the bytes of weights a call reads."""
    columns = file.tensors[tensors[0]].shape[1]
    x = ops.parameter([1, -1, columns], ov.Type.f32, name="x")  # (1, M, columns), as the graph feeds it
    weights, outputs, read = BlockWeights(file, "mixed"), [], 0
    for tensor in tensors:
        if way == "blocks":
            raw = np.asarray(file.tensors[tensor].data)
            outputs.append(block_matmul(x.output(0), raw, file.tensors[tensor].kind))
            read += raw.nbytes
        else:
            outputs.append(weights.linear(x.output(0), tensor, tensor))
    model = ov.Model([ops.result(y) for y in outputs], [x])
    with tempfile.TemporaryDirectory() as folder:  # through the IR, as every model specdemo runs
        ov.save_model(model, Path(folder) / "layer.xml", compress_to_fp16=False)
        core = kernels.new_core()
        model = core.read_model(Path(folder) / "layer.xml")
        if way != "blocks":
            read = sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant"
                       and len(op.get_output_shape(0)) >= 2)  # the weights, scales and offsets; not the reshapes' shapes
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                                                     "INFERENCE_PRECISION_HINT": "f32"})
    return compiled, read


def time_calls(compiled: ov.CompiledModel, m: int, columns: int, repeats: int) -> float:
    """The median seconds of a call on M = `m` random activation rows (after two warm-up calls)."""
    request = compiled.create_infer_request()
    x = np.random.default_rng(m).standard_normal((1, m, columns)).astype(np.float32)
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        request.infer({0: x})
        if i >= 2:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_layer(path: Path, layer: str = "ffn_up", rows_per_call=(1, 2, 5, 9, 16), threads: int = 2,
                  repeats: int = 15, log=print) -> Layer:
    """The table of the module's docstring for `layer` (e.g. "ffn_up") of the GGUF at `path`, every way timed at each M
    back to back (so the host's drift hits them alike)."""
    file = GGUFFile(path)
    tensors = sorted((name for name in file.tensors if name.endswith(f".{layer}.weight")),
                     key=lambda name: int(name.split(".")[1]))
    # Q4_K_M mixes Q4_K and Q6_K in ffn_down and attn_v: measure one kind at a time, the first block's
    kind, shape = file.tensors[tensors[0]].kind, list(file.tensors[tensors[0]].shape)
    tensors = [name for name in tensors if file.tensors[name].kind == kind]
    count, columns = len(tensors), shape[1]
    bandwidth = read_bandwidth(threads)
    log(f"read bandwidth, {threads} threads: {bandwidth / 1e9:.1f} GB/s")
    ways = {"gguf-mixed": compile_layers(file, tensors, "gguf-mixed", threads)}
    blocks = compile_layers(file, tensors, "blocks", threads)
    for isa in kernels.supported_isas():  # each ISA its own way (the gemm, where it has one), then its dot products
        ways[f"blocks/{isa}"] = blocks
        kernels.use(isa)
        if kind in kernels.gemm_kinds():
            ways[f"blocks/{isa}/dots"] = blocks
    results = {way: {} for way in ways}
    for m in rows_per_call:
        for way, (compiled, read) in ways.items():
            if way.startswith("blocks/"):
                kernels.use(way.split("/")[1])
                kernels.gemm_from(10**9 if way.endswith("/dots") else 0)
            seconds = time_calls(compiled, m, columns, repeats if way != "blocks/scalar" else 2) / count
            results[way][m] = Timing(1e3 * seconds, read / count / seconds / 1e9, read // count)
        log(f"M = {m}: " + ", ".join(f"{way} {r[m].ms:.3f} ms ({r[m].gbs:.1f} GB/s)" for way, r in results.items()))
    kernels.use("")
    kernels.gemm_from(0)
    return Layer(layer, count, kind, shape, threads, bandwidth / 1e9, results)


# ---- the bench section (settings.REGISTRY: "kernels")


def run_kernels(ctx) -> Kernels | Skipped:
    """The table for the target's Q4_K layers (ffn_up: 1536 → 8960 on the default target) and its Q6_K ones (ffn_down,
    those of that type), on the M of a step, of verifications and of a prefill's piece."""
    path = llamacpp.gguf_path(ctx.settings.target.source)
    if path is None or kernels.unavailable():
        return Skipped(kernels.unavailable() or f"{ctx.settings.target.source} has no GGUF file to read blocks from")
    rows = tuple(sorted({1, 2, 5, 9, 16, ctx.k + 1}))
    layers = [measure_layer(path, layer, rows, log=ctx.log) for layer in ("ffn_up", "ffn_down")]
    return Kernels(kernels.supported_isas(), layers)


def kernels_section(sections: Sections, plots: dict, runs=()) -> str:
    """The report's part: each layer's table, a row per way, a column per M, GB/s and the share of the bandwidth."""
    if not (section := sections.kernels):
        return ""
    if isinstance(section, Skipped):
        return f"## specdemo's kernels, one layer\n\nNot measured: {section.skipped}."
    parts = ["## specdemo's kernels, one layer\n\nBlockMatMul over the file's own blocks on each ISA path this CPU runs "
             f"({', '.join(section.cpu_isas)}), each forced in turn, its own way (the gemm on packed panels, where it "
             "has one) and its dot products held (…/dots), beside the CPU plugin's MatMul on the same weights "
             "as gguf-mixed lays them; every layer of the model of that shape in one call, so the weights come from memory "
             "as a step's do. Time a layer, the rate its weights stream at, and that rate's share of the read bandwidth "
             "measured in the same run."]
    for layer in section.layers:
        ms = sorted(next(iter(layer.ways.values())))
        rows = [[way] + [f"{r[m].ms:.3f} ms, {r[m].gbs:.1f} GB/s ({r[m].gbs / layer.bandwidth_gbs:.0%})" for m in ms]
                for way, r in layer.ways.items()]
        parts.append(f"**{layer.layer}** ({layer.kind}, {layer.shape[1]} → {layer.shape[0]}, {layer.layers} "
                     f"layers; read bandwidth {layer.bandwidth_gbs:.1f} GB/s with {layer.threads} threads):\n\n"
                     + table(["way"] + [f"M = {m}" for m in ms], rows))
    return "\n\n".join(parts)
