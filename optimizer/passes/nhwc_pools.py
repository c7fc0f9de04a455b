"""Channels-last global average pools as a GEMV, where the target runs that faster (ort-cuda, fp16):
ReduceMean over axes 1 and 2 of [N, H, W, C] with keepdims, the form the layout pass gives
GlobalAveragePool inside an NHWC region, becomes

    Reshape [N, H*W, C]  →  MatMul by a [1, H*W] row of 1/(H*W)  →  Reshape [N, 1, 1, C]

Why, on ort-cuda at fp16: ONNX Runtime's CUDA EP reduces leading or trailing axes with its own
kernels, but axes (1, 2) of an NHWC tensor go to cudnnReduceTensor, in fp32 with conversions around
it. On the H200 those took 1.3 ms of EfficientNet-B0's 3.34 ms at batch 32 (CUPTI profile,
`bench/ort_models.py --profile`): its squeeze-excite blocks pool every stage. A GEMV reads X once
through cuBLAS. The row holds 1/(H*W) rather than ones so the fp16 product cannot overflow; rounding
1/(H*W) to fp16 moves the mean by at most 2^-11 relative. Not at fp32 there: the CUDA EP runs MatMul in
TF32 by default, coarser than the exact ReduceMean, and a bf16 MatMul has no CPU kernel to verify it
against.

On ort-cpu at fp32 the channel_mean pass gives these pools to epifuse::ChannelMean instead: ORT's CPU
ReduceMean over the middle axes is a strided loop, 2-6x slower than its NCHW GlobalAveragePool; MLAS's
SGEMM runs this GEMV 3-8x faster than that, the library's op as fast or faster in one node instead of
three.

H and W must be static.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import axes_of, make_constant, make_variable, replace_uses, shape_of
from ..report import Report


def _nhwc_spatial_mean(node: gs.Node) -> tuple[int, int] | None:
    """(H, W) when `node` is ReduceMean over H and W of a static-spatial NHWC tensor, keeping dims."""
    if node.op != "ReduceMean" or not int(node.attrs.get("keepdims", 1)) or node.attrs.get("noop_with_empty_axes"):
        return None
    shape, axes = shape_of(node.inputs[0]), axes_of(node, 1)
    if not shape or len(shape) != 4 or axes is None or sorted(int(a) % 4 for a in axes) != [1, 2]:
        return None
    h, w = shape[1], shape[2]
    return (h, w) if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0 else None


GEMV_POOLS = {("ort-cuda", "fp16")}  # (target, precision): see the module's text


def pools_as_gemv(target: str, precision: str) -> bool:
    return (target, precision) in GEMV_POOLS


def nhwc_pools(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if not pools_as_gemv(target, precision):
        return graph
    done = pools_to_gemv(graph)
    if done:
        report.canonicalized[f"NHWC global average pool → GEMV ({target})"] += done
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()


def pools_to_gemv(graph: gs.Graph) -> int:
    """Rewrites every static-spatial NHWC ReduceMean pool of `graph` as the GEMV; returns their count."""
    done = 0
    for node in list(graph.nodes):
        hw = _nhwc_spatial_mean(node)
        if hw is None or not node.outputs:
            continue
        x, y = node.inputs[0], node.outputs[0]
        pixels = hw[0] * hw[1]
        base = node.name or "pool"
        rows = make_variable(graph, f"{base}_rows", x.dtype, None)
        sums = make_variable(graph, f"{base}_mean", x.dtype, None)
        pooled = make_variable(graph, f"{base}_nhwc", x.dtype, shape_of(y))
        weights = make_constant(graph, f"{base}_mean_row", np.full((1, pixels), 1.0 / pixels, np.float32))
        graph.nodes += [
            gs.Node("Reshape", f"{base}_to_rows", inputs=[x, make_constant(graph, f"{base}_rows_shape",
                                                                          np.array([0, pixels, -1], np.int64))],
                    outputs=[rows]),
            gs.Node("MatMul", f"{base}_gemv", inputs=[weights, rows], outputs=[sums]),
            gs.Node("Reshape", f"{base}_to_nhwc", inputs=[sums, make_constant(graph, f"{base}_nhwc_shape",
                                                                             np.array([0, 1, 1, -1], np.int64))],
                    outputs=[pooled]),
        ]
        replace_uses(graph, y, pooled)
        node.outputs.clear()
        done += 1
    return done
