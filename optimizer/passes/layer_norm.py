"""Layer norms on ort-cpu: LayerNormalization over the last axis of a float tensor (ConvNeXt's norm,
which the layout pass leaves over the channels of an NHWC region) becomes `epifuse::LayerNorm`.

Why: ONNX Runtime's CPU LayerNormalization runs ~36 cycles a 16-float vector: 1x56x56x96 took 176 µs
on two Zen 4 threads and 185 on one. The library's kernel (plugins/core/layer_norm.cc) takes each row in
three passes while it sits in L1 (the mean, the centred squares, the normalized values): 47 and 75 µs,
1.4-3.7x ORT's on ConvNeXt-T's shapes, relative L2 difference ~4e-8 (`python bench/cpu_layout.py`);
ConvNeXt-T fused throughout 1.02-1.03x faster with it. Rows of fewer than MIN_CHANNELS values stay ORT's
(a 4x16 norm is a few µs either way and read 0.91-1.03x). On ort-cpu in fp32, and in bf16, where it stays
float32 between Casts as ORT's would (the CPU EP has no bfloat16 LayerNormalization); for any other target
or precision the op goes back to a LayerNormalization.

An X that an Add writes stays ORT's too: ORT fuses Add + LayerNormalization into one
SkipLayerNormalization where it can, which this op would break.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import ensure_domain, inferred_types, producer, set_inputs, set_outputs, shape_of
from ..report import Report

OP_TYPE = "LayerNorm"
MIN_CHANNELS = 32
DEFAULT_EPSILON = 1e-5  # ONNX's LayerNormalization default


def _last_axis_norm(node: gs.Node, types: dict, graph_outputs: set[str]) -> bool:
    """Whether `node` is a float LayerNormalization over the last axis of X, of C >= MIN_CHANNELS known
    values, whose Mean and InvStdDev outputs nothing reads."""
    if node.op != "LayerNormalization" or node.domain not in (None, "", "ai.onnx") or not 2 <= len(node.inputs) <= 3:
        return False
    if not node.inputs[1].name:
        return False
    if any(t.name and (t.outputs or t.name in graph_outputs) for t in node.outputs[1:]):
        return False
    x = node.inputs[0]
    x_type, shape = types.get(x.name, (x.dtype, shape_of(x)))
    if x_type is None or np.dtype(x_type) != np.float32 or not shape:
        return False
    if int(node.attrs.get("axis", -1)) not in (-1, len(shape) - 1):
        return False
    if not isinstance(shape[-1], int) or shape[-1] < MIN_CHANNELS:
        return False
    if int(node.attrs.get("stash_type", 1)) != 1:  # statistics in float, as the kernel computes them
        return False
    if (p := producer(x)) is not None and p.op == "Add":
        return False
    for t in node.inputs[1:]:
        t_type, t_shape = types.get(t.name, (t.dtype, shape_of(t)))
        if t.name and (t_type is None or np.dtype(t_type) != np.float32 or t_shape != [shape[-1]]):
            return False
    return True


def layer_norm(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        for node in graph.nodes:  # a model optimized for ort-cpu before: the op is that library's alone
            if node.op == OP_TYPE and node.domain == contract.DOMAIN:
                epsilon = float(node.attrs.get("epsilon", DEFAULT_EPSILON))
                node.op, node.domain, node.attrs = "LayerNormalization", "", {"axis": -1, "epsilon": epsilon}
                report.canonicalized[f"epifuse::{OP_TYPE} → LayerNormalization ({target}, {precision})"] += 1
        return graph
    norms = [n for n in graph.nodes if n.op == "LayerNormalization"]
    if not norms:
        return graph
    types = inferred_types(graph)
    graph_outputs = {t.name for t in graph.outputs}
    for node in norms:
        if not _last_axis_norm(node, types, graph_outputs):
            continue
        epsilon = float(node.attrs.get("epsilon", DEFAULT_EPSILON))
        node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {"epsilon": epsilon}
        set_outputs(node, node.outputs[:1])
        set_inputs(node, [t for t in node.inputs if t.name])  # a B named "" is no B
        ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
        report.canonicalized[f"last-axis LayerNormalization → epifuse::{OP_TYPE} ({target})"] += 1
    return graph
