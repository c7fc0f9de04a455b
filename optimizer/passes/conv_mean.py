"""Squeeze-excite pools into their depthwise conv on ort-cpu: a depthwise FusedConv whose output an
`epifuse::ChannelMean` reads (the pool of a squeeze-excite block, which scales that same output) becomes
`epifuse::FusedConvMean`, the conv with the mean as a second output [N, 1, 1, K].

Why: the pool reads the whole output again, a node of its own (10-30 µs on EfficientNet-B0's shapes, two
threads); the library's depthwise kernel adds each output vector to sums of its own while it is in
registers, a few % of the conv's time (`python bench/cpu_layout.py --only conv-mean`). Where another kernel
runs the conv (no AVX-512 or AVX2, a dilated filter), the op takes the mean in a pass over the output, as the
pool would. The merge is the last pass, on the graph the others left (the precision pass has typed both
nodes alike; a pool it kept float32 behind a Cast is not merged); `split_conv_means`, the first, writes a
model optimized before back as the two nodes every other pass knows.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from .. import contract
from ..graph import set_outputs, shape_of, unique_name
from ..report import Report

OP_TYPE = "FusedConvMean"
MEAN_OP = "ChannelMean"


def _is_depthwise(conv: gs.Node) -> bool:
    """A FusedConv of one input channel a group (its KRSC filters [K, R, S, 1], group K)."""
    if conv.op != contract.OP_TYPE or conv.domain != contract.DOMAIN or len(conv.outputs) != 1 or len(conv.inputs) < 2:
        return False
    w = shape_of(conv.inputs[1])
    return bool(w) and len(w) == 4 and w[3] == 1 and isinstance(w[0], int) and int(conv.attrs.get("group", 1)) == w[0]


def conv_mean(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        return graph
    merged = False
    for mean in [n for n in graph.nodes if n.op == MEAN_OP and n.domain == contract.DOMAIN]:
        y = mean.inputs[0]
        conv = y.inputs[0] if len(y.inputs) == 1 else None
        if conv is None or not _is_depthwise(conv):
            continue
        m = mean.outputs[0]
        mean.outputs.clear()  # the pool is dead: cleanup drops it
        set_outputs(conv, [y, m])
        conv.op = OP_TYPE
        report.canonicalized[f"depthwise FusedConv + {MEAN_OP} → epifuse::{OP_TYPE} ({target})"] += 1
        merged = True
    return graph.cleanup(remove_unused_graph_inputs=False) if merged else graph


def split_conv_means(graph: gs.Graph, report: Report) -> gs.Graph:
    """Each FusedConvMean of a model optimized before as a FusedConv and a ChannelMean of its output."""
    merged = [n for n in graph.nodes if n.op == OP_TYPE and n.domain == contract.DOMAIN]
    for node in merged:
        y, m = node.outputs[0], node.outputs[1]
        set_outputs(node, [y])
        node.op = contract.OP_TYPE
        graph.nodes.append(gs.Node(MEAN_OP, unique_name(graph, f"{node.name or 'conv'}_mean"), {}, [y], [m],
                                   domain=contract.DOMAIN))
        report.canonicalized[f"epifuse::{OP_TYPE} → FusedConv + {MEAN_OP}"] += 1
    if merged:
        graph.toposort()
    return graph
