"""Inverted-residual expands into the depthwise conv that reads them on ort-cpu: a 1x1 FusedConv (stride 1,
unpadded, one group, no residual, at most 128 input and 480 output channels) whose output only a depthwise
FusedConv (no residual) reads becomes `epifuse::FusedPointwiseDepthwise`, the two convs in one node: inputs
X, W, B of the 1x1 conv and DW, DB of the depthwise one; the depthwise conv's attributes, and the 1x1 conv's
activation as `pointwise_activation` (and `pointwise_activation_params`). Where the depthwise conv is a
FusedConvMean (its output's squeeze-excite pool in its registers, passes/conv_mean.py), the pair is an
`epifuse::FusedPointwiseDepthwiseMean`, with FusedConvMean's second output M.

Why: the 1x1 conv writes its whole output (MobileNetV2's 16 -> 96 at 112x112: 4.8 MB, more than a core's
L2) and the depthwise conv reads it back, the two nodes each splitting the map between the threads. The
library's kernel (plugins/core/cpu_pointwise_depthwise.h) computes the pair in bands of rows instead, each
thread's 1x1 rows in a window that stays in its L2 while the depthwise conv reads them. In whole models on
two Zen 5 threads (`python bench/cpu_pairs.py`): MobileNetV2 1.06x, MobileNetV3-Large 1.01-1.03x the same
models with the pairs as two FusedConvs; on one thread 0.98-0.99x and 1.02x. So the pairs are made only where the
whole-model check will judge them, and it keeps them only where the model is not slower with them
(optimizer/pipeline.py, `_pairs_check`). 128 input channels is the reach of the 1x1 kernel the bands use
(plugins/core/pointwise_fused_conv.h): past it the pair would always run as the two convs, and is left as
two nodes; past 480 output channels (a compute-bound 1x1 conv on a 14x14 map: MobileNetV2's 96 -> 576,
EfficientNet's 112 -> 672) oneDNN's 1x1 kernel runs faster than the bands'. fp32: the bands have no bf16
kernel.

The other order, a depthwise FusedConv (no residual) whose output only a 1x1 FusedConv of the same reach
reads (MobileNetV1's separable convs; the first block of MobileNetV2, V3 and MNASNet; ShuffleNetV2's and
PP-LCNet's blocks), becomes `epifuse::FusedDepthwisePointwise`: inputs X, DW, DB of the depthwise conv, W, B
of the 1x1 conv and its residual Z where it has one; the depthwise conv's attributes, and the 1x1 conv's
activation and residual as `pointwise_activation` (`pointwise_activation_params`) and `pointwise_residual`.
The same bands, the other way round: each band's depthwise rows into the window, the 1x1 conv of the window.
Expand-first pairs are made first, so an inverted-residual block without a squeeze-excite pool keeps its
expand and depthwise conv together, and its project conv alone.

The merges are the last pass, after conv_mean; `split_pointwise_depthwise`, the first, writes a model
optimized before back as the two convs (FusedConv, or FusedConvMean) every other pass knows.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from .. import contract
from ..graph import attr_text, make_variable, shape_of
from ..report import Report
from .conv_mean import OP_TYPE as CONV_MEAN_OP_TYPE

OP_TYPE = "FusedPointwiseDepthwise"
MEAN_OP_TYPE = "FusedPointwiseDepthwiseMean"  # the depthwise conv a FusedConvMean
DEPTHWISE_FIRST_OP_TYPE = "FusedDepthwisePointwise"
PAIR_OP_TYPES = (OP_TYPE, MEAN_OP_TYPE, DEPTHWISE_FIRST_OP_TYPE)
MAX_POINTWISE_CHANNELS = 128  # PointwiseConv::kMaxChannels (plugins/core/pointwise_fused_conv.h)
# An expand to more channels is a compute-bound 1x1 conv on a small map (MobileNetV2's 96 -> 576, EfficientNet's
# 112 -> 672 at 14x14), where oneDNN's kernel runs faster than the bands' and the halo rows recomputed at the
# threads' boundaries cost more (0.8-0.97x the two convs in whole models on Zen 5).
MAX_EXPANDED_CHANNELS = 480
# FusedConv attributes of the node as a whole, which both convs carry
_SHARED = ("allow_tf32", "plugin_namespace", "plugin_version")


def _fused_conv(node: gs.Node | None, residual: bool = False, mean: bool = False) -> bool:
    """A FusedConv without a residual (or, where `residual`, with or without one; where `mean`, a FusedConvMean
    too)."""
    if node is None or node.domain != contract.DOMAIN:
        return False
    kind = (node.op == contract.OP_TYPE and len(node.outputs) == 1
            or mean and node.op == CONV_MEAN_OP_TYPE and len(node.outputs) == 2)
    return (kind and len(node.inputs) in ((3, 4) if residual else (3,))
            and (residual or attr_text(node, "residual", "none") == "none"))


def _pointwise(conv: gs.Node) -> bool:
    """1x1, stride 1, unpadded, one group, at most MAX_POINTWISE_CHANNELS input channels (shapes known)."""
    w = shape_of(conv.inputs[1])
    a = conv.attrs
    return (bool(w) and len(w) == 4 and w[1] == 1 and w[2] == 1 and isinstance(w[3], int)
            and w[3] <= MAX_POINTWISE_CHANNELS and int(a.get("group", 1)) == 1
            and list(a.get("strides", [1, 1])) == [1, 1] and not any(a.get("pads", [0, 0, 0, 0])))


def _depthwise(conv: gs.Node, channels) -> bool:
    """One input channel a group, as many groups as the 1x1 conv has output channels."""
    w = shape_of(conv.inputs[1])
    return (bool(w) and len(w) == 4 and w[3] == 1 and w[0] == channels and isinstance(channels, int)
            and int(conv.attrs.get("group", 1)) == channels)


def _pair_attrs(dw: gs.Node, pw: gs.Node) -> dict:
    """A pair's attributes: the depthwise conv's (no residual), and the 1x1 conv's activation and residual as
    `pointwise_activation`, `pointwise_activation_params` and `pointwise_residual` (where it has them)."""
    attrs = {k: v for k, v in dw.attrs.items() if k != "residual"}
    attrs["pointwise_activation"] = attr_text(pw, "activation", "identity")
    if pw.attrs.get("activation_params") is not None:
        attrs["pointwise_activation_params"] = pw.attrs["activation_params"]
    if attr_text(pw, "residual", "none") != "none":
        attrs["pointwise_residual"] = attr_text(pw, "residual", "none")
    return attrs


def pointwise_depthwise(graph: gs.Graph, report: Report, target: str, precision: str, *, expand_first: bool = True,
                        depthwise_first: bool = True) -> gs.Graph:
    """The pairs of either kind, where `expand_first` or `depthwise_first` allows it."""
    if target != "ort-cpu" or precision != "fp32":
        return graph
    outputs = {id(t) for t in graph.outputs}
    merged = False
    for dw in [n for n in graph.nodes if _fused_conv(n, mean=True)] if expand_first else []:
        mid = dw.inputs[0]
        pw = mid.inputs[0] if len(mid.inputs) == 1 else None
        if (not _fused_conv(pw) or len(mid.outputs) != 1 or id(mid) in outputs or not _pointwise(pw)
                or not isinstance(shape_of(pw.inputs[1])[0], int)
                or shape_of(pw.inputs[1])[0] > MAX_EXPANDED_CHANNELS
                or not _depthwise(dw, shape_of(pw.inputs[1])[0])):
            continue
        attrs = _pair_attrs(dw, pw)
        outs = list(dw.outputs)  # Y, and a FusedConvMean's M
        op = MEAN_OP_TYPE if len(outs) == 2 else OP_TYPE
        inputs = [pw.inputs[0], pw.inputs[1], pw.inputs[2], dw.inputs[1], dw.inputs[2]]
        dw.outputs.clear()
        pw.outputs.clear()  # both dead: cleanup drops them
        graph.nodes.append(gs.Node(op, dw.name, attrs, inputs, outs, domain=contract.DOMAIN))
        report.canonicalized[f"1x1 FusedConv + depthwise {dw.op} → epifuse::{op} ({target})"] += 1
        merged = True
    for dw in [n for n in graph.nodes if _fused_conv(n)] if depthwise_first else []:
        if not dw.outputs:  # merged above, or the 1x1 conv of a pair made in this loop
            continue
        mid = dw.outputs[0]
        pw = mid.outputs[0] if len(mid.outputs) == 1 else None
        w = shape_of(dw.inputs[1])
        if (not _fused_conv(pw, residual=True) or pw.inputs[0] is not mid or id(mid) in outputs
                or not _pointwise(pw) or not w or not _depthwise(dw, w[0])):
            continue
        attrs = _pair_attrs(dw, pw)
        y = pw.outputs[0]
        inputs = [dw.inputs[0], dw.inputs[1], dw.inputs[2], *pw.inputs[1:]]
        dw.outputs.clear()
        pw.outputs.clear()
        graph.nodes.append(gs.Node(DEPTHWISE_FIRST_OP_TYPE, pw.name, attrs, inputs, [y], domain=contract.DOMAIN))
        report.canonicalized[f"depthwise FusedConv + 1x1 FusedConv → epifuse::{DEPTHWISE_FIRST_OP_TYPE} "
                             f"({target})"] += 1
        merged = True
    if not merged:
        return graph
    graph.toposort()
    return graph.cleanup(remove_unused_graph_inputs=False)


def split_pointwise_depthwise(graph: gs.Graph, report: Report, op_types=PAIR_OP_TYPES) -> gs.Graph:
    """Each FusedPointwiseDepthwise and FusedDepthwisePointwise (of `op_types`) of a model optimized before as
    its two FusedConvs."""
    merged = [n for n in graph.nodes if n.op in op_types and n.domain == contract.DOMAIN]
    for node in merged:
        y = node.outputs[0]
        pw_attrs = {k: v for k, v in node.attrs.items() if k in _SHARED}
        pw_attrs.update(strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1,
                        residual=attr_text(node, "pointwise_residual", "none"),
                        activation=attr_text(node, "pointwise_activation", "identity"))
        if node.attrs.get("pointwise_activation_params") is not None:
            pw_attrs["activation_params"] = node.attrs["pointwise_activation_params"]
        dw_attrs = {k: v for k, v in node.attrs.items() if not k.startswith("pointwise_")}
        dw_attrs["residual"] = "none"
        inputs, outputs = list(node.inputs), list(node.outputs)
        node.outputs.clear()
        node.inputs.clear()
        if node.op != DEPTHWISE_FIRST_OP_TYPE:
            x, w, b, dw_w, dw_b = inputs
            mid = make_variable(graph, f"{x.name}_pointwise", dtype=y.dtype)
            first = gs.Node(contract.OP_TYPE, f"{node.name or 'conv'}_pointwise", pw_attrs, [x, w, b], [mid],
                            domain=contract.DOMAIN)
            second = gs.Node(CONV_MEAN_OP_TYPE if node.op == MEAN_OP_TYPE else contract.OP_TYPE, node.name, dw_attrs,
                             [mid, dw_w, dw_b], outputs, domain=contract.DOMAIN)
        else:
            x, dw_w, dw_b, w, b, *z = inputs
            mid = make_variable(graph, f"{x.name}_depthwise", dtype=y.dtype)
            first = gs.Node(contract.OP_TYPE, f"{node.name or 'conv'}_depthwise", dw_attrs, [x, dw_w, dw_b], [mid],
                            domain=contract.DOMAIN)
            second = gs.Node(contract.OP_TYPE, node.name, pw_attrs, [mid, w, b, *z], [y], domain=contract.DOMAIN)
        graph.nodes += [first, second]
        report.canonicalized[f"epifuse::{node.op} → FusedConv + FusedConv"] += 1
    if merged:
        graph.nodes = [n for n in graph.nodes if n.outputs]
        graph.toposort()
    return graph
