"""Channel concats on ort-cpu: Concat along the last axis of 4-D X_i [N, H, W, C_i] (the form the layout pass
gives a channels-last region's channel Concat: a YOLO C2f or CSP block's, an FPN's) becomes
`epifuse::ChannelConcat`.

Why: ONNX Runtime's CPU Concat copies such a tensor a pixel's C_i elements at a time through its generic
strided copy, 1.2-2.3x the time of the original model's NCHW Concat of the same tensors (whole planes a
copy): on a 2-core Xeon, 3 x 1x160x160x16 took 366 µs against 166 in NCHW. The library's kernel
(plugins/core/channel_concat.cc) copies each pixel's rows with vector loads and stores, a block of output
rows at a time: 184 µs there, as fast as the NCHW form on YOLO's and CSPDarknet's shapes (`python
bench/cpu_layout.py` has the table), and bit-exact (it only moves data). On ort-cpu in fp32 and bf16 (the
kernel copies 2- and 4-byte elements; the precision pass makes the op bf16 where its data is); for any
other target or precision the op goes back to a Concat.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import ensure_domain, inferred_types, shape_of
from ..report import Report

OP_TYPE = "ChannelConcat"


def _channel_concat(node: gs.Node, types: dict) -> bool:
    """Whether `node` is a float32 Concat along the last axis of two or more 4-D tensors computed by the graph.
    `types`: each tensor's (dtype, shape), inferred (the layout pass leaves its tensors untyped)."""
    if node.op != "Concat" or node.domain not in (None, "", "ai.onnx") or len(node.outputs) != 1:
        return False
    if len(node.inputs) < 2 or int(node.attrs.get("axis", 0)) not in (3, -1):
        return False
    for x in node.inputs:
        if isinstance(x, gs.Constant) or not x.name:  # constants stay ORT's (the precision pass keeps them float)
            return False
        x_type, shape = types.get(x.name, (x.dtype, shape_of(x)))
        if x_type is None or np.dtype(x_type) != np.float32 or not shape or len(shape) != 4:
            return False
    return True


def channel_concat(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        for node in graph.nodes:  # a model optimized for ort-cpu before: the op is that library's alone
            if node.op == OP_TYPE and node.domain == contract.DOMAIN:
                node.op, node.domain, node.attrs = "Concat", "", {"axis": 3}
                report.canonicalized[f"epifuse::{OP_TYPE} → Concat ({target}, {precision})"] += 1
        return graph
    concats = [n for n in graph.nodes if n.op == "Concat" and int(n.attrs.get("axis", 0)) in (3, -1)]
    if not concats:
        return graph
    types = inferred_types(graph)
    for node in concats:
        if not _channel_concat(node, types):
            continue
        node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {}
        ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
        report.canonicalized[f"channels-last Concat → epifuse::{OP_TYPE} ({target})"] += 1
    return graph
