"""Fold a constant per-channel scale or shift that follows a Conv or ConvTranspose into its weights
and bias, as BatchNormalization is folded: Mul, Add, Sub or Div by a constant that broadcasts along
the output channels only (a scalar, [K, 1, 1], [1, K, 1, 1]). One that a Conv without padding
alone reads folds into that conv too (conv(s * x + t) = conv_{W s}(x) + sum(W t)); with padding it
would not, since the padded border is zeros, not t. Exporters write such affines as nodes
of their own (PP-LCNet's learnable affine blocks: Mul(scale, conv) then Add(shift)); left in place
they sit between the conv and its activation, which then cannot fuse, and cost a pass over the
tensor each. ONNX Runtime folds a Mul only where the constant is its second input and shaped
[K, 1, 1] or a scalar (ConvMulFusion), and an Add likewise (ConvAddFusion)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..activations import match_activation
from ..graph import constant_value, itemsize, make_constant, numel_per_image, producer, set_inputs, set_outputs
from ..report import Report
from .fold_batchnorm import fold_into_conv

AFFINE_OPS = ("Mul", "Add", "Sub", "Div")


def _per_channel(value: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """`value` as one float64 per output channel, or None where it would broadcast along any other
    axis of a rank-`rank` output (or widen it)."""
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape  # right-aligned, as ONNX broadcasts
    if any(d != 1 for axis, d in enumerate(shape) if axis != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))


def _scale_shift(node: gs.Node, y: gs.Tensor, rank: int, channels: int, dtype) -> tuple | None:
    """(scale, shift) with node(y) == y * scale + shift per channel, or None."""
    if node.op not in AFFINE_OPS or len(node.inputs) != 2:
        return None
    y_first = node.inputs[0] is y
    other = node.inputs[1] if y_first else node.inputs[0]
    if other is y:
        return None  # y * y, y + y
    value = constant_value(other)
    if value is None or value.dtype != dtype:
        return None
    c = _per_channel(value, rank, channels)
    if c is None:
        return None
    ones, zeros = np.ones(channels), np.zeros(channels)
    if node.op == "Mul":
        return c, zeros
    if node.op == "Add":
        return ones, c
    if node.op == "Sub":
        return (ones, -c) if y_first else (-ones, c)
    if not y_first or not np.all(c != 0) or not np.all(np.isfinite(c)):
        return None  # c / y is no affine of y; y / 0 is ±inf or NaN, which no weight gives
    return 1.0 / c, zeros


def _fits(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray, shift: np.ndarray) -> bool:
    """The folded weights and bias stay finite in their dtype (a large scale on fp16 weights would not)."""
    limit = float(np.finfo(w.dtype).max)
    b_max = float(np.max(np.abs(b.astype(np.float64)))) if b is not None and b.size else 0.0
    s_max, t_max = float(np.max(np.abs(scale))), float(np.max(np.abs(shift)))
    return float(np.max(np.abs(w.astype(np.float64)))) * s_max < limit and b_max * s_max + t_max < limit


def _try_fold(graph: gs.Graph, conv: gs.Node) -> gs.Node | None:
    """Folds the affine node that alone reads `conv`'s output; returns it, or None."""
    y = conv.outputs[0]
    if len(y.outputs) != 1 or y in graph.outputs:
        return None
    w = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or w.dtype.kind != "f" or w.ndim < 3:
        return None
    group = int(conv.attrs.get("group", 1))
    channels = w.shape[0] if conv.op == "Conv" else w.shape[1] * group
    found = _scale_shift(y.outputs[0], y, w.ndim, channels, w.dtype)
    if found is None:
        return None
    has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
    b = constant_value(conv.inputs[2]) if has_bias else None
    if (has_bias and b is None) or not _fits(w, b, *found):
        return None
    affine = y.outputs[0]
    if not fold_into_conv(graph, conv, *found, tag="affinefold"):
        return None
    out = affine.outputs[0]
    affine.outputs.clear()
    set_outputs(conv, [out])
    return affine


def _unpadded(conv: gs.Node) -> bool:
    pads = conv.attrs.get("pads")
    return conv.attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") and not (pads is not None and any(pads))


def _in_an_activation(node: gs.Node, depth: int = 5) -> bool:
    """`node` belongs to an activation written as several nodes (HardSwish's final Div by 6, say) of a
    tensor a few nodes above: folded away, the activation would no longer match, nor fuse."""
    frontier, seen = [node], set()
    for _ in range(depth):
        roots = [t for n in frontier for t in n.inputs if constant_value(t) is None and id(t) not in seen]
        seen.update(id(t) for t in roots)
        if any((m := match_activation(t)) is not None and any(n is node for n in m.nodes) for t in roots):
            return True
        frontier = [p for t in roots if (p := producer(t)) is not None]
    return False


def _try_fold_input(graph: gs.Graph, conv: gs.Node) -> gs.Node | None:
    """Folds the affine node whose output only `conv` (a Conv without padding) reads; returns it, or None."""
    x = conv.inputs[0]
    affine = producer(x)
    if affine is None or len(x.outputs) != 1 or x in graph.outputs or len(affine.outputs) != 1:
        return None
    w = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or w.dtype.kind != "f" or w.ndim < 3 or not _unpadded(conv):
        return None
    group = int(conv.attrs.get("group", 1))
    source = next((t for t in affine.inputs if constant_value(t) is None), None)
    if source is None or _in_an_activation(affine):
        return None
    found = _scale_shift(affine, source, w.ndim, w.shape[1] * group, w.dtype)
    has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
    b = constant_value(conv.inputs[2]) if has_bias else None
    if found is None or (has_bias and b is None):
        return None
    scale, shift = found
    # input channel of w[k, c] is (k // (K / group)) * (C / group) + c
    k, c_per_group = w.shape[0], w.shape[1]
    channel = (np.arange(k)[:, None] // (k // group)) * c_per_group + np.arange(c_per_group)[None, :]
    factor = scale[channel].reshape((k, c_per_group) + (1,) * (w.ndim - 2))
    w64 = w.astype(np.float64)
    b_new = (b.astype(np.float64) if b is not None else np.zeros(k)) + \
        (w64 * shift[channel].reshape(factor.shape)).reshape(k, -1).sum(axis=1)
    limit = float(np.finfo(w.dtype).max)
    if float(np.max(np.abs(w64 * factor))) >= limit or float(np.max(np.abs(b_new))) >= limit:
        return None
    set_inputs(conv, [source, make_constant(graph, f"{conv.name}_W_affinefold", (w64 * factor).astype(w.dtype)),
                      make_constant(graph, f"{conv.name}_B_affinefold", b_new.astype(w.dtype))])
    affine.inputs.clear()  # unlinked now, so that an affine before it sees the conv as its only reader
    return affine


def fold_affine(graph: gs.Graph, report: Report) -> gs.Graph:
    for conv in [n for n in graph.nodes if n.op in ("Conv", "ConvTranspose")]:
        for fold, side in ((_try_fold, 0), (_try_fold_input, 1)):
            if side and conv.op != "Conv":
                continue
            while True:  # Mul then Add: both fold
                t = conv.inputs[0] if side else conv.outputs[0]
                affine = fold(graph, conv)
                if affine is None:
                    break
                report.affine_folded[affine.op] += 1
                report.activation_bytes_saved += 2 * (numel_per_image(t) or 0) * itemsize(t)
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
