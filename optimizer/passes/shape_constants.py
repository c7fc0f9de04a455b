"""Shape arithmetic to constants: exporters compute Reshape and Slice arguments at run time from Shape
ops (torch.onnx writes `x.view(b, g, c // g, h, w)` as Shape → Gather → Div → Unsqueeze → Concat →
Reshape), even where every value but the batch size is fixed by the model's input shape. ONNX Runtime
runs such integer nodes on the CPU: on the CUDA EP each one costs a copy between host and device and
keeps the model from running as a CUDA graph (ShuffleNetV2's channel shuffles: 87 copies), and on
every target the Shape readers of a conv's output keep it from fusing with what follows.

Here those values are evaluated from the shapes shape inference knows, element by element: an
element is a number, a symbolic dimension (the batch) or unknown. A tensor whose elements are all
numbers becomes a constant of those numbers. A Reshape shape that still holds symbolic dimensions
becomes one where each of them is the data's own dimension at the same position (0: "copy it", with
allowzero 0), or where a single one is left for Reshape to infer (-1). Anything else stays as it is;
the values are the ones the nodes would compute for every input the model's declared shape admits.

What such numbers feed next in floating point (timm's TensorFlow "same" padding: Shape → Gather → Cast
→ Div → Ceil → Mul → Sub → Clip → ... → Pad) is folded by onnx-graphsurgeon's fold_constants, which
runs the nodes whose inputs are all constants through ONNX Runtime, as the runtime's own constant
folding would at session start, for outputs of at most SMALL_CONSTANT_BYTES: the shapes after the Pad
are then known, and the convs behind it can be measured."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph import constant_value, infer_shapes_again, light_copy, make_constant, replace_uses, set_inputs, shape_of
from ..report import Report

Element = int | str | None  # a number, a symbolic dimension's name, unknown
Value = tuple[list[Element], bool]  # the elements, and whether the tensor is a scalar (0-D)

INTEGER_TYPES = {np.dtype(np.int64), np.dtype(np.int32)}


def _constant(t: gs.Tensor) -> Value | None:
    v = constant_value(t)
    if v is None or v.dtype not in INTEGER_TYPES or v.ndim > 1:
        return None
    return [int(x) for x in v.reshape(-1)], v.ndim == 0


def _arithmetic(op: str, a: Element, b: Element) -> Element:
    if not isinstance(a, int) or not isinstance(b, int):
        return None  # a symbolic dimension in arithmetic: unknown (no algebra on symbols here)
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if b == 0:
        return None
    q = abs(a) // abs(b)  # ONNX integer Div truncates toward zero
    return q if (a >= 0) == (b >= 0) else -q


def _ambiguous_symbols(graph: gs.Graph) -> set[str]:
    """Symbolic dimensions named more than once in one graph input ([N, 3, "s", "s"]): ONNX Runtime does
    not hold the caller to feeding equal sizes there, so the name does not say which size it is."""
    ambiguous = set()
    for t in graph.inputs:
        names = [d for d in (shape_of(t) or []) if isinstance(d, str)]
        ambiguous |= {d for d in names if names.count(d) > 1}
    return ambiguous


def _evaluate(node: gs.Node, values: dict[str, Value], ambiguous: set[str]) -> Value | None:
    """The node's output as elements, or None where this pass does not model it."""
    def value(t: gs.Tensor) -> Value | None:
        return values.get(t.name) or _constant(t)

    a = node.attrs
    if node.op == "Shape":
        shape = shape_of(node.inputs[0])
        if shape is None:
            return None
        elements = [d if isinstance(d, int) and d >= 0 or isinstance(d, str) and d and d not in ambiguous else None
                    for d in shape]
        start, end = int(a.get("start", 0)), a.get("end")
        return elements[start:None if end is None else int(end)], False
    ins = [value(t) for t in node.inputs if t.name]
    if not ins or any(v is None for v in ins):
        return None
    (first, scalar) = ins[0]
    if node.op == "Identity" or node.op == "Cast" and int(a["to"]) in (onnx.TensorProto.INT64,
                                                                       onnx.TensorProto.INT32):
        return first, scalar
    if node.op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
        (second, scalar2) = ins[1]
        if len(first) != len(second) and 1 not in (len(first), len(second)):
            return None
        n = max(len(first), len(second))
        pairs = zip(first * n if len(first) == 1 else first, second * n if len(second) == 1 else second)
        return [_arithmetic(node.op, x, y) for x, y in pairs], scalar and scalar2
    if node.op == "Gather" and int(a.get("axis", 0)) == 0 and not scalar and len(ins) == 2:
        (indices, index_scalar) = ins[1]
        if any(not isinstance(i, int) or not -len(first) <= i < len(first) for i in indices):
            return None
        return [first[i] for i in indices], index_scalar
    if node.op == "Unsqueeze" and scalar:
        return first, False
    if node.op == "Squeeze" and not scalar and len(first) == 1:
        return first, True
    if node.op == "Concat" and int(a.get("axis", 0)) in (0, -1) and not any(s for _, s in ins):
        return [e for elements, _ in ins for e in elements], False
    if node.op == "Slice" and not scalar and 3 <= len(ins) <= 5:
        starts, ends = ins[1][0], ins[2][0]
        axes = ins[3][0] if len(ins) > 3 else [0]
        steps = ins[4][0] if len(ins) > 4 else [1]
        if len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or len(steps) != 1 \
                or not all(isinstance(x, int) for x in (*starts, *ends, *steps)) or steps[0] <= 0:
            return None  # reversing Slices not modelled: their clamping rules are not checked against Python's
        return first[slice(starts[0], ends[0], steps[0])], False
    return None


def _reshape_shape(node: gs.Node, elements: list[Element]) -> list[int] | None:
    """A constant shape that does what the computed `elements` do for `node` (a Reshape), or None."""
    if any(e is None for e in elements) or int(node.attrs.get("allowzero", 0)) != 0:
        return None
    data = shape_of(node.inputs[0]) or []
    shape, left = [], []
    for i, e in enumerate(elements):
        if isinstance(e, int):
            shape.append(e)
        elif i < len(data) and data[i] == e:
            shape.append(0)  # the data's own dimension at this position
        else:
            shape.append(-1)
            left.append(i)
    numbers = [e for e in elements if isinstance(e, int)]
    if len(left) > 1 or left and (-1 in numbers or 0 in numbers):
        return None  # Reshape infers one dimension at most, from the others' product
    return shape


ROUNDS = 64  # shape inference again after each round: one more block of a chain of Reshapes per round
SMALL_CONSTANT_BYTES = 1024  # shape-sized: the folding never copies or rewrites a model's weights


def _fold_small_constants(graph: gs.Graph, report: Report) -> None:
    """Nodes whose inputs are all constants, their small outputs computed once (see the module's text)."""
    def computing() -> int:  # nodes that compute (a Constant node becomes a constant tensor as it is)
        return sum(n.op != "Constant" for n in graph.nodes)

    outputs = {t.name for t in graph.outputs}  # by name: the nodes asked about are a copy's

    def left_alone(node: gs.Node) -> bool:
        """Weights are never read, let alone computed on, here; an op of another domain is left out (ONNX
        Runtime may not know it, and one failure would leave the whole evaluation unfolded); a graph
        output keeps the node that writes it."""
        def large(t: gs.Tensor) -> bool:
            return isinstance(t, gs.Constant) and (t.shape is None or t.dtype is None or int(np.prod(t.shape))
                                                   * np.dtype(t.dtype).itemsize > SMALL_CONSTANT_BYTES)

        return (node.domain not in (None, "", "ai.onnx") or any(t.name in outputs for t in node.outputs)
                or any(large(t) for t in node.inputs))

    before = computing()
    graph.fold_constants(fold_shapes=False, recurse_subgraphs=False, flatten_subgraphs=False,
                         size_threshold=SMALL_CONSTANT_BYTES, should_exclude_node=left_alone)
    graph.cleanup(remove_unused_graph_inputs=False)
    if computing() < before:
        report.canonicalized["constant arithmetic → constant"] += before - computing()


def _fold_once(graph: gs.Graph, report: Report) -> bool:
    """One evaluation over the graph and the rewrites it allows; True where anything changed."""
    values: dict[str, Value] = {}
    ambiguous = _ambiguous_symbols(graph)
    for node in graph.toposort().nodes:
        if len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if out.dtype is not None and np.dtype(out.dtype) not in INTEGER_TYPES:
            continue
        v = _evaluate(node, values, ambiguous)
        if v is not None:
            values[out.name] = v
    changed = False
    for t in list(graph.tensors().values()):
        v = values.get(t.name)
        if v is None or not isinstance(t, gs.Variable) or not t.outputs:
            continue
        elements, scalar = v
        if all(isinstance(e, int) for e in elements):
            if any(o is t for o in graph.outputs):
                continue
            dtype = np.dtype(t.dtype) if t.dtype is not None else np.dtype(np.int64)
            const = make_constant(graph, f"{t.name}_value", np.array(elements[0] if scalar else elements, dtype=dtype))
            replace_uses(graph, t, const)
            report.canonicalized["shape arithmetic → constant"] += 1
            changed = True
            continue
        for consumer in list(t.outputs):
            if consumer.op != "Reshape" or len(consumer.inputs) < 2 or consumer.inputs[1] is not t:
                continue
            shape = _reshape_shape(consumer, elements)
            if shape is None:
                continue
            const = make_constant(graph, f"{consumer.name}_shape", np.array(shape, dtype=np.int64))
            set_inputs(consumer, [consumer.inputs[0], const])
            report.canonicalized["Reshape shape computed at run time → constant"] += 1
            changed = True
    return changed


def shape_constants(graph: gs.Graph, report: Report) -> gs.Graph:
    for _ in range(ROUNDS):
        if not any(n.op == "Shape" for n in graph.nodes) or not _fold_once(graph, report):
            break
        graph.cleanup(remove_unused_graph_inputs=False)
        _fold_small_constants(graph, report)
        infer_shapes_again(graph)  # the shapes after a Reshape made constant, for the next Shape ops
    return graph.cleanup(remove_unused_graph_inputs=False)


def concrete_shapes(graph: gs.Graph, batch: int, rounds: int = 8) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape with a symbolic batch dimension set to `batch`, where it can be known (the
    fusion decisions time candidates at each batch size).

    What depends on the batch stays computed in the model (YOLO's C2f chunks through
    Shape→Gather→Add→Div→Mul→Slice where the export kept the batch in that arithmetic), and ONNX shape
    inference does not see through all of it, so later shapes stay unknown while the batch is symbolic.
    Here, on a light copy (weights as typed inputs) with the batch fixed, shape inference and this
    pass's folding alternate until nothing changes. Only fully known shapes are returned."""
    light = light_copy(graph)
    for t in light.inputs:
        if t.shape and not (isinstance(t.shape[0], int) and t.shape[0] > 0):
            t.shape = [batch, *t.shape[1:]]
    for _ in range(rounds):
        infer_shapes_again(light)
        if not _fold_once(light, Report()):
            break
        light.cleanup(remove_unused_graph_inputs=False)
        _fold_small_constants(light, Report())
    return {t.name: tuple(t.shape) for t in light.tensors().values()
            if t.shape and all(isinstance(d, int) and d > 0 for d in t.shape)}
