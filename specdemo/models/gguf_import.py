"""A GGUF file's weights as nodes of the graph built from it (specdemo/models/gguf_graph.py), laid out for the chosen
precision:

- BlockWeights (gguf-native; gguf-q4, the blocks in 4 bits: requantize.py): each MatMul a BlockMatMul over the file's
  bytes (specdemo/models/kernels.py), the embedding's Gather on the exact layout below.
- BlockWeights (precisions gguf, gguf-mixed): the file's own blocks (specdemo/models/gguf_weights.py) as the
  pattern the CPU plugin fuses into its compressed FullyConnected (or Gather): a signed low-bit Constant, Convert,
  Multiply by an f16 scale per group, Reshape, Convert to f32; exact Q4_K's offset added after the MatMul as a group
  sum of the activations. A tensor of a type gguf_weights does not unpack goes in as f16, dequantized.
- DequantizedWeights (fp16, int8, int4): gguf's own dequantization of each tensor, as f16 or compressed by NNCF the way
  export.compress_weights compresses an exported model: tensor by tensor, since NNCF's int8 (per channel) and int4
  (groups of 128, every layer) need no data and no other tensor, in batches of BATCH_BYTES of f32 (a larger tensor in
  parts of rows, joined after) so that a 1.5B model is never held in f32 at once (6.2 GB; one NNCF call costs 0.25 s
  before any weight, so not one call a tensor). The weights are bit for bit those NNCF made of the torch export (every
  one of the target's 198, int8 and int4), and the same whether a tensor went in whole or in parts.

Every weight is checked before it goes in: a sample of its rows, as the graph reads them, against gguf-py's own
dequantization of the rows of the file they come from. For a Llama file the graph reads attn_q / attn_k in
transformers' order, which llama.cpp permuted when it wrote the file; the check finds the file's rows through that
permutation as llama.cpp's converter writes it, apart from the code that restores the order (gguf_weights.hf_row_order),
so a row put in the wrong place fails the conversion instead of compiling into a model that is silently wrong.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.models import kernels, requantize
from specdemo.models.block_matmul import block_matmul
from specdemo.models.gguf_file import GGUFFile
from specdemo.models.gguf_weights import SUPPORTED, Blocks, hf_row_order, lay_out, unpack, weight_node

PERMUTED = ("llama",)  # architectures whose attn_q / attn_k rows llama.cpp permutes (and transformers restores)
CHECKED_ROWS = 24  # rows of each tensor compared with gguf's dequantization: a misplaced row differs by the weights' size
TOLERANCE = 2.0 ** -8  # of the sampled rows' largest weight: f16 rounding of scales and offsets (ours), not a misplaced row
ROWS_BYTES = 16 << 20  # f32 output of one dequantization call (its temporaries: ~9 times that for Q5_0)
BATCH_BYTES = 1 << 28  # f32 weights handed to NNCF in one call (a larger tensor in parts of rows): NNCF's temporaries
#                       are ~1.3 times a call's weights, so this bounds the conversion's peak beside the weights made
PART_ROWS = 64  # a part's rows are a multiple of this
BLOCK_MATMUL_LAYOUTS = ("native", "native-q4")  # every MatMul a BlockMatMul (GGUF_LAYOUTS: gguf-native, gguf-q4)


class GGUFMismatchError(ValueError):
    """A weight as the graph would read it is not the file's (a row in another order, a wrong unpacking)."""


class _FileWeights:
    """What both layouts share: the file, its q/k row order, the check, the norms and biases."""

    def __init__(self, file: GGUFFile):
        self.file = file
        self.heads = _head_counts(file)

    def vector(self, name: str) -> np.ndarray | None:
        """A norm's weight or a bias, f32, in the graph's row order; None when the file has no such tensor."""
        tensor = self.file.tensors.get(name)
        if tensor is None:
            return None
        values = np.asarray(tensor.data, dtype=np.float32) if not tensor.quantized else dequantized(tensor.data, tensor.kind)
        order = self._order(name, len(values))
        return values[order] if order is not None else values.copy()

    def values(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """(rows, columns) f32: gguf's dequantization of tensor `name`, or of its graph rows `rows` alone, in the
        graph's row order, checked."""
        tensor = self.file.tensors[name]
        order = self._order(name, tensor.shape[0])
        graph_rows = np.arange(tensor.shape[0])[rows]
        values = dequantized(tensor.data[rows] if order is None else tensor.data[order[graph_rows]], tensor.kind)
        sample = _sample(len(values))
        self.check(name, values[sample], graph_rows[sample])
        return values

    def _order(self, name: str, rows: int) -> np.ndarray | None:
        """The file's rows in the graph's order for a Llama file's attn_q / attn_k (weights and biases), else None."""
        for kind in ("q", "k"):
            if self.heads and f".attn_{kind}." in name:
                return hf_row_order(rows, self.heads[kind])
        return None

    def check(self, name: str, ours: np.ndarray, rows: np.ndarray) -> None:
        """Raise GGUFMismatchError unless `ours`, the graph's rows `rows` of tensor `name` (f32), are gguf's
        dequantization of the rows of the file they come from."""
        tensor = self.file.tensors[name]
        source = _file_rows(name, tensor.shape[0], self.heads)[rows]
        theirs = dequantized(tensor.data[source], tensor.kind)
        if np.abs(ours - theirs).max() > TOLERANCE * max(float(np.abs(theirs).max()), 1e-30):
            raise GGUFMismatchError(f"{self.file.path.name}: {name} as laid out does not match gguf's dequantization of "
                                    "the file (rows in another order, or another unpacking); its weights cannot be "
                                    "taken as they are")


class BlockWeights(_FileWeights):
    """The file's own blocks laid out as `layout` (gguf_weights.LAYOUTS) says."""

    def __init__(self, file: GGUFFile, layout: str):
        super().__init__(file)
        self.layout = layout
        self.sums = {}  # activations' group sums, shared by the MatMuls reading the same input (q, k, v; gate, up)

    def linear(self, x: ov.Output, name: str, node_name: str) -> ov.Output:
        """x · Wᵀ for tensor `name` (rows, columns): the MatMul named `node_name` [+ x's group sums · offsetᵀ]; in
        the native layout the BlockMatMul of its raw blocks."""
        x = _output(x)
        if self.layout in BLOCK_MATMUL_LAYOUTS and self.file.tensors[name].kind in kernels.KINDS:
            return block_matmul(x, *self._raw(name), node_name).output(0)
        blocks = self._blocks(name)
        if blocks is None:
            return _matmul(x, _f16_weight(self.values(name)), node_name)
        matmul = _matmul(x, weight_node(blocks), node_name)
        if blocks.offset is None:
            return matmul
        rows, groups, size = blocks.q.shape
        key = (x.get_node().get_friendly_name(), x.get_index(), groups)
        if key not in self.sums:  # (…, columns) → (…, groups, size) → summed over each group: (…, groups)
            grouped = ops.reshape(x, ops.constant(np.array([0, 0, groups, size], dtype=np.int64)), True)
            self.sums[key] = ops.reduce_sum(grouped, ops.constant(np.array([-1], dtype=np.int64)), False)
        offset = ops.convert(ops.constant(blocks.offset), ov.Type.f32)  # (rows, groups)
        return ops.add(matmul, ops.matmul(self.sums[key], offset, False, True)).output(0)

    def embedding(self, ids: ov.Output, name: str, node_name: str) -> ov.Output:
        """Rows `ids` of tensor `name`: the Gather named `node_name` [+ the offsets of those rows spread over each group]."""
        blocks = self._blocks(name)
        weight = weight_node(blocks) if blocks is not None else _f16_weight(self.values(name))
        gather = _named(ops.gather(weight, ids, ops.constant(np.array(0, dtype=np.int32))), node_name)
        if blocks is None or blocks.offset is None:
            return gather.output(0)
        rows, groups, size = blocks.q.shape
        offsets = ops.gather(ops.convert(ops.constant(blocks.offset), ov.Type.f32), ids, ops.constant(np.array(0)))
        grouped = ops.reshape(gather, ops.constant(np.array([0, 0, groups, size], dtype=np.int64)), True)
        spread = ops.add(grouped, ops.unsqueeze(offsets, ops.constant(np.array([-1], dtype=np.int64))))
        return ops.reshape(spread, ops.constant(np.array([0, 0, groups * size], dtype=np.int64)), True).output(0)

    def _raw(self, name: str) -> tuple[np.ndarray, str]:
        """(rows, bytes per row) u8 and their type: the file's blocks of `name` in the graph's row order (in 4 bits in
        the native-q4 layout); rows put in another order than the file's checked on a sample (rows in the file's order
        are its own bytes: a check would compare them with themselves, 1 s of a first start's target)."""
        tensor = self.file.tensors[name]
        raw = np.asarray(tensor.data)
        order = self._order(name, raw.shape[0])
        if order is not None:
            raw = raw[order]
            sample = _sample(raw.shape[0])
            self.check(name, dequantized(raw[sample], tensor.kind), sample)
        return requantize.to_4_bits(raw, tensor.kind) if self.layout == "native-q4" else (raw, tensor.kind)

    def _blocks(self, name: str) -> Blocks | None:
        """The exact blocks of `name` in the graph's row order, checked, then laid out; None for a type not unpacked."""
        tensor = self.file.tensors[name]
        if tensor.kind not in SUPPORTED:
            return None
        blocks = unpack(tensor.kind, np.asarray(tensor.data))
        order = self._order(name, blocks.q.shape[0])
        if order is not None:
            blocks = blocks.take_rows(order)
        sample = _sample(blocks.q.shape[0])
        self.check(name, blocks.take_rows(sample).dequantize(), sample)
        return lay_out(blocks, tensor.kind, name, "exact" if self.layout in BLOCK_MATMUL_LAYOUTS else self.layout)


class DequantizedWeights(_FileWeights):
    """gguf's dequantization of each tensor: f16 (`compress` None), or compressed by `compress` (an NNCF call on an
    ov.Model, export.compress_weights) in batches made before the graph asks for them."""

    def __init__(self, file: GGUFFile, matrices: list[tuple[str, str]], compress=None):
        """matrices: (tensor, "MatMul" or "Gather"), each weight the graph reads and how (gguf_graph.matrices)."""
        super().__init__(file)
        self.ready = {} if compress is None else self._compressed(matrices, compress)

    def linear(self, x: ov.Output, name: str, node_name: str) -> ov.Output:
        return _matmul(x, self._weight(name), node_name)

    def embedding(self, ids: ov.Output, name: str, node_name: str) -> ov.Output:
        return _named(ops.gather(self._weight(name), ids, ops.constant(np.array(0, dtype=np.int32))), node_name).output(0)

    def _weight(self, name: str) -> ov.Output:
        if name not in self.ready:  # f16; one constant for a tied embedding's two readers, as the export shares it
            self.ready[name] = _f16_weight(self.values(name)).output(0)
        return self.ready[name]

    def _compressed(self, matrices: list[tuple[str, str]], compress) -> dict[str, ov.Output]:
        """{tensor: its compressed weight's decompression subgraph}, NNCF called once per BATCH_BYTES of f32 weights;
        a larger tensor (an embedding, the LM head) compressed in parts of rows, joined after."""
        ready, batch, size, split = {}, [], 0, {}
        for name, op in dict(matrices).items():  # a tied embedding is compressed once, as NNCF compresses a shared constant
            for part in _parts(name, self.file.tensors[name].shape):
                if batch and size + part.nbytes > BATCH_BYTES:
                    ready.update(_compress_batch(self, batch, compress))
                    batch, size = [], 0
                batch.append((part, op))
                size += part.nbytes
                if part.key != name:
                    split.setdefault(name, []).append(part.key)
        if batch:
            ready.update(_compress_batch(self, batch, compress))
        for name, keys in split.items():
            ready[name] = _joined([ready.pop(key) for key in keys])
        return ready


class _Part(NamedTuple):
    """Rows `rows` of tensor `name`, compressed under the name `key`; `nbytes` of f32."""

    name: str
    key: str
    rows: slice
    nbytes: int


def _parts(name: str, shape: tuple[int, ...]) -> list[_Part]:
    """Tensor `name` of (rows, columns) `shape` as parts of at most BATCH_BYTES of f32 (the whole tensor when it fits).
    Rows are compressed independently (int8: a scale a row; int4: groups along a row), so the parts' weights are the
    whole's; PART_ROWS keeps every part's count of 4-bit values even, two a byte when they are joined."""
    rows, columns = shape[0], int(np.prod(shape[1:]))
    if 4 * rows * columns <= BATCH_BYTES:
        return [_Part(name, name, slice(None), 4 * rows * columns)]
    step = max(PART_ROWS, BATCH_BYTES // (4 * columns) // PART_ROWS * PART_ROWS)
    return [_Part(name, f"{name}#{begin}", slice(begin, min(begin + step, rows)), 4 * columns * (min(begin + step, rows) - begin))
            for begin in range(0, rows, step)]


def _compress_batch(weights: DequantizedWeights, batch: list[tuple[_Part, str]], compress) -> dict[str, ov.Output]:
    """One ov.Model holding a MatMul (or the embedding's Gather) on each part of `batch` in f32, compressed by
    `compress`; what each part's weight became, taken out of it, by its key."""
    parameters, results = [], []
    for part, op in batch:
        values = weights.values(part.name, part.rows)
        weight = ops.constant(values, shared_memory=True)  # NNCF reads it in place: no second f32 copy
        if op == "Gather":
            ids = ops.parameter([1, -1], ov.Type.i32)
            node = ops.gather(weight, ids, ops.constant(np.array(0, dtype=np.int32)))
        else:
            ids = ops.parameter([1, -1, values.shape[1]], ov.Type.f32)
            node = ops.matmul(ids, weight, False, True)
        node.set_friendly_name(part.key)
        parameters.append(ids)
        results.append(ops.result(node))
    del values, weight, node
    compressed = compress(ov.Model(results, parameters))
    keys = {part.key for part, _ in batch}
    ready = {}
    for node in compressed.get_ordered_ops():
        if node.get_friendly_name() in keys:
            ready[node.get_friendly_name()] = node.input_value(0 if node.get_type_name() == "Gather" else 1)
    _return_freed_memory()
    return ready


def _joined(parts: list[ov.Output]) -> ov.Output:
    """One decompression subgraph from the same subgraph of consecutive row parts (NNCF's Constant, Convert, Subtract,
    Multiply, Reshape): each weight, zero point and scale Constant joined along its rows, a Reshape's target given the
    whole's rows."""
    node = parts[0].get_node()
    kind = node.get_type_name()
    inputs = [[part.get_node().input_value(i) for part in parts] for i in range(node.get_input_size())]
    if kind == "Constant":
        return _joined_constant([part.get_node() for part in parts]).output(0)
    if kind == "Convert":
        return ops.convert(_joined(inputs[0]), node.get_output_element_type(0)).output(0)
    if kind in ("Subtract", "Multiply"):
        return getattr(ops, kind.lower())(_joined(inputs[0]), _joined(inputs[1])).output(0)
    if kind == "Reshape":
        target = inputs[1][0].get_node().data.copy()
        target[0] = sum(int(part.get_shape()[0]) for part in parts)
        return ops.reshape(_joined(inputs[0]), ops.constant(target), False).output(0)
    raise ValueError(f"cannot join the parts of a compressed weight at a {kind} node")


def _joined_constant(parts: list) -> ov.Node:
    """The Constants `parts` (each (rows, …) of one element type) as one, stacked along the rows; 4-bit values are
    joined packed, each part holding an even count of them."""
    element = parts[0].get_output_element_type(0)
    shape = list(parts[0].get_output_shape(0))
    shape[0] = sum(int(part.get_output_shape(0)[0]) for part in parts)
    tensor = ov.Tensor(element, ov.Shape(shape))
    tensor.data.reshape(-1)[:] = np.concatenate([part.get_tensor_view().data.reshape(-1) for part in parts])
    return ov.op.Constant(tensor)


def _return_freed_memory() -> None:
    """Hand the heap NNCF's temporaries freed back to the system (glibc keeps it otherwise, counted in the process's
    anonymous memory); nothing elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def dequantized(data: np.ndarray, kind: str) -> np.ndarray:
    """gguf's dequantization of a tensor's raw rows (as gguf-py maps them) as f32, ROWS_BYTES of output a call."""
    from gguf import GGMLQuantizationType, dequantize

    kind = GGMLQuantizationType[kind]
    if data.ndim < 2:
        return np.asarray(dequantize(data, kind), dtype=np.float32)
    first = np.asarray(dequantize(data[:1], kind), dtype=np.float32)
    values = np.empty((len(data), *first.shape[1:]), dtype=np.float32)
    step = max(1, ROWS_BYTES // first.nbytes)
    for begin in range(0, len(values), step):
        values[begin:begin + step] = dequantize(data[begin:begin + step], kind)
    return values


def _file_rows(name: str, rows: int, heads: dict[str, int]) -> np.ndarray:
    """For each row the graph reads of tensor `name`, the row of the file holding it. llama.cpp's converter writes a
    Llama attn_q / attn_k as w.reshape(heads, 2, rows/heads/2, …).swapaxes(1, 2): file row f holds row written[f]."""
    kind = next((k for k in ("q", "k") if heads and f".attn_{k}." in name), None)
    if kind is None:
        return np.arange(rows)
    written = np.arange(rows).reshape(heads[kind], 2, -1).swapaxes(1, 2).reshape(-1)
    return np.argsort(written)


def _head_counts(file: GGUFFile) -> dict[str, int]:
    """{"q": heads, "k": key-value heads} for an architecture whose q/k rows llama.cpp permutes, else {}."""
    if file.architecture not in PERMUTED:
        return {}
    heads = file.field("attention.head_count")
    if heads is None:
        raise ValueError(f"{file.architecture} GGUF without {file.architecture}.attention.head_count: its q/k rows "
                         "cannot be restored")
    return {"q": int(heads), "k": int(file.field("attention.head_count_kv", heads))}


def _sample(rows: int) -> np.ndarray:
    return np.unique(np.linspace(0, rows - 1, min(rows, CHECKED_ROWS)).astype(np.int64))


def _matmul(x: ov.Output, weight, node_name: str) -> ov.Output:
    return _named(ops.matmul(x, weight, False, True), node_name).output(0)


def _f16_weight(values: np.ndarray):
    """(rows, columns) f32 values stored as f16, converted back: what the IR of an fp16 export holds."""
    return ops.convert(ops.constant(values.astype(np.float16)), ov.Type.f32)


def _output(value) -> ov.Output:
    """A node's first output, or the output itself: the graph hands either."""
    return value.output(0) if isinstance(value, ov.Node) else value


def _named(node, name: str):
    node.set_friendly_name(name)
    return node
