"""Layout: keep regions of FusedConv (NHWC) and the layout-agnostic ops between them in NHWC,
with Transposes only where a region meets an op that needs NCHW or a graph input/output.

The fuse pass wraps every FusedConv in Transposes. Here they are pushed down through
layout-agnostic ops (elementwise ops with their broadcast constants permuted, Concat, Split,
Slice, Pad, nearest Resize, reductions, GlobalAverage/MaxPool as a ReduceMean/Max over H and W:
one table, HANDLERS, says which ops and how) and pairs that compose to the identity cancel. With
`spatial_means` (ort-cpu, where channel_mean makes it the library's ChannelMean), a ReduceMean over H
and W that drops those axes (x.mean([2, 3]) to [N, C], MNASNet's and ShuffleNetV2's head) ends the
region: its output is the same tensor in either frame, and no Transpose goes before it. Elsewhere it
stays in NCHW behind its Transpose, as ONNX Runtime's reductions over the middle axes are strided
loops (and no GPU measurement has weighed the other form). Pushing
can cost a Transpose where a tensor also feeds an NCHW-only op, so two policies run on copies of the
graph — push only where it does not add a Transpose, and push wherever possible — and the result
with fewer Transposes is kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import (add_transpose, axes_of, constant_value, make_constant, make_variable, producer, replace_uses,
                     set_inputs, set_outputs, shape_of)
from ..report import Report

ELEMENTWISE = {
    "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "Softplus", "Softsign", "HardSigmoid",
    "HardSwish", "Mish", "Gelu", "Erf", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Identity", "Cast", "Not", "IsNaN", "IsInf",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where", "Equal", "Greater",
    "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod", "BitShift",
}
REDUCTIONS = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}


@dataclass(frozen=True)
class Handler:
    """How a Transpose moves through one op (ORT's transpose optimizer keeps the same kind of table):
    the inputs that carry sizes or indices rather than data (never transposed), and the rewrite of its
    axis-valued attributes and inputs into the NHWC frame, which returns False where it cannot."""

    params: frozenset = frozenset()
    rewrite: Callable | None = None  # (pusher, node, perm) -> bool


def _perm(node: gs.Node) -> tuple[int, ...] | None:
    p = node.attrs.get("perm")
    return tuple(int(v) for v in p) if p is not None else None


def _inverse(p):
    inv = [0] * len(p)
    for i, v in enumerate(p):
        inv[v] = i
    return tuple(inv)


def _transpose_source(t: gs.Tensor) -> tuple[gs.Node, tuple[int, ...]] | None:
    node = producer(t)
    if node is not None and node.op == "Transpose" and _perm(node) is not None:
        return node, _perm(node)
    return None


def merge_transposes(graph: gs.Graph, t2: gs.Node) -> bool:
    """Transpose(Transpose(x)) becomes one Transpose, or x itself when the perms cancel."""
    src = _transpose_source(t2.inputs[0])
    p2 = _perm(t2)
    if p2 is not None and p2 == tuple(range(len(p2))):
        _bypass(graph, t2)
        return True
    if src is None:
        return False
    t1, p1 = src
    if len(p1) != len(p2):
        return False
    combined = tuple(p1[i] for i in p2)
    x = t1.inputs[0]
    if combined == tuple(range(len(combined))):
        _bypass(graph, t2, x)
    else:
        t2.attrs["perm"] = list(combined)
        set_inputs(t2, [x])
    return True


def _bypass(graph: gs.Graph, t: gs.Node, source: gs.Tensor | None = None) -> None:
    """Removes Transpose `t`; its readers read `source` (default: its own input)."""
    source = source if source is not None else t.inputs[0]
    out = t.outputs[0]
    t.inputs.clear()
    t.outputs.clear()
    replace_uses(graph, out, source)


def moves_only_unit_dims(t: gs.Node) -> bool:
    """A Transpose that keeps the order of every dim larger than 1 does not move memory."""
    shape = shape_of(t.inputs[0])
    perm = _perm(t)
    if shape is None or perm is None or len(shape) != len(perm):
        return False
    kept = [i for i in perm if shape[i] != 1]  # symbolic dims count as larger than 1
    return kept == sorted(kept)


def _flatten_keeps_shape(node: gs.Node, perm) -> bool:
    """Flatten(axis) gives [prod(dims before axis), prod(the rest)]: the same for the transposed input
    only when no dim crosses the axis, i.e. axis 0, the rank, or 1 with the batch dim staying first."""
    rank = len(perm)
    axis = int(node.attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    return axis in (0, rank) or (axis == 1 and perm[0] == 0)


def drop_before_reshape(graph: gs.Graph, t: gs.Node) -> bool:
    """Flatten/Reshape read memory order only, so a Transpose that moves no memory can go."""
    out = t.outputs[0]
    if not out.outputs or out in graph.outputs or not moves_only_unit_dims(t):
        return False
    if not all(c.inputs[0] is out and (
            c.op == "Flatten" and _flatten_keeps_shape(c, _perm(t)) or
            c.op == "Reshape" and constant_value(c.inputs[1]) is not None and 0 not in constant_value(c.inputs[1]))
               for c in out.outputs):
        return False
    _bypass(graph, t)
    return True


def fold_into_reshape(graph: gs.Graph, t: gs.Node) -> bool:
    """A Transpose that moves no memory after a Reshape only read by it: the Reshape takes the
    transposed shape and the Transpose goes (fc_as_conv's [N, C, 1, 1] image entering an NHWC region)."""
    src = t.inputs[0]
    reshape = src.inputs[0] if len(src.inputs) == 1 else None
    if reshape is None or reshape.op != "Reshape" or len(src.outputs) != 1 or src in graph.outputs or \
            not moves_only_unit_dims(t):
        return False
    shape, perm = constant_value(reshape.inputs[1]), _perm(t)
    if shape is None or len(shape) != len(perm) or any(v == 0 and perm[i] != i for i, v in enumerate(shape)):
        return False  # a 0 (copy the input's dim) must stay where it is
    new_shape = make_constant(graph, f"{reshape.name}_shape", np.array([shape[i] for i in perm], np.int64))
    out = t.outputs[0]
    src.shape = out.shape
    set_inputs(reshape, [reshape.inputs[0], new_shape])
    _bypass(graph, t)
    return True


def _axis(a: int, rank: int, p) -> int:
    return p[a + rank if a < 0 else a]


class _Pusher:
    def __init__(self, graph: gs.Graph, greedy: bool, spatial_means: bool):
        self.graph, self.greedy, self.spatial_means = graph, greedy, spatial_means

    def data_inputs(self, node: gs.Node) -> list[int]:
        params = HANDLERS[node.op].params
        return [i for i, t in enumerate(node.inputs) if i not in params and t.name]

    def plan(self, node: gs.Node):
        """Returns the perm p when every data input is Transpose(p) output or a constant."""
        if node.op not in HANDLERS:
            return None
        perm, moved = None, []
        for i in self.data_inputs(node):
            t = node.inputs[i]
            src = _transpose_source(t)
            if src is not None and len(src[1]) == 4:
                if perm is not None and src[1] != perm:
                    return None
                perm = src[1]
                moved.append(i)
            elif constant_value(t) is None or constant_value(t).ndim > 4:
                return None  # a constant of rank 5 broadcasts the output out of 4-D
        if perm is None:
            return None
        if not self.greedy and self.cost(node, perm, moved) > 0:
            return None
        return perm, moved

    def cost(self, node: gs.Node, p, moved) -> int:
        inv = _inverse(p)

        def cancels(consumer):
            return consumer.op == "Transpose" and _perm(consumer) == inv

        added = 0 if drops_axes(node) else \
            sum(1 for o in node.outputs if not o.outputs or not all(cancels(c) for c in o.outputs))
        freed = sum(1 for i in moved if all(c is node or cancels(c) for c in node.inputs[i].outputs))
        return added - freed

    def push(self, node: gs.Node) -> bool:
        planned = self.plan(node)
        if planned is None:
            return False
        p, moved = planned
        if not self.rewrite_params(node, p):
            return False
        inv = _inverse(p)
        new_inputs = list(node.inputs)
        for i in self.data_inputs(node):
            t = node.inputs[i]
            if i in moved:
                new_inputs[i] = _transpose_source(t)[0].inputs[0]
            else:
                c = constant_value(t)
                if c.size > 1:
                    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape) if c.ndim < 4 else c
                    new_inputs[i] = make_constant(self.graph, f"{t.name}_nhwc", np.transpose(c4, inv))
        set_inputs(node, new_inputs)
        if drops_axes(node):  # its output is the same in either frame
            return True
        outs = list(node.outputs)
        new_outs = []
        for o in outs:
            s = shape_of(o)
            new_outs.append(make_variable(self.graph, f"{o.name}_nhwc", o.dtype,
                                          [s[i] for i in inv] if s and len(s) == 4 else None))
        node.outputs.clear()
        set_outputs(node, new_outs)
        for o, n in zip(outs, new_outs):
            add_transpose(self.graph, n, p, f"{o.name}_nchw", out=o)
        return True

    def rewrite_params(self, node: gs.Node, p) -> bool:
        """Moves axis-valued attributes and inputs into the NHWC frame; False where it cannot."""
        rewrite = HANDLERS[node.op].rewrite
        return rewrite is None or rewrite(self, node, p)

    def set_axes(self, node: gs.Node, axes) -> None:
        axes_as_input = self.graph.opset >= 18 or (node.op == "ReduceSum" and self.graph.opset >= 13)
        if axes_as_input:
            node.attrs.pop("axes", None)
            const = make_constant(self.graph, f"{node.name}_axes_nhwc", np.array(sorted(axes), np.int64))
            set_inputs(node, [node.inputs[0], const])
        else:
            node.attrs["axes"] = sorted(int(a) for a in axes)


def _axis_attribute(pusher: _Pusher, node: gs.Node, p) -> bool:
    node.attrs["axis"] = _axis(int(node.attrs.get("axis", 0)), 4, p)
    return True


def _slice(pusher: _Pusher, node: gs.Node, p) -> bool:
    starts = constant_value(node.inputs[1])
    axes = axes_of(node, 3)
    if starts is None or (axes is None and len(node.inputs) > 3 and node.inputs[3].name):
        return False
    axes = np.arange(starts.size) if axes is None else axes
    new_axes = make_constant(pusher.graph, f"{node.name}_axes_nhwc",
                             np.array([_axis(int(a), 4, p) for a in axes], np.int64))
    inputs = list(node.inputs) + [gs.Variable.empty()] * (4 - len(node.inputs))
    inputs[3] = new_axes
    set_inputs(node, inputs)
    return True


def _pad(pusher: _Pusher, node: gs.Node, p) -> bool:
    pads = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if pads is None or pads.size != 8 or (len(node.inputs) > 3 and node.inputs[3].name):
        return False
    new = np.zeros(8, np.int64)
    for i in range(4):
        new[p[i]], new[4 + p[i]] = pads[i], pads[4 + i]
    set_inputs(node, [node.inputs[0], make_constant(pusher.graph, f"{node.name}_pads_nhwc", new), *node.inputs[2:]])
    return True


def _resize(pusher: _Pusher, node: gs.Node, p) -> bool:
    mode = node.attrs.get("mode", "nearest")
    if mode not in ("nearest", b"nearest") or "axes" in node.attrs:
        return False
    inputs = list(node.inputs)
    if len(inputs) > 1 and inputs[1].name and (constant_value(inputs[1]) is None or constant_value(inputs[1]).size):
        return False  # a roi computed at run time, or a non-empty one
    for idx in (2, 3):
        if len(inputs) > idx and inputs[idx].name:
            v = constant_value(inputs[idx])
            if v is None:
                return False  # sizes or scales computed at run time are in NCHW order
            if v.size == 0:
                continue
            if v.size != 4:
                return False
            new = np.empty_like(v)
            for i in range(4):
                new[p[i]] = v[i]
            inputs[idx] = make_constant(pusher.graph, f"{node.name}_{'scales' if idx == 2 else 'sizes'}_nhwc", new)
    set_inputs(node, inputs)
    return True


def drops_axes(node: gs.Node) -> bool:
    """A reduction whose output lacks the axes it reduced (keepdims 0)."""
    return node.op in REDUCTIONS and not int(node.attrs.get("keepdims", 1))


def _reduction(pusher: _Pusher, node: gs.Node, p) -> bool:
    axes = axes_of(node, 1)
    if axes is None:
        return False  # all axes: left as it is
    axes = [int(a) % 4 for a in axes]
    moved = sorted(_axis(a, 4, p) for a in axes)
    if drops_axes(node):
        kept = [_axis(a, 4, p) for a in range(4) if a not in axes]
        if not (pusher.spatial_means and node.op == "ReduceMean" and moved == [1, 2] and kept == sorted(kept)):
            return False  # left in NCHW: only a mean over H and W to [N, C] becomes ChannelMean
    pusher.set_axes(node, moved)
    return True


def _global_pool(pusher: _Pusher, node: gs.Node, p) -> bool:
    node.op = GLOBAL_POOLS[node.op]
    node.attrs = {"keepdims": 1}
    pusher.set_axes(node, [p[2], p[3]])
    return True


# Every op a Transpose moves through, and how.
HANDLERS: dict[str, Handler] = {
    **{op: Handler() for op in ELEMENTWISE},
    "Clip": Handler(params=frozenset({1, 2})),
    "Concat": Handler(rewrite=_axis_attribute),
    "Split": Handler(params=frozenset({1}), rewrite=_axis_attribute),
    "Slice": Handler(params=frozenset({1, 2, 3, 4}), rewrite=_slice),
    "Pad": Handler(params=frozenset({1, 2, 3}), rewrite=_pad),
    "Resize": Handler(params=frozenset({1, 2, 3}), rewrite=_resize),
    **{op: Handler(params=frozenset({1}), rewrite=_reduction) for op in REDUCTIONS},
    **{op: Handler(rewrite=_global_pool) for op in GLOBAL_POOLS},
}


def variable_data_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The inputs of a HANDLERS op that a Transpose moves through and that are not constants."""
    params = HANDLERS[node.op].params
    return [t for i, t in enumerate(node.inputs) if i not in params and t.name and constant_value(t) is None]


def _count_transposes(graph: gs.Graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "Transpose")


def _run(graph: gs.Graph, greedy: bool, spatial_means: bool) -> gs.Graph:
    pusher = _Pusher(graph, greedy, spatial_means)
    for _ in range(1000):
        changed = False
        graph.toposort()
        for node in list(graph.nodes):
            if not node.outputs:
                continue
            if node.op == "Transpose":
                changed |= merge_transposes(graph, node) or drop_before_reshape(graph, node) or \
                    fold_into_reshape(graph, node)
            else:
                changed |= pusher.push(node)
        graph.cleanup(remove_unused_graph_inputs=False)
        if not changed:
            break
    return graph


def layout(graph: gs.Graph, report: Report, spatial_means: bool = False) -> gs.Graph:
    """`spatial_means`: end regions at a ReduceMean over H and W that drops them (see above)."""
    before = _count_transposes(graph)
    results = [_run(graph.copy(), greedy, spatial_means) for greedy in (False, True)]
    best = min(results, key=_count_transposes)
    report.transposes_removed += before - _count_transposes(best)
    return best.toposort()
