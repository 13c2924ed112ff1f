"""Where a target call's time goes: OpenVINO's per-node counters against the weight bytes each node reads.

Decoding on a CPU is bound by how fast the weights stream from memory, so each group of nodes is shown with the
bytes of the weights it reads per call and the rate that gives (GB/s). A group well below the others' rate is
a slow kernel, not a memory limit; a whole step at the rate its weights allow can only get faster by reading fewer
bytes. The GGUF file itself is priced the same way: the bytes of every weight its matmuls read per token (the
embedding, when the LM head shares it, once as the head), which at llama.cpp's measured time per token gives the
rate it streams at.

The plugin's counters (PERF_COUNT) hold, per node, the mean over every call since compilation, so a window of
calls is the difference of mean × calls before and after it.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from specdemo.learning import tune
from specdemo.models import graph, kernels
from specdemo.models.loading import describe_compile

# Groups, in the order the report lists them: (name, test on the node's original name and type).
GROUPS = (
    ("LM head", lambda name, kind: "lm_head" in name),
    ("MLP (gate, up, down)", lambda name, kind: bool(re.search(r"mlp\.(gate|up|down)_proj", name))),
    ("attention projections (q, k, v, o)", lambda name, kind: bool(re.search(r"self_attn\.[qkvo]_proj", name))),
    ("attention (SDPA with the KV cache)",  # the plugin's, or specdemo's CachedAttention (cached_attention.own_attention)
     lambda name, kind: kind.startswith("ScaledDotProductAttention") or name.endswith("/CachedAttention")),
    ("other matmuls (a GGUF import's Q4_K offsets; RoPE's)", lambda name, kind: kind.startswith("FullyConnected") or kind == "MatMul"),
)
OTHER = "everything else (norms, RoPE, adds, embedding)"
WINDOW = 8  # calls per measured window
REPEATS = 3  # windows of each call size, taken in turns; each node's median is kept (a window lasts about a second,
# and a burst of the shared host's load in one would otherwise stand for the whole size)


@dataclass
class NodeGroup:
    """One group's share of a call."""

    name: str
    nodes: int
    ms_per_call: float  # wall time of its nodes, summed, per call
    weight_bytes: int  # bytes of the constants its nodes read (weights, scales, offsets)

    @property
    def gb_per_s(self) -> float:
        return self.weight_bytes / (self.ms_per_call * 1e6) if self.ms_per_call > 0 and self.weight_bytes else float("nan")

    def to_json(self) -> dict:
        """As benchmarks.json keeps it: with its rate."""
        return {**asdict(self), "gb_per_s": self.gb_per_s}


@dataclass(frozen=True)
class TargetNodes:
    """One target precision compiled as it runs here: its node groups and whole calls, per call size (tokens a call)."""

    precision: str
    compile_settings: str  # in the model panel's words (models.describe_compile)
    weight_bytes: int  # of all its weights: what a call reads
    by_tokens: dict[int, list[NodeGroup]]  # the groups, in GROUPS' order (OTHER last), those with nodes
    wall_s: dict[int, float]  # seconds of a whole call, median


def as_compiled(folder: Path):
    """The IR of `folder` with the edits runtime.OVModel makes before compiling that move weights between nodes (the
    projections fused: graph.fuse_projections), so node names and weight bytes match the compiled model's."""
    model = kernels.new_core().read_model(Path(folder) / "openvino_model.xml")
    graph.fuse_projections(model)
    return model


def weight_bytes(model) -> dict[str, int]:
    """{node name: bytes of the constants on its weight input} for every MatMul (and BlockMatMul: its raw blocks) of an
    ov.Model: the constants feeding input 1 (the weights, with their decompression's scales and zero points), followed
    up through nodes computed from constants only. A MatMul of two activations is left out."""
    sizes = {}
    for node in model.get_ordered_ops():
        if node.get_type_name() not in ("MatMul", graph.BLOCK_MATMUL):
            continue  # a Gather (the embedding) reads one row per token, not its table
        if size := _constant_bytes(node.input_value(1).get_node()):
            sizes[node.get_friendly_name()] = size
    return sizes


def bias_names(model, sizes: dict[str, int]) -> dict[str, str]:
    """{Add: MatMul} for every weighted MatMul whose only consumer is an Add: the plugin fuses such a bias into the
    FullyConnected and names the fused node after the Add alone (Qwen's q, k and v projections)."""
    names = {}
    for node in model.get_ordered_ops():
        if node.get_type_name() not in ("MatMul", graph.BLOCK_MATMUL) or node.get_friendly_name() not in sizes:
            continue
        consumers = list(node.output(0).get_target_inputs())
        if len(consumers) == 1 and consumers[0].get_node().get_type_name() == "Add":
            names[consumers[0].get_node().get_friendly_name()] = node.get_friendly_name()
    return names


def _constant_bytes(node) -> int | None:
    """Bytes of the Constants `node` is computed from; None if it depends on anything else (an input, a state)."""
    if node.get_type_name() == "Constant":
        return int(node.get_byte_size())
    total = 0
    for value in node.input_values():
        if (size := _constant_bytes(value.get_node())) is None:
            return None
        total += size
    return total if node.get_input_size() else None  # no input: a Parameter or a ReadValue, an activation


def node_seconds(request) -> dict[str, tuple[str, float]]:
    """{exec node: (type, mean seconds per request so far)} — the plugin's counters hold means over requests."""
    return {p.node_name: (p.node_type, p.real_time.total_seconds()) for p in request.profiling_info}


def profile_calls(model, prompt: list[int], tokens: int, calls: int = WINDOW) -> tuple[dict[str, tuple[str, float]], float]:
    """({exec node: (type, seconds per call)}, wall seconds per call) over `calls` calls of `tokens` tokens each after
    `prompt` and one warm-up call; `model` a runtime.OVModel compiled with profiled=True. Each call is rolled back after
    it, so every call scores the same positions."""
    model.reset()
    model.forward(prompt)
    length = model.length
    model.forward(prompt[-tokens:], logits_to_keep=tokens)
    model.rollback(length)
    before, n_before = node_seconds(model.request), model.requests
    wall = 0.0
    for _ in range(calls):
        model.forward(prompt[-tokens:], logits_to_keep=tokens)
        wall += model.last_call_s
        model.rollback(length)
    after, n_after = node_seconds(model.request), model.requests
    model.reset()
    # A mean over n requests times n is a total; the window's share is the difference of totals (at least 0: the
    # counters are whole microseconds).
    per_node = {name: (kind, max(0.0, seconds * n_after - before.get(name, (kind, 0.0))[1] * n_before) / calls)
                for name, (kind, seconds) in after.items()}
    return per_node, wall / calls


def group_nodes(per_node: dict[str, tuple[str, float]], exec_names: dict[str, str], sizes: dict[str, int]) -> list[NodeGroup]:
    """Sum the nodes into GROUPS (and OTHER). `exec_names` maps an exec node to the original node it computes (the
    plugin keeps a MatMul's name for its FullyConnected), `sizes` is weight_bytes of the original model."""
    groups = {name: NodeGroup(name, 0, 0.0, 0) for name, _ in GROUPS}
    groups[OTHER] = NodeGroup(OTHER, 0, 0.0, 0)
    counted = set()  # a MatMul's weights are read once, however many exec nodes carry its name
    for node, (kind, seconds) in per_node.items():
        original = exec_names.get(node, node)
        name = next((g for g, test in GROUPS if test(original, kind)), OTHER)
        group = groups[name]
        group.nodes += 1
        group.ms_per_call += seconds * 1e3
        if original not in counted:
            group.weight_bytes += sizes.get(original, 0)
            counted.add(original)
    return [g for g in groups.values() if g.nodes]


def original_names(compiled, weighted: dict[str, int], biases: dict[str, str]) -> dict[str, str]:
    """{exec node name: the original node whose weights it reads} from the runtime model's rt_info: of the original
    nodes an exec node fuses, the one in `weighted` (weight_bytes) or the MatMul of a bias Add (bias_names), else the
    first."""
    names = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        original = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
        candidates = [n for n in original.split(",") if n]
        matmul = next((n if n in weighted else biases[n] for n in candidates if n in weighted or n in biases), None)
        names[op.get_friendly_name()] = matmul or (candidates[0] if candidates else op.get_friendly_name())
    return names


def gguf_read_bytes(path: Path) -> int:
    """Bytes of the weights a GGUF model's matmuls read per token: every 2-D tensor except the token embedding (one
    row per token), which counts whole when there is no output.weight (the LM head shares it)."""
    import gguf

    tensors = gguf.GGUFReader(str(path)).tensors
    embedding = "token_embd.weight" if any(t.name == "output.weight" for t in tensors) else None  # not the LM head
    return sum(int(t.n_bytes) for t in tensors if len(t.shape) >= 2 and t.name != embedding)


def profile_target(settings, prompt: list[int], tokens_per_call: tuple[int, ...], log) -> TargetNodes:
    """One target precision compiled as it runs here, with counters on: per group and call size, ms and bytes."""
    model = tune.compile_model(settings, profiled=True)
    original = as_compiled(model.folder)
    sizes = weight_bytes(original)
    exec_names = original_names(model.compiled, sizes, bias_names(original, sizes))
    windows = {tokens: [] for tokens in tokens_per_call}
    for _ in range(REPEATS):
        for tokens in tokens_per_call:
            windows[tokens].append(profile_calls(model, prompt, tokens))
    by_tokens, wall = {}, {}
    for tokens, taken in windows.items():
        per_node = {name: (kind, statistics.median(w[0][name][1] for w in taken)) for name, (kind, _) in taken[0][0].items()}
        wall[tokens] = wall_s = statistics.median(w[1] for w in taken)
        by_tokens[tokens] = group_nodes(per_node, exec_names, sizes)
        log(f"nodes: {settings.precision}, {tokens} token(s) a call: "
            f"{sum(g.ms_per_call for g in by_tokens[tokens]):.1f} ms in the nodes of {wall_s * 1e3:.1f} ms a call")
    return TargetNodes(settings.precision, describe_compile(settings), sum(sizes.values()), by_tokens, wall)
