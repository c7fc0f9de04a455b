"""Input layout (target ort-cuda): the Transpose that takes a few-channel tensor — the RGB image at a
graph input — from NCHW into an NHWC region becomes `epifuse::NchwToNhwc`.

Why: ONNX Runtime's CUDA Transpose treats [N, C, H*W] → [N, H*W, C] as a batched 2-D transpose in
32x32 tiles, of which only C rows hold data when C is 3. On the H200 that Transpose took 0.63 ms of
YOLOv8s's 6.1 ms at batch 32 (32x3x640x640 fp16: 0.25 TB/s; CUPTI profile, `bench/ort_models.py
--profile`). The epifuse kernel gives each thread a pixel, so reads and writes are coalesced
(plugins/kernels/layout.cu). Larger C stays with ORT's Transpose, which fills its tiles there.
Runs after the precision pass, so the op moves 16-bit data when the model runs in fp16.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import NCHW_TO_NHWC, ensure_domain, shape_of
from ..report import Report

OP_TYPE = "NchwToNhwc"
MAX_CHANNELS = 8  # ORT's 32-row tiles are at most 1/4 full
DTYPES = ("float32", "float16", "bfloat16")


def _few_channel_to_nhwc(node: gs.Node) -> bool:
    if node.op != "Transpose" or tuple(node.attrs.get("perm", ())) != NCHW_TO_NHWC or len(node.inputs) != 1:
        return False
    x = node.inputs[0]
    shape = shape_of(x)
    if x.dtype is None or np.dtype(x.dtype).name not in DTYPES:
        return False
    return bool(shape) and len(shape) == 4 and isinstance(shape[1], int) and 0 < shape[1] <= MAX_CHANNELS


def input_layout(graph: gs.Graph, report: Report, target: str) -> gs.Graph:
    if target != "ort-cuda":
        # a model optimized for ort-cuda before: the op is ORT's CUDA EP's alone, a Transpose elsewhere
        for node in graph.nodes:
            if node.op == OP_TYPE and node.domain == contract.DOMAIN:
                node.op, node.domain, node.attrs = "Transpose", "", {"perm": list(NCHW_TO_NHWC)}
                report.canonicalized[f"epifuse::{OP_TYPE} → Transpose ({target})"] += 1
        return graph
    for node in graph.nodes:
        if _few_channel_to_nhwc(node):
            node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {}
            ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
            report.canonicalized[f"few-channel NCHW→NHWC Transpose → epifuse::{OP_TYPE} (ort-cuda)"] += 1
    return graph
