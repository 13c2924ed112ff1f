"""The stateful decoder graph of a Qwen2 or Llama GGUF file, built from its metadata with OpenVINO's opset: no torch,
no export, seconds instead of minutes.

It is the graph optimum-intel exports for text-generation-with-past, built directly: the interface runtime.OVModel and
OpenVINO GenAI use (inputs input_ids, attention_mask, position_ids (1, n) i64 and beam_idx (1,) i32; output logits
(1, n, V); a state variable per layer for keys and one for values, (1, kv_heads, tokens, head_dim) f32), optimum's node
names (graph.py, gguf_import.py and bench/nodes.py find the projections, the LM head and the embedding by them), and
the patterns the CPU plugin fuses: RMSNorm as Power, ReduceMean, Add, Sqrt, Divide, Multiply; rotary embedding as
rotate-half; the KV cache as ReadValue, Gather by beam_idx, Concat, Assign around a ScaledDotProductAttention, the
key-value heads repeated by Unsqueeze, bidirectional Broadcast, Reshape (the plugin's stateful SDPA then keeps the
cache itself).

Every weight comes from a `weights` object (gguf_import.py) that turns a GGUF tensor into graph nodes in the layout of
the chosen precision, and restores a Llama file's q/k row order: the graph itself is the Hugging Face model's
arithmetic, rotate-half rotary embedding included (transformers' modeling_qwen2 / modeling_llama).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.models.gguf_file import GGUFFile

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}  # GGUF architecture → transformers class
MASKED = -65504.0  # the additive attention mask's "never": what optimum's export puts there (f16's lowest)


class UnsupportedGGUF(ValueError):
    """A GGUF file this builder does not build (another architecture, a rotary scaling it does not implement)."""


@dataclass(frozen=True)
class Hyperparameters:
    """A decoder's sizes, from the file's metadata."""

    layers: int
    heads: int  # query heads
    kv_heads: int  # key-value heads (grouped-query attention when fewer than heads)
    head_dim: int
    eps: float  # RMSNorm's epsilon
    rope_theta: float  # the rotary embedding's base


def hyperparameters(file: GGUFFile) -> Hyperparameters:
    """The file's sizes; UnsupportedGGUF for an architecture or rotary variant this builder does not make."""
    architecture = file.architecture
    if architecture not in ARCHITECTURES:
        raise UnsupportedGGUF(f"{file.path.name}: its architecture is {architecture or 'not named'}; the graph is built "
                              f"for {', '.join(ARCHITECTURES)}")
    scaling = file.field("rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in file.tensors:
        raise UnsupportedGGUF(f"{file.path.name}: its rotary embedding is scaled ({scaling}), which this builder does "
                              "not implement")
    heads = int(file.field("attention.head_count"))
    head_dim = int(file.field("attention.key_length", int(file.field("embedding_length")) // heads))
    if int(file.field("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedGGUF(f"{file.path.name}: its rotary embedding covers part of each head, which this builder does "
                              "not implement")
    return Hyperparameters(
        layers=int(file.field("block_count")),
        heads=heads,
        kv_heads=int(file.field("attention.head_count_kv", heads)),
        head_dim=head_dim,
        eps=float(file.field("attention.layer_norm_rms_epsilon")),
        rope_theta=float(file.field("rope.freq_base", 10000.0)),
    )


def lm_head_tensor(file: GGUFFile) -> str:
    """The LM head's tensor: output.weight, or the embedding where the file ties them (no output.weight)."""
    return "output.weight" if "output.weight" in file.tensors else "token_embd.weight"


def matrices(file: GGUFFile) -> list[tuple[str, str]]:
    """Every weight matrix the graph reads, in the order it reads them, and how: (tensor, "Gather" or "MatMul")."""
    layers = [(f"blk.{i}.{name}.weight", "MatMul") for i in range(hyperparameters(file).layers)
              for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    return [("token_embd.weight", "Gather"), *layers, (lm_head_tensor(file), "MatMul")]


def build(file: GGUFFile, weights) -> ov.Model:
    """The stateful decoder of `file` with its weights from `weights` (gguf_import.py): linear(x, tensor, name) → x·Wᵀ,
    embedding(ids, tensor, name) → W[ids], vector(tensor) → a norm's or bias's f32 values (None when absent)."""
    size = hyperparameters(file)
    input_ids = _parameter("input_ids", [-1, -1], ov.Type.i64)
    attention_mask = _parameter("attention_mask", [-1, -1], ov.Type.i64)
    position_ids = _parameter("position_ids", [-1, -1], ov.Type.i64)
    beam_idx = _parameter("beam_idx", [-1], ov.Type.i32)

    ids = _named(ops.convert(input_ids, ov.Type.i32), "__module.model.embed_tokens/aten::embedding/Convert")
    hidden = weights.embedding(ids, "token_embd.weight", "__module.model.embed_tokens/aten::embedding/Gather")
    cos, sin = _rotary(position_ids, size)
    mask = _attention_mask(input_ids, attention_mask)
    batch = ops.gather(ops.shape_of(input_ids), _i64([0]), _i64(0))  # (1,): the states' first dimension
    assigns = []
    for layer in range(size.layers):
        hidden, stored = _decoder_layer(hidden, layer, size, weights, cos, sin, mask, beam_idx, batch)
        assigns += stored
    hidden = _rms_norm(hidden, weights.vector("output_norm.weight"), size.eps, "__module.model.norm")
    logits = weights.linear(hidden, lm_head_tensor(file), "__module.lm_head/aten::linear/MatMul")
    logits.get_tensor().set_names({"logits"})
    result = ops.result(logits)
    return ov.Model([result], assigns, [input_ids, attention_mask, position_ids, beam_idx], "specdemo-gguf")


def _decoder_layer(hidden, layer: int, size: Hyperparameters, weights, cos, sin, mask, beam_idx, batch):
    """One block: attention with its KV cache, then the gated MLP, each around a residual; returns (output, the two
    Assigns of its cache)."""
    scope = f"__module.model.layers.{layer}"
    blk = f"blk.{layer}"
    normed = _rms_norm(hidden, weights.vector(f"{blk}.attn_norm.weight"), size.eps, f"{scope}.input_layernorm")

    def projection(kind: str, tensor: str, heads: int):
        """(batch, heads, tokens, head_dim): the projection with its bias, split into heads."""
        out = weights.linear(normed, f"{blk}.{tensor}.weight", f"{scope}.self_attn.{kind}_proj/aten::linear/MatMul")
        bias = weights.vector(f"{blk}.{tensor}.bias")
        if bias is not None:
            out = _named(ops.add(out, ops.constant(bias.reshape(1, 1, -1))), f"{scope}.self_attn.{kind}_proj/aten::linear/Add")
        split = ops.reshape(out, _i64([0, 0, heads, size.head_dim]), True)
        return ops.transpose(split, ops.constant(np.array([0, 2, 1, 3], dtype=np.int32)))

    q = _rotate(projection("q", "attn_q", size.heads), cos, sin, size.head_dim)
    k = _rotate(projection("k", "attn_k", size.kv_heads), cos, sin, size.head_dim)
    v = projection("v", "attn_v", size.kv_heads)
    k_all, k_assign = _cached(k, f"past_key_values.{layer}.keypresent.{layer}.key", size, beam_idx, batch)
    v_all, v_assign = _cached(v, f"past_key_values.{layer}.valuepresent.{layer}.value", size, beam_idx, batch)
    scale = ops.constant(np.array(1.0 / np.sqrt(size.head_dim), dtype=np.float32))
    attended = ops.scaled_dot_product_attention(q, _repeat_heads(k_all, size), _repeat_heads(v_all, size), mask, scale,
                                                causal=False)
    attended.set_friendly_name(f"{scope}.self_attn/aten::scaled_dot_product_attention/ScaledDotProductAttention")
    merged = ops.reshape(ops.transpose(attended, ops.constant(np.array([0, 2, 1, 3], dtype=np.int32))),
                         _i64([0, 0, size.heads * size.head_dim]), True)
    out = weights.linear(merged, f"{blk}.attn_output.weight", f"{scope}.self_attn.o_proj/aten::linear/MatMul")
    hidden = _named(ops.add(hidden, out), f"{scope}/aten::add/Add")

    normed = _rms_norm(hidden, weights.vector(f"{blk}.ffn_norm.weight"), size.eps, f"{scope}.post_attention_layernorm")
    gate = weights.linear(normed, f"{blk}.ffn_gate.weight", f"{scope}.mlp.gate_proj/aten::linear/MatMul")
    up = weights.linear(normed, f"{blk}.ffn_up.weight", f"{scope}.mlp.up_proj/aten::linear/MatMul")
    gated = _named(ops.multiply(_named(ops.swish(gate), f"{scope}.mlp.act_fn/aten::silu/Swish"), up),
                   f"{scope}.mlp/aten::mul/Multiply")
    down = weights.linear(gated, f"{blk}.ffn_down.weight", f"{scope}.mlp.down_proj/aten::linear/MatMul")
    return _named(ops.add(hidden, down), f"{scope}/aten::add/Add_1"), [k_assign, v_assign]


def _rms_norm(x, weight: np.ndarray, eps: float, scope: str):
    """x / sqrt(mean(x²) + eps) · weight, as the plugin's RMSNorm fusion expects it."""
    square = ops.power(x, ops.constant(np.full((1, 1, 1), 2.0, dtype=np.float32)))
    mean = ops.reduce_mean(square, _i64([-1]), True)
    root = ops.sqrt(ops.add(mean, ops.constant(np.full((1, 1, 1), eps, dtype=np.float32))))
    inverse = ops.divide(ops.constant(np.ones((1, 1, 1), dtype=np.float32)), root)
    normed = _named(ops.multiply(x, inverse), f"{scope}/aten::mul/Multiply")
    return _named(ops.multiply(ops.constant(weight.reshape(1, 1, -1)), normed), f"{scope}/aten::mul/Multiply_1")


def _rotary(position_ids, size: Hyperparameters):
    """(cos, sin), each (batch, 1, tokens, head_dim): the angles position · θ^(−2i/d), both halves alike (rotate-half).

    θ^(−2i/d) is the nearest f32 (computed in f64). torch's f32 pow, which optimum's export froze into its graph, is one
    unit in the last place off in one of the target's 64 frequencies; with that one constant set to the export's, this
    graph's logits at f32 are the export's bit for bit."""
    exponents = np.arange(0, size.head_dim, 2).astype(np.float32) / np.float32(size.head_dim)
    inverse = np.float32(1.0) / (np.float64(size.rope_theta) ** exponents.astype(np.float64)).astype(np.float32)
    positions = ops.convert(ops.unsqueeze(position_ids, _i64(1)), ov.Type.f32)  # (batch, 1, tokens)
    angles = ops.matmul(ops.constant(inverse.reshape(1, -1, 1)), positions, False, False)  # (batch, head_dim/2, tokens)
    angles = ops.transpose(angles, ops.constant(np.array([0, 2, 1], dtype=np.int32)))
    both = ops.concat([angles, angles], -1)  # (batch, tokens, head_dim)
    return (ops.unsqueeze(ops.cos(both), _i64(1)), ops.unsqueeze(ops.sin(both), _i64(1)))


def _rotate(x, cos, sin, head_dim: int):
    """x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁) over the two halves of each head."""
    half = head_dim // 2
    first = ops.slice(x, _i64([0]), _i64([half]), _i64([1]), _i64([3]))
    second = ops.slice(x, _i64([half]), _i64([np.iinfo(np.int64).max]), _i64([1]), _i64([3]))
    rotated = ops.concat([ops.multiply(second, ops.constant(np.array(-1.0, dtype=np.float32))), first], -1)
    return ops.add(ops.multiply(x, cos), ops.multiply(rotated, sin))


def _cached(current, variable_id: str, size: Hyperparameters, beam_idx, batch):
    """(past and current keys or values, (batch, kv_heads, past + tokens, head_dim); the Assign storing them)."""
    info = ov.op.util.VariableInfo()
    info.data_shape, info.data_type, info.variable_id = (ov.PartialShape([-1, size.kv_heads, -1, size.head_dim]),
                                                         ov.Type.f32, variable_id)
    variable = ov.op.util.Variable(info)
    empty = ops.broadcast(ops.constant(np.array(0.0, dtype=np.float32)),
                          ops.concat([batch, _i64([size.kv_heads]), _i64([0]), _i64([size.head_dim])], 0))
    past = ops.gather(ops.read_value(empty, variable), beam_idx, _i64(0))
    both = ops.concat([past, current], 2)
    return both, ops.assign(both, variable)


def _repeat_heads(x, size: Hyperparameters):
    """(batch, kv_heads, tokens, head_dim) → (batch, heads, tokens, head_dim): each key-value head serves heads/kv_heads
    query heads."""
    groups = size.heads // size.kv_heads
    if groups == 1:
        return x
    spread = ops.broadcast(ops.unsqueeze(x, _i64(2)), _i64([1, 1, groups, 1, 1]), broadcast_spec="BIDIRECTIONAL")
    return ops.reshape(spread, _i64([0, size.heads, -1, size.head_dim]), True)


def _attention_mask(input_ids, attention_mask):
    """(batch, 1, tokens, past + tokens) f32: 0 where a token may attend (causal, and kept by attention_mask), MASKED
    elsewhere. The new tokens are the last of attention_mask's positions."""
    total = ops.gather(ops.shape_of(attention_mask), _i64(1), _i64(0))
    tokens = ops.gather(ops.shape_of(input_ids), _i64(1), _i64(0))
    queries = ops.unsqueeze(ops.range(ops.subtract(total, tokens), total, _i64(1), ov.Type.i64), _i64(1))  # (tokens, 1)
    keys = ops.range(_i64(0), total, _i64(1), ov.Type.i64)  # (past + tokens,)
    causal = ops.less_equal(keys, queries)  # (tokens, past + tokens)
    kept = ops.unsqueeze(ops.convert(attention_mask, ov.Type.boolean), _i64([1, 2]))  # (batch, 1, 1, past + tokens)
    allowed = ops.logical_and(causal, kept)
    return ops.select(allowed, ops.constant(np.array(0.0, dtype=np.float32)),
                      ops.constant(np.array(MASKED, dtype=np.float32)))


def _parameter(name: str, shape: list[int], element: ov.Type):
    node = ops.parameter(shape, element, name=name)
    node.output(0).get_tensor().set_names({name})
    return node


def _named(node, name: str):
    node.set_friendly_name(name)
    return node


def _i64(value) -> ov.Node:
    return ops.constant(np.array(value, dtype=np.int64))
