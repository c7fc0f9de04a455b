"""Channel means on ort-cpu: the global average pool of a channels-last region, ReduceMean over axes 1 and 2
of X [N, H, W, C] keeping dims (the form the layout pass gives a GlobalAveragePool there), becomes
`epifuse::ChannelMean`; one that drops them (a mean over H and W to [N, C], MNASNet's and ShuffleNetV2's
head) becomes ChannelMean and a Flatten, a view of its [N, 1, 1, C] output.

Why: ONNX Runtime's CPU ReduceMean over the middle axes is a strided loop, 2-6x slower than the original
model's NCHW GlobalAveragePool; written as a GEMV (Reshape, MatMul by a row of 1/(H*W), Reshape) MLAS runs
it 3-8x faster than that, but the three nodes still cost EfficientNet-B0 more than its NCHW pools did.
The library's kernel (plugins/core/channel_mean.cc) sums rows of channel vectors in registers, pieces of
rows on the intra-op threads and their partial sums added in a fixed order (`python bench/cpu_layout.py`
has the table). On ort-cpu in fp32 and bf16 (the kernel has both: the precision pass makes the op bf16
where its data is); for any other target or precision the op goes back to a ReduceMean.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import (axes_of, ensure_domain, inferred_types, make_constant, make_variable, set_inputs,
                     set_outputs, shape_of)
from ..report import Report

OP_TYPE = "ChannelMean"
AXES = [1, 2]


def _spatial_mean(node: gs.Node, types: dict) -> bool:
    """Whether `node` is a float ReduceMean over H and W of a 4-D X."""
    if node.op != "ReduceMean" or node.domain not in (None, "", "ai.onnx") or len(node.outputs) != 1:
        return False
    if node.attrs.get("noop_with_empty_axes"):
        return False
    x = node.inputs[0]
    x_type, shape = types.get(x.name, (x.dtype, shape_of(x)))
    if x_type is None or np.dtype(x_type) != np.float32 or not shape or len(shape) != 4:
        return False
    axes = axes_of(node, 1)
    return axes is not None and sorted(int(a) % 4 for a in axes) == AXES


def as_reduce_mean(graph: gs.Graph, node: gs.Node) -> None:
    """Writes the op `node` back as the standard ReduceMean over axes 1 and 2 in `graph`'s opset."""
    node.op, node.domain, node.attrs = "ReduceMean", "", {"keepdims": 1}
    if graph.opset >= 18:  # axes became an input
        axes = make_constant(graph, f"{node.name or 'mean'}_axes", np.array(AXES, np.int64))
        set_inputs(node, [node.inputs[0], axes])
    else:
        node.attrs["axes"] = list(AXES)


def channel_mean(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        for node in graph.nodes:  # a model optimized for ort-cpu before: the op is that library's alone
            if node.op == OP_TYPE and node.domain == contract.DOMAIN:
                as_reduce_mean(graph, node)
                report.canonicalized[f"epifuse::{OP_TYPE} → ReduceMean ({target}, {precision})"] += 1
        return graph
    means = [n for n in graph.nodes if n.op == "ReduceMean"]
    if not means:
        return graph
    types = inferred_types(graph)
    for node in means:
        if not _spatial_mean(node, types):
            continue
        if not int(node.attrs.get("keepdims", 1)):  # [N, C]: the op's [N, 1, 1, C], flattened
            y = node.outputs[0]
            x_shape = shape_of(node.inputs[0])
            mean = make_variable(graph, f"{y.name}_keepdims", y.dtype,
                                 [x_shape[0], 1, 1, x_shape[3]] if x_shape and len(x_shape) == 4 else None)
            set_outputs(node, [mean])
            graph.nodes.append(gs.Node("Flatten", name=f"{node.name}_flatten", attrs={"axis": 1},
                                       inputs=[mean], outputs=[y]))
        node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {}
        set_inputs(node, node.inputs[:1])
        ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
        report.canonicalized[f"channels-last global average pool → epifuse::{OP_TYPE} ({target})"] += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
