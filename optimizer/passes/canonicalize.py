"""Canonicalize: one spelling for things exporters write several ways, so the rewrites that
follow match one form. Every node gets a unique name. Constant nodes become initializers; Identity
nodes go (torch.onnx reads deduplicated weights through them, paddle2onnx writes one between each
conv and its activation); Conv auto_pad becomes explicit pads;
a constant per-channel Add right after a Conv becomes the Conv's bias. After shape_constants (whose
constants a Slice's bounds often are), a Concat of slices that tile a tensor in order reads the tensor
(concat_of_slices). Activation formulations
are recognised by optimizer.activations where they are fused."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import (attr_text, constant_value, make_constant, producer, replace_uses, set_inputs, set_outputs,
                     shape_of, split_sizes, unique_name)
from ..report import Report


def constants_to_initializers(graph: gs.Graph, report: Report) -> None:
    for node in graph.nodes:
        if node.op != "Constant" or len(node.outputs) != 1:
            continue
        value = constant_value(node.outputs[0])
        if value is None:
            continue  # value_float(s)/value_int(s) forms: left for ORT
        out = node.outputs[0]
        if any(o is out for o in graph.outputs):
            continue
        const = gs.Constant(out.name, np.asarray(value))
        replace_uses(graph, out, const)
        node.outputs.clear()
        report.canonicalized["Constant → initializer"] += 1


def identities(graph: gs.Graph, report: Report) -> None:
    """Identity nodes go, their consumers reading the input (ORT's IdentityElimination does the same at
    load time). torch.onnx writes deduplicated weights as Identity(initializer) (a ResNet-50 export reads
    47 of its conv biases so, and a bias that is not a constant does not fuse); paddle2onnx writes one
    after every conv's bias Add (PP-OCRv6 det: 147, each between a conv and its activation, which then
    did not fuse). One writing a graph output stays (the output keeps its name)."""
    for node in graph.nodes:
        if node.op != "Identity" or len(node.inputs) != 1 or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if any(o is out for o in graph.outputs):
            continue
        constant = isinstance(node.inputs[0], gs.Constant)
        replace_uses(graph, out, node.inputs[0])
        node.outputs.clear()
        report.canonicalized["Identity of a constant → the constant" if constant else "Identity → its input"] += 1


def _same_pads(size: int, kernel: int, stride: int, dilation: int, upper: bool) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def resolve_auto_pad(graph: gs.Graph, report: Report) -> None:
    for node in graph.nodes:
        mode = attr_text(node, "auto_pad", "NOTSET")
        if node.op != "Conv" or mode == "NOTSET":
            continue
        w = constant_value(node.inputs[1])
        x_shape = shape_of(node.inputs[0])
        if w is None or w.ndim != 4:
            report.skip(node, f"auto_pad={mode} left as is: filter is not a constant 4-D tensor")
            continue
        strides = node.attrs.get("strides", [1, 1])
        dilations = node.attrs.get("dilations", [1, 1])
        if mode == "VALID":
            pads = [0, 0, 0, 0]
        else:
            spatial = x_shape[2:] if x_shape and len(x_shape) == 4 else [None, None]
            if any(not isinstance(s, int) for s in spatial) and any(s != 1 for s in strides):
                report.skip(node, f"auto_pad={mode} left as is: input size unknown with stride > 1")
                continue
            begin_end = [_same_pads(s if isinstance(s, int) else 1, k, st, d, mode == "SAME_UPPER")
                         for s, k, st, d in zip(spatial, w.shape[2:], strides, dilations)]
            pads = [begin_end[0][0], begin_end[1][0], begin_end[0][1], begin_end[1][1]]
        node.attrs.pop("auto_pad")
        node.attrs["pads"] = pads
        report.canonicalized["auto_pad → pads"] += 1


def bias_add_into_conv(graph: gs.Graph, report: Report) -> None:
    """Conv → Add(per-output-channel constant) becomes Conv with that bias (what TF/Keras exports do)."""
    for add in graph.nodes:
        if add.op != "Add" or len(add.inputs) != 2:
            continue
        for y, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            conv = producer(y)
            if conv is None or conv.op != "Conv" or len(y.outputs) != 1 or y in graph.outputs:
                continue
            w, bias = constant_value(conv.inputs[1]), constant_value(c)
            if w is None or bias is None or w.ndim != 4:
                continue
            k = w.shape[0]
            if bias.size != k or bias.shape not in ((1, k, 1, 1), (k, 1, 1)) or bias.dtype != w.dtype:
                continue
            has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
            old = constant_value(conv.inputs[2]) if has_bias else None
            if has_bias and old is None:
                continue  # a bias computed at run time cannot absorb the constant
            new_bias = bias.reshape(k) + (old if old is not None else 0)
            b = make_constant(graph, f"{conv.name}_bias", new_bias.astype(w.dtype))
            set_inputs(conv, [conv.inputs[0], conv.inputs[1], b])
            out = add.outputs[0]
            add.outputs.clear()
            set_outputs(conv, [out])
            report.canonicalized["bias Add → Conv bias"] += 1
            break


_END = 2**31 - 1  # a Slice end at or past this means "to the end" (exporters write INT64_MAX or INT32_MAX)


def _piece_of(t: gs.Tensor) -> tuple[gs.Tensor, int, int, int] | None:
    """(source, axis, start, end) where `t` is a unit-step slice of one axis of a tensor: a Slice with constant
    starts, ends and axes, or one output of a Split with known sizes. Axis as written (maybe negative);
    end may be _END or more (to the end). Else None."""
    node = producer(t)
    if node is None or node.domain not in (None, "", "ai.onnx") or not node.inputs:
        return None
    if node.op == "Slice" and len(node.inputs) >= 3:
        starts, ends = constant_value(node.inputs[1]), constant_value(node.inputs[2])
        axes = constant_value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else np.array([0])
        steps = constant_value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.array([1])
        if any(v is None or v.size != 1 for v in (starts, ends, axes, steps)) or int(steps.reshape(())) != 1:
            return None
        start, end = int(starts.reshape(())), int(ends.reshape(()))
        return (node.inputs[0], int(axes.reshape(())), start, end) if start >= 0 and end > start else None
    if node.op == "Split":
        shape = shape_of(node.inputs[0])
        axis = int(node.attrs.get("axis", 0))
        sizes = split_sizes(node, shape[axis] if shape and -len(shape) <= axis < len(shape) else None)
        if sizes is None or len(sizes) != len(node.outputs):
            return None
        index = next(i for i, o in enumerate(node.outputs) if o is t)
        start = int(np.sum(sizes[:index]))
        return node.inputs[0], axis, start, start + int(sizes[index])
    return None


def concat_of_slices(graph: gs.Graph, report: Report) -> gs.Graph:
    """Concat(..., x[a:b], x[b:c], ..., ...) along x's sliced axis, where the run of inputs tiles x in order
    from 0 to its end, reads x instead (the C2f blocks of YOLOv8 and YOLO11 concatenate both halves of
    the chunk they split). The slice nobody reads any more goes; the one the bottleneck reads stays."""
    for node in graph.nodes:
        if node.op != "Concat" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) < 2:
            continue
        axis = int(node.attrs.get("axis", 0))
        inputs, changed, i = list(node.inputs), False, 0
        while i < len(inputs):
            piece = _piece_of(inputs[i])
            if piece is None or piece[2] != 0:
                i += 1
                continue
            source, piece_axis, _, end = piece
            shape = shape_of(source)
            rank = len(shape) if shape else None
            if rank is None or piece_axis % rank != axis % rank:
                i += 1
                continue
            dim = shape[axis % rank]
            j = i + 1
            while end < _END and not (isinstance(dim, int) and end >= dim) and j < len(inputs):
                nxt = _piece_of(inputs[j])
                if nxt is None or nxt[0] is not source or nxt[1] % rank != axis % rank or nxt[2] != end:
                    break
                end, j = nxt[3], j + 1
            if end >= _END or (isinstance(dim, int) and end >= dim):
                inputs[i:j] = [source]
                changed = True
                report.canonicalized["Concat of slices that tile a tensor → the tensor"] += 1
            i += 1
        if changed:
            set_inputs(node, inputs)
            if len(inputs) == 1:  # the whole tensor: its readers read it
                replace_uses(graph, node.outputs[0], inputs[0])
                node.outputs.clear()
    return graph.cleanup(remove_unused_graph_inputs=False)


def name_nodes(graph: gs.Graph, report: Report) -> None:
    """Every node gets a name of its own (ONNX makes names optional): the report, the fusion decisions
    and the whole-model check's variants refer to candidates by their node's name."""
    seen: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if not node.name or node.name in seen:
            node.name = unique_name(graph, f"{node.op}_{i}")
            report.canonicalized["unnamed or duplicate node name → unique name"] += 1
        seen.add(node.name)


def canonicalize(graph: gs.Graph, report: Report) -> gs.Graph:
    name_nodes(graph, report)
    constants_to_initializers(graph, report)
    identities(graph, report)
    resolve_auto_pad(graph, report)
    bias_add_into_conv(graph, report)
    return graph.cleanup(remove_unused_graph_inputs=False)
