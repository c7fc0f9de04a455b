"""Squeeze-excite gates into the conv that reads them on ort-cpu: an `epifuse::ChannelScale` (X times the gate
S [N or 1, 1, 1, C]) whose product only a FusedConv reads, as its X, becomes `epifuse::FusedConvScaled`, the
conv of X * S: inputs X, W, B, S and the conv's Z where it has one; only where the conv's filters hold no
more elements than an image of X (known from the shapes).

Why: the gated tensor is written, then read again by the conv, a pass over the whole map. The library scales
the conv's filters instead (plugins/core/cpu_fused_conv.h): on oneDNN each thread scales its piece's filters
in the layout they were reordered into once, just before the conv reads them, so the gated tensor is never
written. Against ChannelScale + FusedConv on EfficientNet-B0's and MobileNetV3-Large's projections
(`python bench/cpu_layout.py --only conv-scale`): 1.05-1.73x on two threads, 1.03-1.87x on one (28x28 120 ->
40: 38 against 62 µs). Where the filters outweigh the map (the 7x7 blocks: 1152 -> 192) scaling them costs
more than the map's pass on one thread (0.87x), and the op's other way, X scaled into a buffer of its own,
is 0.97-1.0x the two nodes: those are left as they are. fp32 and bf16 (oneDNN's bf16 filter layouts
interleave pairs of input channels, AcdB16a2b: the scaling takes pairs). The merge is the last pass, on the
nodes as every other pass left them (the precision pass has typed both alike; a scale it kept float32 behind
a Cast is not merged); `split_conv_scales`, the first, writes a model optimized before back as the two nodes
every other pass knows.
"""
from __future__ import annotations

import math

import onnx_graphsurgeon as gs

from .. import contract
from ..graph import inferred_types, set_inputs, shape_of, unique_name
from ..report import Report

OP_TYPE = "FusedConvScaled"
SCALE_OP = "ChannelScale"


def _filters_no_larger(conv: gs.Node, x: gs.Tensor, types: dict) -> bool:
    """Whether `conv`'s filters (KRSC) hold no more elements than an image of its input X [N, H, W, C], both
    known. `types`: each tensor's (dtype, shape), inferred (the layout pass leaves its tensors untyped)."""
    w, xs = shape_of(conv.inputs[1]), types.get(x.name, (None, shape_of(x)))[1]
    if not (w and xs and len(w) == 4 and len(xs) == 4 and all(isinstance(d, int) for d in (*w, *xs[1:]))):
        return False
    return math.prod(w) <= math.prod(xs[1:])


def conv_scale(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        return graph
    scales = [n for n in graph.nodes if n.op == SCALE_OP and n.domain == contract.DOMAIN]
    if not scales:
        return graph
    types = inferred_types(graph)
    merged = False
    for scale in scales:
        gated = scale.outputs[0]
        if len(gated.outputs) != 1 or gated in graph.outputs or len(scale.inputs) != 2:
            continue
        conv = gated.outputs[0]
        if (conv.op != contract.OP_TYPE or conv.domain != contract.DOMAIN or len(conv.outputs) != 1
                or not 3 <= len(conv.inputs) <= 4 or any(t is gated for t in conv.inputs[1:])):
            continue
        x, s = scale.inputs
        if not _filters_no_larger(conv, x, types):
            continue
        scale.outputs.clear()  # dead: cleanup drops it
        set_inputs(conv, [x, *conv.inputs[1:3], s, *conv.inputs[3:]])
        conv.op = OP_TYPE
        report.canonicalized[f"{SCALE_OP} + FusedConv → epifuse::{OP_TYPE} ({target})"] += 1
        merged = True
    return graph.cleanup(remove_unused_graph_inputs=False) if merged else graph


def split_conv_scales(graph: gs.Graph, report: Report) -> gs.Graph:
    """Each FusedConvScaled of a model optimized before as a ChannelScale and the FusedConv that reads it."""
    merged = [n for n in graph.nodes if n.op == OP_TYPE and n.domain == contract.DOMAIN]
    for node in merged:
        x, w, b, s, *z = node.inputs
        gated = gs.Variable(unique_name(graph, f"{node.name or 'conv'}_gated"), dtype=x.dtype)
        graph.nodes.append(gs.Node(SCALE_OP, unique_name(graph, f"{node.name or 'conv'}_scale"), {}, [x, s], [gated],
                                   domain=contract.DOMAIN))
        set_inputs(node, [gated, w, b, *z])
        node.op = contract.OP_TYPE
        report.canonicalized[f"epifuse::{OP_TYPE} → {SCALE_OP} + FusedConv"] += 1
    if merged:
        graph.toposort()
    return graph
