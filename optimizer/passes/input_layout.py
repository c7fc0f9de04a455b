"""Input layout (targets ort-cuda and ort-cpu): the Transpose that takes a few-channel tensor — the
RGB image at a graph input — from NCHW into an NHWC region becomes `epifuse::NchwToNhwc`.

Why, on ort-cuda: ONNX Runtime's CUDA Transpose treats [N, C, H*W] → [N, H*W, C] as a batched 2-D
transpose in 32x32 tiles, of which only C rows hold data when C is 3. On the H200 that Transpose took 0.63 ms of
YOLOv8s's 6.1 ms at batch 32 (32x3x640x640 fp16: 0.25 TB/s; CUPTI profile, `bench/ort_models.py
--profile`). The epifuse kernel gives each thread a pixel, so reads and writes are coalesced
(plugins/kernels/layout.cu). Larger C stays with ORT's Transpose, which fills its tiles there.

Why, on ort-cpu: ORT's CPU Transpose moves an element at a time; the library's row interleave
(plugins/core/nchw_to_nhwc.cc) writes NHWC rows in sequence: 1x3x224x224 float 43 µs against ORT's
103-350, 3x640x640 1.4-1.7x, 2 to 8 channels 2.5-4.3x (2-core Zen 4, `python bench/cpu_layout.py`).
One channel stays a Transpose: ORT copies it as the reshape it is (0.9x).
Runs after the precision pass, so the op moves 16-bit data when the model runs in fp16.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import NCHW_TO_NHWC, ensure_domain, shape_of
from ..report import Report

OP_TYPE = "NchwToNhwc"
CHANNELS = {"ort-cuda": (1, 8), "ort-cpu": (2, 8)}  # (fewest, most) channels, per target: see above
DTYPES = ("float32", "float16", "bfloat16")


def _few_channel_to_nhwc(node: gs.Node, target: str) -> bool:
    if node.op != "Transpose" or tuple(node.attrs.get("perm", ())) != NCHW_TO_NHWC or len(node.inputs) != 1:
        return False
    x = node.inputs[0]
    shape = shape_of(x)
    if x.dtype is None or np.dtype(x.dtype).name not in DTYPES:
        return False
    fewest, most = CHANNELS[target]
    return bool(shape) and len(shape) == 4 and isinstance(shape[1], int) and fewest <= shape[1] <= most


def input_layout(graph: gs.Graph, report: Report, target: str) -> gs.Graph:
    if target not in CHANNELS:
        # a model optimized for ORT before: the op is ORT's alone, a Transpose for TensorRT
        for node in graph.nodes:
            if node.op == OP_TYPE and node.domain == contract.DOMAIN:
                node.op, node.domain, node.attrs = "Transpose", "", {"perm": list(NCHW_TO_NHWC)}
                report.canonicalized[f"epifuse::{OP_TYPE} → Transpose ({target})"] += 1
        return graph
    for node in graph.nodes:
        if _few_channel_to_nhwc(node, target):
            node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {}
            ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
            report.canonicalized[f"few-channel NCHW→NHWC Transpose → epifuse::{OP_TYPE} ({target})"] += 1
    return graph
