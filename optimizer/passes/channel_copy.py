"""Channel copies on ort-cpu: in a channels-last region, a Concat along the last axis of 4-D X_i [N, H, W, C_i]
becomes `epifuse::ChannelConcat`, and a Split or a unit-step Slice along it becomes one
`epifuse::ChannelSlice` (attributes `start`, `end`) an output: the forms the layout pass gives a YOLO C2f
or CSP block's chunk and concat, an FPN's concat.

Why: ONNX Runtime's CPU kernels copy such a tensor a pixel's few channels at a time through their generic
strided copy. Its Concat takes 1.3-2.2x the time of the original model's NCHW Concat of the same tensors
(whole planes a copy): on a 2-core Xeon, 3 x 1x160x160x16 took 350 µs against 188 in NCHW; its Slice of
half the channels of a 1x160x160x32 tensor costs about what its Split of all of them does. The library's
kernels (plugins/core/channel_copy.cc) copy each pixel's rows with vector loads and stores: the concat
186 µs there, as fast as the NCHW form on YOLO's and CSPDarknet's shapes (`python bench/cpu_layout.py`
has the tables), bit-exact (they only move data). On ort-cpu in fp32 and bf16 (the kernels copy 2- and
4-byte elements; the precision pass makes the ops bf16 where their data is); for any other target or
precision the ops go back to a Concat and Slices.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract
from ..graph import (constant_value, ensure_domain, inferred_types, make_constant, set_inputs, shape_of, split_sizes,
                     unique_name)
from ..report import Report

OP_TYPE = "ChannelConcat"
SLICE_OP = "ChannelSlice"


def _float_nhwc(t: gs.Tensor, types: dict) -> list | None:
    """The shape of `t` where it is a float32 4-D tensor computed by the graph, else None. `types`: each
    tensor's (dtype, shape), inferred (the layout pass leaves its tensors untyped)."""
    if isinstance(t, gs.Constant) or not t.name:  # constants stay ORT's (the precision pass keeps them float)
        return None
    dtype, shape = types.get(t.name, (t.dtype, shape_of(t)))
    return shape if dtype is not None and np.dtype(dtype) == np.float32 and shape and len(shape) == 4 else None


def _last_axis(axis: int) -> bool:
    return axis in (3, -1)


def _channel_concat(node: gs.Node, types: dict) -> bool:
    """Whether `node` is a Concat along the last axis of two or more float32 4-D tensors computed by the graph."""
    if node.op != "Concat" or node.domain not in (None, "", "ai.onnx") or len(node.outputs) != 1:
        return False
    if len(node.inputs) < 2 or not _last_axis(int(node.attrs.get("axis", 0))):
        return False
    return all(_float_nhwc(x, types) is not None for x in node.inputs)


def _slice_range(node: gs.Node, types: dict) -> tuple[int, int] | None:
    """(start, end) of channels where `node` is a unit-step Slice of the last axis of a float32 4-D tensor of
    known C with constant bounds, end clamped to C (as Slice clamps it), at least one channel; else None."""
    if node.op != "Slice" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) < 4:
        return None
    shape = _float_nhwc(node.inputs[0], types)
    values = [constant_value(t) if t.name else None for t in node.inputs[1:4]]
    steps = constant_value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.array([1])
    if shape is None or not isinstance(shape[3], int):
        return None
    if any(v is None or v.size != 1 for v in values) or steps is None or steps.size != 1:
        return None
    start, end, axis = (int(v.reshape(())) for v in values)
    end = min(end, shape[3])
    if int(steps.reshape(())) != 1 or not _last_axis(axis) or start < 0 or end <= start:
        return None
    return start, end


def _split_ranges(node: gs.Node, types: dict) -> list[tuple[int, int]] | None:
    """Each output's (start, end) of channels where `node` is a Split of the last axis of a float32 4-D tensor
    of known C into constant sizes, else None."""
    if node.op != "Split" or node.domain not in (None, "", "ai.onnx") or not node.inputs:
        return None
    shape = _float_nhwc(node.inputs[0], types)
    if shape is None or not isinstance(shape[3], int) or not _last_axis(int(node.attrs.get("axis", 0))):
        return None
    sizes = split_sizes(node, shape[3])  # None where computed at run time: left to ORT
    if sizes is None or len(sizes) != len(node.outputs) or sizes.min() <= 0 or int(sizes.sum()) != shape[3]:
        return None
    ends = np.cumsum(sizes)
    return [(int(e - v), int(e)) for v, e in zip(sizes, ends)]


def as_slice(graph: gs.Graph, node: gs.Node) -> None:
    """Writes the op `node` (a ChannelSlice) back as the standard Slice of the last axis."""
    start, end = int(node.attrs["start"]), int(node.attrs["end"])
    bounds = [make_constant(graph, f"{node.name or 'slice'}_{what}", np.array([v], np.int64))
              for what, v in (("starts", start), ("ends", end), ("axes", 3))]
    node.op, node.domain, node.attrs = "Slice", "", {}
    set_inputs(node, [node.inputs[0], *bounds])


def channel_copy(graph: gs.Graph, report: Report, target: str, precision: str) -> gs.Graph:
    if target != "ort-cpu" or precision not in ("fp32", "bf16"):
        for node in graph.nodes:  # a model optimized for ort-cpu before: the ops are that library's alone
            if node.domain != contract.DOMAIN or node.op not in (OP_TYPE, SLICE_OP):
                continue
            report.canonicalized[f"epifuse::{node.op} → {node.op[len('Channel'):]} ({target}, {precision})"] += 1
            if node.op == OP_TYPE:
                node.op, node.domain, node.attrs = "Concat", "", {"axis": 3}
            else:
                as_slice(graph, node)
        return graph
    candidates = [n for n in graph.nodes if n.op in ("Concat", "Slice", "Split")]
    if not candidates:
        return graph
    types = inferred_types(graph)
    for node in candidates:
        if _channel_concat(node, types):
            node.op, node.domain, node.attrs = OP_TYPE, contract.DOMAIN, {}
            report.canonicalized[f"channels-last Concat → epifuse::{OP_TYPE} ({target})"] += 1
        elif (channels := _slice_range(node, types)) is not None:
            node.op, node.domain = SLICE_OP, contract.DOMAIN
            node.attrs = {"start": channels[0], "end": channels[1]}
            set_inputs(node, node.inputs[:1])
            report.canonicalized[f"channels-last Slice → epifuse::{SLICE_OP} ({target})"] += 1
        elif (ranges := _split_ranges(node, types)) is not None:
            x, outputs = node.inputs[0], list(node.outputs)
            node.outputs.clear()
            node.inputs.clear()
            for i, (out, (start, end)) in enumerate(zip(outputs, ranges)):
                graph.nodes.append(gs.Node(SLICE_OP, unique_name(graph, f"{node.name}_{i}"),
                                           {"start": start, "end": end}, [x], [out], domain=contract.DOMAIN))
            report.canonicalized[f"channels-last Split → epifuse::{SLICE_OP} an output ({target})"] += 1
        else:
            continue
        ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
    graph.cleanup(remove_unused_graph_inputs=False)
    graph.toposort()
    return graph
