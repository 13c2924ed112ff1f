"""The plugin's nodes around each BlockMatMul taken into it, where a gguf-native model loads (runtime.py, after
graph.fuse_glu): a constant bias added after it (its epilogue "bias"), a residual added after it ("residual"), and the
RMS norm before it (its prologue "rms"). kernels/src/block_matmul.hpp says what the op then computes.

Why: a node of the plugin's costs its run and the hand-offs around it. On the 2-core Zen 4 (EPYC family 25 model 17),
the models fused and not in one process, calls alternating, a step of the 0.5B draft lost 133 of its 272 nodes and
took 0.46 ms less (12.45 against 12.91 ms: 0.33 ms less between our ops, the same inside them; the biases and
residuals alone 0.31 ms, the norms alone 0.12 ms); the 1.5B target's 1- and 6-token calls took 0.26 and 0.35 ms less.
The bias and the residual are the same f32 sums as the Adds (the logits the same bits); the norm is computed as the
graph's decomposition is (gguf_graph._rms_norm), its sum of squares in double, within a bit of the plugin's RMS (whose
order of sums differs): the 8-bit activations may then round a value the other way (fidelity unchanged: top-1 99.6 %,
mean |logit error| 0.058 on that Zen 4).
"""

from __future__ import annotations

import numpy as np

from specdemo.models.graph import BLOCK_MATMUL, through_converts


def fuse_into_matmuls(model) -> int:
    """Bias Adds, residual Adds and RMS norms taken into the BlockMatMuls of `model` (a graph read by a Core with the
    extension: its ops are the C++ op, whose inputs and attributes can be changed here). Returns how many were taken
    (0: nothing to take, the model unchanged)."""
    taken = 0
    for op in _block_matmuls(model):
        taken += _take_addend(op)
    for op in _block_matmuls(model):
        taken += _take_norm(op)
    if taken:
        model.validate_nodes_and_infer_types()
    return taken


def _block_matmuls(model) -> list:
    return [op for op in model.get_ordered_ops() if op.get_type_name() == BLOCK_MATMUL]


def _take_addend(op) -> int:
    """The Add that alone reads `op` and adds a constant f32 vector of its rows (a bias) or a tensor of its own shape
    (a residual), as the op's epilogue. 1 if taken."""
    readers = list(op.output(0).get_target_inputs())
    if op.get_attributes().get("epilogue") or len(readers) != 1 or readers[0].get_node().get_type_name() != "Add":
        return 0
    add = readers[0].get_node()
    other = add.input_value(1 - readers[0].get_index())
    rows = op.get_output_partial_shape(0)[-1]
    if through_converts(other.get_node()).get_type_name() == "Constant":
        if other.get_element_type().get_type_name() != "f32" or rows.is_dynamic or \
                int(np.prod(other.get_shape())) != rows.get_length():
            return 0
        epilogue = "bias"
    elif other.get_element_type().get_type_name() == "f32" and \
            other.get_partial_shape() == op.get_output_partial_shape(0) == add.get_output_partial_shape(0):
        epilogue = "residual"
    else:
        return 0
    _remake(op, [*op.input_values(), other], epilogue=epilogue)
    for reader in list(add.output(0).get_target_inputs()):
        reader.replace_source_output(op.output(0))
    return 1


def _take_norm(op) -> int:
    """The RMS norm `op` reads (gguf_graph._rms_norm's decomposition), as its prologue: op then reads the norm's input.
    The norm stays where something else reads it too. 1 if taken."""
    if op.get_attributes().get("prologue"):
        return 0
    norm = _rms_norm(op.input_value(0).get_node())
    if norm is None:
        return 0
    x, weights, eps = norm
    values = op.input_values()
    _remake(op, [x, values[1], weights, *values[2:]], prologue="rms", eps=eps)
    return 1


def _remake(op, inputs: list, **attributes) -> None:
    """`op` given `inputs` and `attributes` (block_matmul.hpp: the inputs its prologue and epilogue read)."""
    op.set_arguments(inputs)
    for name, value in attributes.items():
        op.set_attribute(name, value)
    op.validate_and_infer_types()


def _rms_norm(node):
    """(x, g, eps) when `node` is g · (x · 1 / sqrt(mean(x²) + eps)), g a constant f32 vector and the mean over the last
    axis, in either operand order; else None."""
    pair = _operands(node, "Multiply")
    if pair is None:
        return None
    g, normed = _constant_and_other(*pair)
    scaled = _operands(normed.get_node(), "Multiply") if g is not None else None
    if scaled is None or g.get_element_type().get_type_name() != "f32":
        return None
    for x, inverse in (scaled, scaled[::-1]):
        eps = _inverse_root_mean_square_eps(inverse.get_node(), x)
        if eps is not None:
            return x, g, eps
    return None


def _inverse_root_mean_square_eps(node, x) -> float | None:
    """eps when `node` is 1 / sqrt(ReduceMean(x^2, last axis, keep dims) + eps), else None."""
    divide = _operands(node, "Divide")
    if divide is None or not _is_constant(divide[0], 1.0):
        return None
    root = divide[1].get_node()
    if root.get_type_name() != "Sqrt":
        return None
    plus = _operands(root.input_value(0).get_node(), "Add")
    if plus is None:
        return None
    eps, mean = _constant_and_other(*plus)
    if eps is None or eps.get_shape() and int(np.prod(eps.get_shape())) != 1:
        return None
    mean = mean.get_node()
    if mean.get_type_name() != "ReduceMean" or not mean.get_attributes().get("keep_dims"):
        return None
    axes = mean.input_value(1).get_node()
    rank = x.get_partial_shape().rank
    if axes.get_type_name() != "Constant" or rank.is_dynamic or \
            [int(a) % rank.get_length() for a in axes.get_data().reshape(-1)] != [rank.get_length() - 1]:
        return None
    power = _operands(mean.input_value(0).get_node(), "Power")
    if power is None or power[0] != x or not _is_constant(power[1], 2.0):
        return None
    return float(through_converts(eps.get_node()).get_data().reshape(-1)[0])


def _operands(node, kind: str):
    """A two-input node's inputs when it is of `kind`, else None."""
    if node.get_type_name() != kind or node.get_input_size() != 2:
        return None
    return node.input_value(0), node.input_value(1)


def _constant_and_other(a, b):
    """(the constant one, the other) of two outputs, or (None, None) when neither or both are constants (a Constant,
    or one converted: an IR saved with its f32 values in f16)."""
    constant = [through_converts(o.get_node()).get_type_name() == "Constant" for o in (a, b)]
    if constant == [True, False]:
        return a, b
    if constant == [False, True]:
        return b, a
    return None, None


def _is_constant(output, value: float) -> bool:
    node = through_converts(output.get_node())
    return node.get_type_name() == "Constant" and bool(np.all(node.get_data() == value))
