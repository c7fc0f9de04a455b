"""A pointwise MatMul on a channels-last feature map as a 1x1 conv (target ort-cpu): a Linear layer that
an exporter applies to [N, H, W, C] (ConvNeXt's MLP: Permute → LayerNorm → Linear → GELU → Linear →
Permute), with its bias Add and the activation after it,

    MatMul(X [N, H, W, C], B [C, K]) → Add(bias [K]) → act
        →  Transpose(0, 3, 1, 2) → Conv 1x1 (B^T, bias) → act → Transpose(0, 2, 3, 1)

so the fusion pass gives conv and activation to one FusedConv, which runs on X's NHWC memory as it is
(the layout pass cancels the Transposes against the FusedConv's own). A constant scale along the last
axis right after the bias (a layer scale) folds into weights and bias here; a Transpose back to NCHW
right after is cancelled here, so a per-channel scale after it folds too (fold_affine) and the
block's residual Add fuses as the epilogue.

Why, on ort-cpu: ONNX Runtime runs the group as an MLAS GEMM and a separate pass for the bias and GELU
(BiasGelu); the FusedConv adds the bias on the tile and applies the GELU to each thread's piece while it
is in cache. ConvNeXt-T's MLP layers (2 threads, AMD EPYC Zen 4): 1.10-1.23x faster as FusedConvs, one
layer a micro-model. Not on the GPU targets: not
measured there. A MatMul is rewritten only where its FusedConv was measured faster than the runtime's
nodes (or with fuse=always); unmeasured, it stays a MatMul.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..activations import ActivationMatch, match_replaceable_activation
from ..graph import (add_transpose, constant_value, is_transpose, make_constant, make_variable, replace_uses,
                     set_inputs, set_outputs, shape_of)
from ..registry import ConvDesc
from ..report import Report

TARGETS = ("ort-cpu",)
TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)
REWRITE = "MatMul on a channels-last map → 1x1 Conv (ort-cpu)"
UNMEASURED = "not measured: a MatMul is rewritten as a conv only where measured faster"


def _last_axis_constant(graph: gs.Graph, t: gs.Tensor, op: str, k: int) -> tuple[gs.Node, np.ndarray] | None:
    """(the node, its constant as [k]) where `t`'s one reader is `op` (Add or Mul) with an fp32 constant that
    broadcasts along the last axis only."""
    if len(t.outputs) != 1 or t in graph.outputs:
        return None
    node = t.outputs[0]
    if node.op != op or len(node.inputs) != 2 or node.attrs or node.inputs[0] is node.inputs[1]:
        return None
    value = constant_value(node.inputs[1] if node.inputs[0] is t else node.inputs[0])
    if value is None or value.dtype != np.float32 or value.size not in (1, k) or value.ndim > 4 \
            or (value.size == k and value.shape[-1] != k):
        return None
    return node, np.broadcast_to(value.reshape(-1), (k,)).astype(np.float32)


def _movable(match: ActivationMatch | None, x: gs.Tensor) -> bool:
    """The activation's nodes read only `x`, each other's outputs and one-element constants, so they
    compute the same on the NCHW tensor."""
    if match is None:
        return False
    inside = {id(t) for n in match.nodes for t in n.outputs}
    for t in (t for n in match.nodes for t in n.inputs):
        value = constant_value(t)
        if (value is None and t is not x and id(t) not in inside) or (value is not None and value.size != 1):
            return False
    return True


def _pointwise(node: gs.Node) -> tuple[np.ndarray, list] | None:
    """(B [C, K], X's shape) where `node` is a MatMul of a rank-4 map with static H, W, C by a constant fp32 matrix."""
    if node.op != "MatMul" or len(node.inputs) != 2 or not node.outputs or not isinstance(node.inputs[0], gs.Variable):
        return None
    shape = shape_of(node.inputs[0])
    b = constant_value(node.inputs[1])
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    if b is None or b.ndim != 2 or b.dtype != np.float32 or b.shape[0] != shape[3]:
        return None
    return b, shape


def matmul_as_conv(graph: gs.Graph, report: Report, target: str, decider=None, kernel_query=None) -> gs.Graph:
    """With a `decider` (optimizer.decide) and `kernel_query`, a MatMul is rewritten only where the FusedConv
    that would replace it (with the activation) is faster than the runtime's nodes; without, everywhere."""
    if target not in TARGETS:
        return graph
    for node in list(graph.nodes):
        found = _pointwise(node) if node.outputs else None
        if found is None:
            continue
        b, shape = found
        x, k, c = node.inputs[0], b.shape[1], b.shape[0]
        y = node.outputs[0]
        nodes, w, bias = [node], np.ascontiguousarray(b.T), np.zeros(k, np.float32)
        added = _last_axis_constant(graph, y, "Add", k)
        if added is not None:
            nodes.append(added[0])
            bias, y = added[1], added[0].outputs[0]
        scaled = _last_axis_constant(graph, y, "Mul", k)  # a layer scale: into the weights
        if scaled is not None:
            nodes.append(scaled[0])
            w, bias, y = w * scaled[1][:, None], bias * scaled[1], scaled[0].outputs[0]
        w = w.reshape(k, c, 1, 1)
        act = match_replaceable_activation(graph, y) if y not in graph.outputs else None
        act = act if _movable(act, y) else None
        out = act.output if act is not None else y
        base = node.name or "matmul"
        if decider is not None:
            desc = ConvDesc(dtype=decider.dtype_code(w.dtype), H=shape[1], W=shape[2], C=c, K=k, R=1, S=1,
                            activation=act.name if act else "identity", activation_params=tuple(act.params) if act else ())
            verdict = decider.approve(graph, f"{base}_conv", nodes + (act.nodes if act else []), x, out, w, bias,
                                      desc, kernel_query, unmeasured=UNMEASURED)
            if not verdict.fuse:
                report.decide(node, "MatMul (as a 1x1 FusedConv)", verdict)
                continue
        nchw = [shape[0], k, shape[1], shape[2]]
        conv_out = make_variable(graph, f"{base}_conv", x.dtype, nchw)
        graph.nodes.append(gs.Node("Conv", f"{base}_conv", attrs={"kernel_shape": [1, 1]},
                                   inputs=[add_transpose(graph, x, TO_NCHW, f"{base}_nchw"),
                                           make_constant(graph, f"{base}_W", w),
                                           make_constant(graph, f"{base}_B", bias)], outputs=[conv_out]))
        readers = list(out.outputs)
        for n in nodes:
            n.outputs.clear()
        result = conv_out
        if act is not None:  # its nodes move to the NCHW side, between the conv and the Transpose back
            result = make_variable(graph, f"{base}_act", x.dtype, nchw)
            for n in act.nodes:
                set_inputs(n, [conv_out if t is y else t for t in n.inputs])
                set_outputs(n, [result if t is out else t for t in n.outputs])
                for t in n.outputs:
                    t.shape = nchw
        if len(readers) == 1 and is_transpose(readers[0], TO_NCHW) and out not in graph.outputs:
            replace_uses(graph, readers[0].outputs[0], result)  # back to NCHW at once: no Transpose pair
            readers[0].outputs.clear()
        else:
            add_transpose(graph, result, TO_NHWC, f"{base}_nhwc", out=out)
        report.canonicalized[REWRITE] += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
