"""Global average pools as depthwise convs (target ort-cuda): GlobalAveragePool over a static H x W
becomes

    Conv(X, W = 1/(H*W) in every tap of an H x W filter, group = C)   →   [N, C, 1, 1]

so the fusion pass gives it to FusedConv (the depthwise kernels; cuda_depthwise_global splits a large
map over several blocks) and it reads the NHWC region's tensor as it is. Why: the NHWC pool otherwise
runs as ONNX Runtime's ReduceMean over axes 1 and 2 (cudnnReduceTensor: 20-43 µs for each
squeeze-excite pool of EfficientNet-B0's first stages at batch 16 in fp32, two kernels each, 0.54 of its
1.70 ms on an H200) or, for fp16, as nhwc_pools' GEMV, which ONNX Runtime runs as a batched MatMul: at
batch 1 it copied three pointer arrays host→device inside the CUDA graph and ran cuBLAS's gemv, ~15 µs
of ResNet-50's 0.40 ms (graph timeline, `bench/ort_models.py --timeline`). Pools of at most 64 pixels
(the last stage of ResNet, EfficientNet, MobileNet: 7x7) are rewritten on every policy; larger ones
(squeeze-excite at 14x14 and up) only where measured faster or under `--fuse always`. 1/(H*W) rounds to
fp16 within 2^-11 relative, as nhwc_pools' row does; the sum is fp32.
With a decider it runs after the fuse pass, so it knows the layout the pool will sit in: a pool
reading a fused conv's NHWC output (through the Transpose the fuse pass leaves, or elementwise ops the
layout pass moves it through) is weighed against that pool as the model runs it unfused there — a
ReduceMean over the NHWC tensor, nhwc_pools' GEMV for fp16 (costs.NHWC_POOL / NHWC_POOL_GEMV) — and the
pipeline fuses the conv it becomes in a second fuse pass. A pool reading an NCHW tensor stays a pool:
ONNX Runtime's GlobalAveragePool takes ~3 µs there (H200), and a FusedConv would first need the
tensor transposed. Timing every pool against ORT's NCHW pool instead (2.7 µs at batch 1 against ours
3.2) left the pools inside NHWC regions to the GEMV (~15 µs).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..costs import NHWC_POOL, NHWC_POOL_GEMV
from ..decide import Verdict
from ..graph import NHWC_TO_NCHW, is_transpose, make_constant, make_variable, producer, replace_uses, shape_of
from ..registry import ConvDesc
from ..report import Report
from .layout import HANDLERS, variable_data_inputs
from .nhwc_pools import pools_as_gemv

UNMEASURED_MAX_PIXELS = 64  # larger pools only where measured (or fuse=always)
REWRITE = "GlobalAveragePool → depthwise Conv (ort-cuda)"


def _static_pool(node: gs.Node) -> tuple[int, int, int] | None:
    """(C, H, W) when `node` is a GlobalAveragePool over a static C x H x W."""
    if node.op != "GlobalAveragePool":
        return None
    shape = shape_of(node.inputs[0])
    if not shape or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    return tuple(shape[1:])


def _from_nhwc(t: gs.Tensor, depth: int = 8) -> bool:
    """`t` comes out of an NHWC region: a Transpose to NCHW, or ops the layout pass moves Transposes
    through whose data inputs all do."""
    node = producer(t)
    if node is None or depth == 0:
        return False
    if node.op == "Transpose":
        return is_transpose(node, NHWC_TO_NCHW)
    if node.op not in HANDLERS:
        return False
    data = variable_data_inputs(node)
    return bool(data) and all(_from_nhwc(i, depth - 1) for i in data)


def pool_as_conv(graph: gs.Graph, report: Report, target: str, decider=None, kernel_query=None) -> gs.Graph:
    """With a `decider` (optimizer.decide) and `kernel_query`, after the fuse pass: a pool is rewritten
    only where it reads an NHWC region and the FusedConv that would replace it is faster than the pool
    as the model would run it there (every pool where the decider fuses always; a pool of more than
    UNMEASURED_MAX_PIXELS only on a measurement); without, every pool of at most that many pixels."""
    if target != "ort-cuda":
        return graph
    for node in list(graph.nodes):
        found = _static_pool(node) if node.outputs else None
        if found is None:
            continue
        c, h, w = found
        large = h * w > UNMEASURED_MAX_PIXELS
        if large and decider is None:
            continue
        x, y = node.inputs[0], node.outputs[0]
        base = node.name or "pool"
        dtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)  # a model already in fp16
        filters = np.full((c, 1, h, w), 1.0 / (h * w), dtype)
        if decider is not None:
            desc = ConvDesc(dtype=decider.dtype_code(dtype), H=h, W=w, C=c, K=c, R=h, S=w, group=c)
            if decider.mode != "always" and not _from_nhwc(x):
                report.decide(node, "GlobalAveragePool (as a depthwise FusedConv)", Verdict(
                    False, "its input is NCHW here (the conv before it stays the runtime's): a FusedConv would "
                           "need it transposed", fixed=True))
                continue
            gemv = pools_as_gemv(target, decider.precision)  # nhwc_pools turns the unfused NHWC pool into a GEMV
            unmeasured = (f"a pool of {h}x{w} pixels (more than {UNMEASURED_MAX_PIXELS}) is a depthwise FusedConv "
                          "only where measured faster") if large else None
            verdict = decider.approve(graph, f"{base}_depthwise", [node], x, y, filters, np.zeros(c, dtype), desc,
                                      kernel_query, pattern=NHWC_POOL_GEMV if gemv else NHWC_POOL,
                                      unmeasured=unmeasured)
            if not verdict.fuse:
                report.decide(node, "GlobalAveragePool (as a depthwise FusedConv)", verdict)
                continue
        pooled = make_variable(graph, f"{base}_conv", y.dtype, shape_of(y))
        weights = make_constant(graph, f"{base}_W", filters)
        graph.nodes.append(gs.Node("Conv", f"{base}_depthwise", attrs={"kernel_shape": [h, w], "group": c},
                                   inputs=[x, weights], outputs=[pooled]))
        replace_uses(graph, y, pooled)
        node.outputs.clear()
        report.canonicalized[REWRITE] += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
