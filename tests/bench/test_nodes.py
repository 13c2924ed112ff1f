"""Where a target call's time goes (specdemo/bench/nodes.py): the bytes each matmul's weights take, the plugin's
per-node counters turned into time per call, and the report's table of both."""

import json

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from specdemo.bench.schema import Sections
from specdemo import bench, strict_json
from specdemo.bench import nodes, report_gguf
from specdemo.bench.schema import Nodes
from specdemo.bench.table import Lane, Run
from specdemo.models.runtime import OVModel
from tests.conftest import exact


def test_a_compressed_weight_counts_its_values_scales_and_zero_points_and_an_activation_product_counts_nothing():
    x = ops.parameter([1, 64], ov.Type.f32, name="x")
    values = ops.constant(np.ones((32, 64), np.uint8), ov.Type.u8)
    zero = ops.constant(np.full((32, 1), 8, np.uint8), ov.Type.u8)
    scale = ops.constant(np.ones((32, 1), np.float16), ov.Type.f16)
    weight = ops.multiply(ops.subtract(ops.convert(values, ov.Type.f16), ops.convert(zero, ov.Type.f16)), scale)
    projected = ops.matmul(x, ops.convert(weight, ov.Type.f32), False, True)
    projected.set_friendly_name("layers.0.mlp.up_proj/MatMul")
    square = ops.matmul(projected, projected, True, False)  # two activations: no weights
    square.set_friendly_name("activations/MatMul")
    sizes = nodes.weight_bytes(ov.Model([square], [x]))
    assert sizes == {"layers.0.mlp.up_proj/MatMul": 32 * 64 + 32 + 32 * 2}


def test_the_counters_window_gives_each_call_its_own_time_within_the_calls_wall_time(tiny_target):
    model = OVModel(tiny_target, exact(tiny_target), profiled=True)
    original = nodes.as_compiled(tiny_target)
    sizes = nodes.weight_bytes(original)
    names = nodes.original_names(model.compiled, sizes, nodes.bias_names(original, sizes))
    prompt = list(range(2, 40))
    for tokens in (1, 4):
        per_node, wall = nodes.profile_calls(model, prompt, tokens)
        groups = {g.name: g for g in nodes.group_nodes(per_node, names, sizes)}
        in_nodes = sum(g.ms_per_call for g in groups.values()) / 1e3
        # The counters hold means over every request since compilation (the prompt included): read as totals of
        # the window, they must fit in the calls' own wall time (a mean read as a total would not).
        assert 0 < in_nodes <= wall
        assert groups["LM head"].weight_bytes > 0 and groups["MLP (gate, up, down)"].weight_bytes > 0
        projections = sum(size for name, size in sizes.items() if "self_attn" in name and "_proj" in name)
        assert groups["attention projections (q, k, v, o)"].weight_bytes == projections > 0  # two layers' q, k, v, o
        # every matmul's weights are found, once, behind the exec node that computes it
        assert sum(g.weight_bytes for g in groups.values()) == sum(sizes.values())
    assert model.length == 0  # the window leaves the cache empty


def test_the_report_shows_each_group_with_its_rate_and_the_gguf_at_llamacpps_time():
    group = lambda name, ms, mb: nodes.NodeGroup(name, 1, ms, int(mb * 1e6))  # noqa: E731
    target = nodes.TargetNodes("gguf", "group 16, f32, KV f32", 1_100_000_000, {
        1: [group("LM head", 10.0, 262.0), group("attention (SDPA with the KV cache)", 2.0, 0)],
        5: [group("LM head", 31.0, 262.0), group("attention (SDPA with the KV cache)", 5.0, 0)]}, {1: 0.052, 5: 0.080})
    section = Nodes([1, 5], 830_000_000, [target])
    cpp = [Run(Lane("llama.cpp autoregressive", "llamacpp", "autoregressive"), 0, 0, 100, 3.65, 100, section="llamacpp")]
    text = report_gguf.nodes_section(Sections(nodes=section), {}, cpp)
    assert "| LM head | 262 MB | 10.0 ms | 26.2 GB/s | 31.0 ms | 8.5 GB/s |" in text
    assert "| the call, wall time |  | 52.0 ms |  | 80.0 ms |  |" in text
    assert "0.83 GB of weights per token; at llama.cpp's 36.5 ms per token in this run that is 22.7 GB/s" in text
    assert report_gguf.nodes_section(Sections(), {}, cpp) == ""
    written = json.loads(strict_json.dumps(bench.plain(target)))  # in benchmarks.json: each group with its rate
    assert written["by_tokens"]["5"][0] == {"name": "LM head", "nodes": 1, "ms_per_call": 31.0, "weight_bytes": 262_000_000,
                                            "gb_per_s": pytest.approx(262 / 31)}
    assert written["wall_s"] == {"1": 0.052, "5": 0.080}


def test_a_matmul_whose_bias_the_plugin_fuses_keeps_its_weights_under_the_fused_nodes_name():
    """The CPU plugin fuses a bias Add into the FullyConnected and names the fused node after the Add alone (Qwen's q,
    k and v projections); the weights' bytes must still be found for it."""
    x = ops.parameter([1, 64], ov.Type.f32, name="x")
    values = ops.constant(np.ones((32, 64), np.uint8), ov.Type.u8)
    scale = ops.constant(np.ones((32, 1), np.float16), ov.Type.f16)
    weight = ops.convert(ops.multiply(ops.convert(values, ov.Type.f16), scale), ov.Type.f32)
    projected = ops.matmul(x, weight, False, True)
    projected.set_friendly_name("layers.0.self_attn.q_proj/MatMul")
    biased = ops.add(projected, ops.constant(np.ones((1, 32), np.float32)))
    biased.set_friendly_name("layers.0.self_attn.q_proj/Add")
    model = ov.Model([ops.relu(biased)], [x])
    sizes = nodes.weight_bytes(model)
    compiled = ov.Core().compile_model(model, "CPU", {"PERF_COUNT": True})
    names = nodes.original_names(compiled, sizes, nodes.bias_names(model, sizes))
    request = compiled.create_infer_request()
    request.infer({"x": np.ones((1, 64), np.float32)})
    per_node = {p.node_name: (p.node_type, p.real_time.total_seconds()) for p in request.profiling_info}
    groups = {g.name: g for g in nodes.group_nodes(per_node, names, sizes)}
    assert groups["attention projections (q, k, v, o)"].weight_bytes == 32 * 64 + 32 * 2
