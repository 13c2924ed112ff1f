"""The BlockMatMul op as graphs are built with it (specdemo/models/kernels.py says what it computes): a stand-in of the
extension's op, the same type, version and attributes, that only infers shapes. It never runs: the IR saved from a graph
holding it is read back by a Core with the extension added (kernels.new_core), which makes the C++ op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from specdemo.models.blocks import KINDS, TYPE


class BlockMatMul(ov.Op):
    """The stand-in graphs are built with: BlockMatMul's inputs, attributes and output shape, saved to the IR as the
    extension's op. It has no evaluate: compile only what a Core with the extension read back."""

    class_type_info = ov.DiscreteTypeInfo(TYPE, "specdemo")

    def __init__(self, inputs=None, kind: str = "Q4_K", columns: int = 0):
        super().__init__(self, inputs)
        self._kind, self._columns = kind, columns

    def validate_and_infer_types(self):
        x = self.get_input_partial_shape(0)
        rows = self.get_input_partial_shape(1)[0]
        self.set_output_type(0, ov.Type.f32, ov.PartialShape([x[i] for i in range(x.rank.get_length() - 1)] + [rows]))

    def clone_with_new_inputs(self, new_inputs):
        return BlockMatMul(new_inputs, self._kind, self._columns)

    def visit_attributes(self, visitor):
        visitor.on_attributes({"kind": self._kind, "columns": self._columns})
        return True

    def get_type_info(self):
        return BlockMatMul.class_type_info


def block_matmul(x: ov.Output, raw: np.ndarray, kind: str, name: str = "") -> ov.Node:
    """x · Wᵀ over `raw` (rows, bytes per row) u8, one tensor's blocks of type `kind` as the file holds them."""
    if kind not in KINDS:
        raise ValueError(f"BlockMatMul reads {', '.join(KINDS)} blocks, not {kind}")
    values, size = KINDS[kind]
    columns = raw.shape[1] // size * values
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    weights = ov.op.Constant(raw, shared_memory=raw.flags.writeable)  # a GGUFFile's own pages: shared, not copied
    node = BlockMatMul([x, weights.output(0)], kind=kind, columns=columns)
    if name:
        node.set_friendly_name(name)
    return node


def compiled(blocks: dict[str, np.ndarray], core: ov.Core, folder: Path) -> ov.CompiledModel:
    """x (M, columns) f32 → an output BlockMatMul(x, raw) (M, rows) f32 for each `kind: raw` of `blocks` (each raw
    (rows, bytes per row) u8, all of the same columns), compiled on the CPU plugin through an IR written to `folder`
    and read back by `core`, which must have the extension added (the stand-in never runs)."""
    kind, raw = next(iter(blocks.items()))
    x = ops.parameter([-1, raw.shape[1] // KINDS[kind][1] * KINDS[kind][0]], ov.Type.f32)
    outputs = [ops.result(block_matmul(x.output(0), raw, kind)) for kind, raw in blocks.items()]
    ov.save_model(ov.Model(outputs, [x]), Path(folder) / "op.xml")
    return core.compile_model(core.read_model(Path(folder) / "op.xml"), "CPU", {"INFERENCE_NUM_THREADS": 2})
