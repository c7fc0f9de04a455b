"""Fully connected layers as 1x1 convs (target ort-cuda): a classifier's Gemm with constant weights,

    Gemm(A [N, C], B, bias)   →   Reshape [N, C, 1, 1]  →  Conv 1x1 (W [K, C, 1, 1], bias)  →  Reshape [N, K]

so the fusion pass gives it to FusedConv and the layout pass keeps it channels-last (a [N, C, 1, 1]
tensor is the same memory in both layouts; layout.py drops or folds the Transposes around it).
Why: ONNX Runtime hands a batch-1 Gemm to a cuBLAS tile kernel that read ResNet-50's 2048→1000
weights (4 MB) in 12.6 µs on the H200 (CUDA-graph timeline, `bench/ort_models.py --timeline`),
where the registry's GEMV kernel streams them at DRAM speed. Only Gemm with alpha = 1, transA = 0,
constant B and a constant bias broadcast over rows (beta = 1), on a rank-2 input with static C.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import constant_value, make_constant, make_variable, replace_uses, shape_of
from ..registry import ConvDesc
from ..report import Report


def _conv_weights(node: gs.Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W [K, C, 1, 1], bias [K] or None) when `node` is a Gemm this pass rewrites."""
    a = node.attrs
    if node.op != "Gemm" or float(a.get("alpha", 1.0)) != 1.0 or int(a.get("transA", 0)):
        return None
    shape = shape_of(node.inputs[0])
    b = constant_value(node.inputs[1])
    if not shape or len(shape) != 2 or not isinstance(shape[1], int) or b is None or b.ndim != 2:
        return None
    w = b if int(a.get("transB", 0)) else b.T
    if w.shape[1] != shape[1]:
        return None
    bias = None
    if len(node.inputs) > 2 and node.inputs[2].name:
        c = constant_value(node.inputs[2])
        if c is None or float(a.get("beta", 1.0)) != 1.0 or c.size != w.shape[0] or \
                c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
            return None  # a bias per row, or scaled: not a conv bias
        bias = c.reshape(-1)
    return np.ascontiguousarray(w).reshape(w.shape[0], w.shape[1], 1, 1), bias


def fc_as_conv(graph: gs.Graph, report: Report, target: str, decider=None, kernel_query=None) -> gs.Graph:
    """With a `decider` (optimizer.decide) and `kernel_query`, a Gemm is rewritten only where the
    FusedConv that would replace it is faster than the Gemm itself; without, everywhere."""
    if target != "ort-cuda":
        return graph
    for node in list(graph.nodes):
        found = _conv_weights(node) if node.outputs else None
        if found is None:
            continue
        w, bias = found
        x, y = node.inputs[0], node.outputs[0]
        base = node.name or "fc"
        k, c, n = w.shape[0], w.shape[1], shape_of(x)[0]
        if decider is not None:
            desc = ConvDesc(dtype=decider.dtype_code(w.dtype), H=1, W=1, C=c, K=k, R=1, S=1)
            verdict = decider.approve(graph, f"{base}_conv", [node], x, y, w,
                                      bias if bias is not None else np.zeros(k, w.dtype), desc, kernel_query)
            if not verdict.fuse:
                report.decide(node, "Gemm (as a 1x1 FusedConv)", verdict)
                continue
        image = make_variable(graph, f"{base}_image", x.dtype, [n, c, 1, 1])
        conv_out = make_variable(graph, f"{base}_conv", y.dtype, [n, k, 1, 1])
        rows = make_variable(graph, f"{base}_rows", y.dtype, shape_of(y))
        inputs = [image, make_constant(graph, f"{base}_W", w)]  # W keeps B's dtype
        if bias is not None:
            inputs.append(make_constant(graph, f"{base}_B", bias))
        graph.nodes += [
            gs.Node("Reshape", f"{base}_to_image",
                    inputs=[x, make_constant(graph, f"{base}_image_shape", np.array([0, c, 1, 1], np.int64))],
                    outputs=[image]),
            gs.Node("Conv", f"{base}_conv", attrs={"kernel_shape": [1, 1]}, inputs=inputs, outputs=[conv_out]),
            gs.Node("Reshape", f"{base}_to_rows",
                    inputs=[conv_out, make_constant(graph, f"{base}_rows_shape", np.array([-1, k], np.int64))],
                    outputs=[rows]),
        ]
        replace_uses(graph, y, rows)
        node.outputs.clear()
        report.canonicalized["Gemm on [N, C] → 1x1 Conv (ort-cuda)"] += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
