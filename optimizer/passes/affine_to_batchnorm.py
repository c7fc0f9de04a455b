"""Per-channel Mul → Add pairs left in NCHW become one BatchNormalization (mean 0, variance 1,
epsilon 0: y = x * scale + shift). fold_batchnorm writes a BatchNormalization it cannot fold into a
producer as such a pair, so that the layout pass can carry it into an NHWC region like any
elementwise op; where it stays outside one (DenseNet's pre-activation BatchNorms after each Concat,
62 of them), ONNX Runtime runs the pair as two passes over the tensor where its BatchNormalization
kernel makes one: DenseNet-121 with nothing fused read 0.87x ORT on the CPU. fp32 models only: for
fp16 and bf16 the precision pass keeps BatchNormalization in fp32 on the GPU targets (Casts around
it would cost more than the pass saved)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import constant_value, make_constant, shape_of, unique_name
from ..report import Report


def _per_channel(t: gs.Tensor, channels: int) -> np.ndarray | None:
    """`t`'s value as [C] where it is a float32 constant shaped [C, 1, 1] (what fold_batchnorm writes
    for a 4-D input), else None."""
    v = constant_value(t)
    if v is None or v.dtype != np.float32 or v.shape != (channels, 1, 1):
        return None
    return v.reshape(channels)


def affine_to_batchnorm(graph: gs.Graph, report: Report, precision: str) -> gs.Graph:
    if precision != "fp32" or graph.opset < 9:  # BatchNormalization's inference form from opset 9 on
        return graph
    for mul in [n for n in graph.nodes if n.op == "Mul"]:
        if len(mul.inputs) != 2 or len(mul.outputs) != 1:
            continue
        x, c = mul.inputs if constant_value(mul.inputs[1]) is not None else reversed(mul.inputs)
        x_shape, mid = shape_of(x), mul.outputs[0]
        if x_shape is None or len(x_shape) != 4 or not isinstance(x_shape[1], int) or shape_of(mid) != x_shape:
            continue  # where the Mul broadcasts x up, a BatchNormalization would not
        scale = _per_channel(c, x_shape[1])
        if scale is None or len(mid.outputs) != 1 or any(o is mid for o in graph.outputs):
            continue
        add = mid.outputs[0]
        if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
            continue
        shift = _per_channel(add.inputs[1] if add.inputs[0] is mid else add.inputs[0], x_shape[1])
        if shift is None:
            continue
        channels = x_shape[1]
        params = [make_constant(graph, f"{mul.name}_{what}", v) for what, v in (
            ("scale", scale), ("shift", shift), ("mean", np.zeros(channels, np.float32)),
            ("var", np.ones(channels, np.float32)))]
        out = add.outputs[0]
        add.outputs.clear()
        mul.outputs.clear()
        graph.nodes.append(gs.Node("BatchNormalization", name=unique_name(graph, f"{mul.name}_bn"),
                                   attrs={"epsilon": 0.0}, inputs=[x, *params], outputs=[out]))
        report.canonicalized["per-channel Mul → Add → BatchNormalization"] += 1
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
