"""Fold BatchNormalization (inference mode, constant statistics) into the op that produces its
input: Conv and ConvTranspose (groups included; ConvTranspose's output channels are weight axis 1
within each group), Gemm/MatMul with constant weights, and the Convs a channel Concat joins (a slice
of the BN's channels into each). The fold is computed in float64 and
rounded once to the weights' dtype (fp16 models lose no more than one rounding). A BN with no
foldable producer becomes a per-channel Mul+Add, which the layout pass can move like any
elementwise op. Shared weights are never edited in place: each fold writes new initializers."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import (constant_value, itemsize, make_constant, make_variable, numel_per_image, producer, set_inputs,
                     set_outputs, shape_of)
from ..report import Report


def _bn_scale_shift(bn: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    values = [constant_value(t) for t in bn.inputs[1:5]]
    if len(values) != 4 or any(v is None for v in values):
        return None
    gamma, beta, mean, var = (v.astype(np.float64).reshape(-1) for v in values)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/Inf/negative variance: as ORT's BN
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        return scale, beta - mean * scale


def _why_not_foldable(bn: gs.Node) -> str | None:
    if bn.attrs.get("training_mode", 0):
        return "BatchNormalization in training mode"
    if any(o.outputs for o in bn.outputs[1:]):
        return "running statistics outputs are used"
    found = _bn_scale_shift(bn)
    if found is None:
        return "statistics are not constants"
    scale, _ = found
    bad = np.flatnonzero(~np.isfinite(scale))
    if bad.size:  # variance + epsilon <= 0: BN gives ±inf (or NaN) per element, a fold NaN for the channel
        return f"variance + epsilon is zero or negative in channel {int(bad[0])} (scale {scale[bad[0]]})"
    return None


def _scaled(const: gs.Tensor, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """w * factor computed in float64 and rounded once to w's dtype. A weight that only this node
    reads is scaled in place, so folding never holds two copies of a large model's weights."""
    if isinstance(const, gs.Constant) and len(const.outputs) == 1 and w.dtype.kind == "f" and w.flags.writeable:
        np.multiply(w, factor, out=w, casting="unsafe")
        return w
    # a weight other nodes still read: a new array, computed in float64 in numpy's buffered chunks (a
    # whole float64 temporary would be twice the weight again)
    out = np.empty_like(w)
    np.multiply(w, factor.astype(np.float64), out=out, casting="unsafe")
    return out


def fold_into_conv(graph, node, scale, shift, tag: str = "bnfold") -> bool:
    """y * scale + shift per output channel, folded into Conv / ConvTranspose `node`'s weights and bias.
    Every precondition is checked before a weight is touched (`_scaled` may scale in place)."""
    w = constant_value(node.inputs[1])
    if w is None:
        return False
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2].name)
    b = constant_value(node.inputs[2]) if has_bias else None
    if has_bias and b is None:
        return False  # a bias computed at run time (a graph input, say) cannot take the shift
    k = scale.size
    if node.op == "Conv":
        if w.shape[0] != k:
            return False
        factor = scale.reshape((k,) + (1,) * (w.ndim - 1))
    else:  # ConvTranspose: weight [C, K/group, kh, kw]; output channel g*K/group + j is w[g-th C block, j]
        group = int(node.attrs.get("group", 1))
        c, k_per_group = w.shape[0], w.shape[1]
        if k_per_group * group != k or c % group:
            return False
        w = w.reshape((group, c // group, k_per_group) + w.shape[2:])
        factor = scale.reshape((group, 1, k_per_group) + (1,) * (w.ndim - 3))
    w_new = _scaled(node.inputs[1], w, factor).reshape(constant_value(node.inputs[1]).shape)
    b_new = (b.astype(np.float64) if b is not None else 0.0) * scale + shift
    set_inputs(node, [node.inputs[0], make_constant(graph, f"{node.name}_W_{tag}", w_new),
                      make_constant(graph, f"{node.name}_B_{tag}", b_new.astype(w.dtype))])
    return True


def _fold_gemm(graph, node, scale, shift) -> bool:
    """Every precondition is checked before B is touched (`_scaled` may scale it in place)."""
    w = constant_value(node.inputs[1])
    if w is None or w.ndim != 2:
        return False
    trans_b = int(node.attrs.get("transB", 0))
    n_out = w.shape[0] if trans_b else w.shape[1]
    if n_out != scale.size:
        return False
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    has_c = len(node.inputs) > 2 and bool(node.inputs[2].name)
    c = constant_value(node.inputs[2]) if has_c else None
    if has_c and c is None:
        return False
    # C broadcasts to [M, N]: only a scalar or one value per output column ([N] or [1, N]) is a bias
    # per BN channel; [N, 1] is one value per row, whatever M is
    if c is not None and c.size != 1 and c.shape not in ((n_out,), (1, n_out)):
        return False
    w_new = _scaled(node.inputs[1], w, scale[:, None] if trans_b else scale[None, :])
    c_full = np.broadcast_to(c.astype(np.float64).reshape(-1) * beta, (n_out,)) if c is not None else np.zeros(n_out)
    c_new = c_full * scale + shift
    node.attrs["beta"] = 1.0
    node.attrs["alpha"] = alpha
    set_inputs(node, [node.inputs[0], make_constant(graph, f"{node.name}_B_bnfold", w_new),
                      make_constant(graph, f"{node.name}_C_bnfold", c_new.astype(w.dtype))])
    return True


def _fold_matmul(graph, node, bn, scale, shift) -> bool:
    """MatMul(A, W[in, out]) with a 2-D output: BN's channel axis 1 is the last axis."""
    w = constant_value(node.inputs[1])
    out_shape = shape_of(node.outputs[0])
    if w is None or w.ndim != 2 or w.shape[1] != scale.size or out_shape is None or len(out_shape) != 2:
        return False
    w_new = make_constant(graph, f"{node.name}_W_bnfold", _scaled(node.inputs[1], w, scale[None, :]))
    set_inputs(node, [node.inputs[0], w_new])
    y = node.outputs[0]
    bias = make_constant(graph, f"{node.name}_bias_bnfold", shift.astype(w.dtype))
    out = bn.outputs[0]
    bn.outputs.clear()
    graph.nodes.append(gs.Node("Add", name=f"{node.name}_bnfold_add", inputs=[y, bias], outputs=[out]))
    return True


def _to_affine(graph, bn, scale, shift) -> None:
    x = bn.inputs[0]
    rank = len(shape_of(x)) if shape_of(x) is not None else 4
    dtype = constant_value(bn.inputs[1]).dtype
    shape = (scale.size,) + (1,) * max(rank - 2, 0)
    mul_c = make_constant(graph, f"{bn.name}_scale", scale.reshape(shape).astype(dtype))
    add_c = make_constant(graph, f"{bn.name}_shift", shift.reshape(shape).astype(dtype))
    mid = make_variable(graph, f"{bn.name}_scaled", x.dtype, x.shape)
    out = bn.outputs[0]
    bn.outputs.clear()
    graph.nodes.append(gs.Node("Mul", name=f"{bn.name}_mul", inputs=[x, mul_c], outputs=[mid]))
    graph.nodes.append(gs.Node("Add", name=f"{bn.name}_add", inputs=[mid, add_c], outputs=[out]))


def _concat_of_convs(graph, concat: gs.Node, channels: int) -> list[gs.Node] | None:
    """The Convs whose outputs alone a channel Concat joins (timm's MixedConv2d), each output read by
    the Concat only, their output channels adding up to `channels`, every filter and bias a constant:
    a BN on the Concat folds into them, a slice of its channels each. None where any of that fails."""
    rank = len(shape_of(concat.outputs[0]) or [])
    axis = int(concat.attrs.get("axis", 0))
    if rank < 3 or axis not in (1, 1 - rank):
        return None
    convs = []
    for t in concat.inputs:
        conv = producer(t)
        if conv is None or conv.op != "Conv" or len(t.outputs) != 1 or t in graph.outputs or conv in convs:
            return None
        w = constant_value(conv.inputs[1])
        has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
        if w is None or (has_bias and constant_value(conv.inputs[2]) is None):
            return None
        convs.append(conv)
    if sum(constant_value(c.inputs[1]).shape[0] for c in convs) != channels:
        return None
    return convs


def fold_batchnorm(graph: gs.Graph, report: Report) -> gs.Graph:
    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        reason = _why_not_foldable(bn)
        if reason is not None:
            report.skip(bn, f"BatchNormalization left as is: {reason}")
            continue
        scale, shift = _bn_scale_shift(bn)
        x = bn.inputs[0]
        prod = producer(x)
        single_use = len(x.outputs) == 1 and x not in graph.outputs
        folded = False
        if prod is not None and single_use:
            if prod.op in ("Conv", "ConvTranspose"):
                folded = fold_into_conv(graph, prod, scale, shift)
            elif prod.op == "Gemm":
                folded = _fold_gemm(graph, prod, scale, shift)
            elif prod.op == "Concat" and (convs := _concat_of_convs(graph, prod, scale.size)):
                start = 0
                for conv in convs:  # every precondition was checked: each fold succeeds
                    k = constant_value(conv.inputs[1]).shape[0]
                    folded = fold_into_conv(graph, conv, scale[start:start + k], shift[start:start + k])
                    start += k
                    assert folded, conv.name
                report.bn_folded["Conv (through Concat)"] += 1
                report.activation_bytes_saved += 2 * (numel_per_image(x) or 0) * itemsize(x)
                out = bn.outputs[0]
                bn.outputs.clear()
                set_outputs(prod, [out])
                continue
            elif prod.op == "MatMul":
                folded = _fold_matmul(graph, prod, bn, scale, shift)
                if folded:
                    report.bn_folded["MatMul"] += 1
                    continue
        if folded:
            # the pre-BN tensor is no longer written and read back
            report.activation_bytes_saved += 2 * (numel_per_image(x) or 0) * itemsize(x)
            out = bn.outputs[0]
            bn.outputs.clear()
            prod.outputs.clear()
            set_outputs(prod, [out])
            report.bn_folded[prod.op] += 1
        else:
            _to_affine(graph, bn, scale, shift)
            report.bn_to_affine += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
