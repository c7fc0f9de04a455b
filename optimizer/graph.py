"""Small helpers on onnx-graphsurgeon graphs shared by the passes (no second IR on top of gs)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from . import contract

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if t.inputs else None


def is_transpose(node: gs.Node | None, perm: tuple[int, ...]) -> bool:
    """`node` is a Transpose by `perm`."""
    return node is not None and node.op == "Transpose" and tuple(int(v) for v in node.attrs.get("perm", ())) == perm


def constant_value(t: gs.Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant-node output), else None."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    node = producer(t)
    if node is not None and node.op == "Constant" and "value" in node.attrs:
        v = node.attrs["value"]
        return np.asarray(v.values if isinstance(v, gs.Constant) else v)
    return None


def split_sizes(node: gs.Node, dim: int | None) -> np.ndarray | None:
    """The sizes of a Split's outputs along its axis, which is `dim` long (None where unknown): its constant
    `split` input or attribute, else opset 18's `num_outputs` (ceil(dim / n) each, the last what remains) or
    equal parts, which must divide dim. None where the sizes are computed at run time or cannot be known."""
    n = len(node.outputs)
    if len(node.inputs) > 1 and node.inputs[1].name:
        sizes = constant_value(node.inputs[1])
        return None if sizes is None else sizes.astype(np.int64).reshape(-1)
    if "split" in node.attrs:
        return np.asarray(node.attrs["split"], np.int64)
    if not isinstance(dim, int):
        return None
    if "num_outputs" in node.attrs:
        part = -(-dim // n)
        return np.array([min(part, dim - i * part) for i in range(n)], np.int64)
    return np.full(n, dim // n, np.int64) if dim % n == 0 else None


def scalar_value(t: gs.Tensor | None) -> float | None:
    """A constant with exactly one element, as a Python float."""
    v = constant_value(t)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def ensure_domain(graph: gs.Graph, domain: str, version: int) -> None:
    imports = list(graph.import_domains or [])
    if not any(i.domain == domain for i in imports):
        imports.append(onnx.helper.make_opsetid(domain, version))
        graph.import_domains = imports


def attr_text(node: gs.Node, name: str, default: str) -> str:
    """A string attribute as str (onnx-graphsurgeon keeps some as bytes)."""
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def set_inputs(node: gs.Node, tensors: list) -> None:
    """gs keeps producer/consumer links in sync only through element-wise list edits."""
    node.inputs.clear()
    node.inputs.extend(tensors)


def set_outputs(node: gs.Node, tensors: list) -> None:
    node.outputs.clear()
    node.outputs.extend(tensors)


def replace_uses(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor) -> None:
    """Make every consumer of `old` read `new` instead. Graph outputs keep their name: where `old`
    is one, an Identity writes it from `new` (ORT drops it at load time)."""
    for consumer in list(old.outputs):
        set_inputs(consumer, [new if t is old else t for t in consumer.inputs])
    if any(o is old for o in graph.outputs):
        old.inputs.clear()
        graph.nodes.append(gs.Node("Identity", name=f"{old.name}_identity", inputs=[new], outputs=[old]))


def axes_of(node: gs.Node, input_index: int) -> np.ndarray | None:
    """A node's `axes`: from its (constant) input `input_index` where given (newer opsets), else from
    the attribute; None when absent or not a constant."""
    if len(node.inputs) > input_index and node.inputs[input_index].name:
        v = constant_value(node.inputs[input_index])
        return None if v is None else v.astype(np.int64).reshape(-1)
    if "axes" in node.attrs:
        return np.array(node.attrs["axes"], dtype=np.int64)
    return None


def shape_of(t: gs.Tensor) -> list | None:
    """Static or symbolic shape as a list (ints, strs or None), or None when unknown."""
    if isinstance(t, gs.Constant):
        return list(t.values.shape)
    return list(t.shape) if t.shape is not None else None


def same_shape(a: gs.Tensor, b: gs.Tensor) -> bool:
    """True when both shapes are known and equal dim by dim (symbolic dims must share a name)."""
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None or len(sa) != len(sb):
        return False
    return all(x == y and x is not None and not (isinstance(x, int) and x < 0) for x, y in zip(sa, sb))


def numel_per_image(t: gs.Tensor) -> int | None:
    """Element count with symbolic batch/spatial dims taken as 1 (for per-image byte estimates)."""
    s = shape_of(t)
    if s is None:
        return None
    return int(np.prod([d if isinstance(d, int) and d > 0 else 1 for d in s]))


def itemsize(t: gs.Tensor) -> int:
    dt = t.dtype
    if dt is None:
        return 4
    try:
        return np.dtype(dt).itemsize
    except TypeError:
        return 2  # bfloat16 is not a numpy dtype


def depends_on(target: gs.Tensor, source: gs.Tensor, limit: int = 100000) -> bool:
    """True when `target` is computed from `source` (walks producers; used to refuse cycles)."""
    stack, seen = [target], set()
    while stack and len(seen) < limit:
        t = stack.pop()
        if t is source:
            return True
        if id(t) in seen:
            continue
        seen.add(id(t))
        node = producer(t)
        if node is not None:
            stack.extend(node.inputs)
    return False


def unique_name(graph: gs.Graph, base: str) -> str:
    names = graph.__dict__.get("_epifuse_names")  # gs.Graph.__getattr__ treats unknown names as ops
    if names is None:
        names = set(graph.tensors().keys()) | {n.name for n in graph.nodes}
        graph._epifuse_names = names
    name, i = base, 0
    while name in names:
        i += 1
        name = f"{base}_{i}"
    names.add(name)
    return name


def make_constant(graph: gs.Graph, base: str, values: np.ndarray) -> gs.Constant:
    """A constant of `values`, C-contiguous, its rank kept (np.ascontiguousarray alone makes a scalar a
    1-element vector: a Clip bound, a size in shape arithmetic must stay 0-D)."""
    a = np.asarray(values)
    return gs.Constant(unique_name(graph, base), a if a.flags.c_contiguous else np.ascontiguousarray(a))


def make_variable(graph: gs.Graph, base: str, dtype=None, shape=None) -> gs.Variable:
    return gs.Variable(unique_name(graph, base), dtype=dtype, shape=shape)


def add_transpose(graph: gs.Graph, x: gs.Tensor, perm, base: str, out: gs.Variable | None = None) -> gs.Variable:
    if out is None:
        s = shape_of(x)
        out = make_variable(graph, base, x.dtype, [s[p] for p in perm] if s and len(s) == len(perm) else None)
    graph.nodes.append(gs.Node("Transpose", name=unique_name(graph, base), attrs={"perm": list(perm)},
                               inputs=[x], outputs=[out]))
    return out


def light_copy(graph: gs.Graph) -> gs.Graph:
    """A copy of `graph` whose weights are typed inputs (shape inference reads no weights)."""
    light = graph.copy()
    for t in list(light.tensors().values()):
        if isinstance(t, gs.Constant) and t.values.size > 64:  # shape-like constants stay for the folding
            dtype, shape = t.values.dtype, list(t.values.shape)
            t.to_variable(dtype=dtype, shape=shape)
            t.type = "tensor_type"  # to_variable leaves it unset in onnx-graphsurgeon 0.5-0.6
            light.inputs.append(t)
    return light


def _inferred_value_infos(light: gs.Graph) -> list | None:
    """Every tensor's type inferred afresh from `light`'s inputs, with ONNX's data propagation; None where
    the inference fails."""
    for t in light.tensors().values():
        if isinstance(t, gs.Variable) and t not in light.inputs:
            t.shape = None
    try:
        model = onnx.shape_inference.infer_shapes(gs.export_onnx(light, do_type_check=False), strict_mode=False,
                                                  data_prop=True)
    except Exception:  # noqa: BLE001 (an op the inference cannot handle: keep what is known)
        return None
    return [*model.graph.value_info, *model.graph.output, *model.graph.input]


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in vi.type.tensor_type.shape.dim]


def _inferred_shapes(light: gs.Graph) -> dict[str, list] | None:
    """Every tensor's shape inferred afresh from `light`'s inputs (ints, dim_param names, None)."""
    infos = _inferred_value_infos(light)
    return None if infos is None else {vi.name: _dims(vi) for vi in infos if vi.type.tensor_type.HasField("shape")}


def _standard_stand_ins(light: gs.Graph) -> None:
    """epifuse's ops in `light` as standard nodes of the same outputs, so that ONNX's shape inference sees
    through them: a FusedConv as Transpose -> Conv -> Transpose (its filters KRSC), NchwToNhwc as a
    Transpose, ChannelScale as a Mul, ChannelMean as a ReduceMean over H and W, ChannelConcat and
    ChannelSlice as a Concat and a Slice of the last axis, LayerNorm as a LayerNormalization over the last
    axis."""
    for node in [n for n in light.nodes if n.domain == contract.DOMAIN]:
        if node.op == "NchwToNhwc":
            node.op, node.domain, node.attrs = "Transpose", "", {"perm": list(NCHW_TO_NHWC)}
        elif node.op == "ChannelScale":
            node.op, node.domain, node.attrs = "Mul", "", {}
        elif node.op == "ChannelConcat":
            node.op, node.domain, node.attrs = "Concat", "", {"axis": 3}
        elif node.op == "ChannelSlice":
            from .passes.channel_copy import as_slice  # noqa: PLC0415 (the passes import this module)

            as_slice(light, node)
        elif node.op == "ChannelMean":
            from .passes.channel_mean import as_reduce_mean  # noqa: PLC0415 (the passes import this module)

            as_reduce_mean(light, node)
        elif node.op == "LayerNorm":
            node.op, node.domain, node.attrs = "LayerNormalization", "", {"axis": -1, **node.attrs}
        elif node.op == contract.OP_TYPE and len(node.inputs) >= 2 and len(node.outputs) == 1:
            x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
            x_nchw, w_kcrs, y_nchw = (gs.Variable(unique_name(light, f"{node.name}_{what}"))
                                      for what in ("x_nchw", "w_kcrs", "y_nchw"))
            set_inputs(node, [x_nchw, w_kcrs])
            set_outputs(node, [y_nchw])
            light.nodes += [gs.Node("Transpose", inputs=[x], outputs=[x_nchw], attrs={"perm": [0, 3, 1, 2]}),
                            gs.Node("Transpose", inputs=[w], outputs=[w_kcrs], attrs={"perm": [0, 3, 1, 2]}),
                            gs.Node("Transpose", inputs=[y_nchw], outputs=[y], attrs={"perm": list(NCHW_TO_NHWC)})]
            node.op, node.domain = "Conv", ""
            node.attrs = {k: node.attrs[k] for k in ("strides", "pads", "dilations", "group") if k in node.attrs}
    light.toposort()


def inferred_types(graph: gs.Graph) -> dict[str, tuple[np.dtype | None, list | None]]:
    """Each tensor's element type and shape inferred afresh, epifuse's ops included, not written onto
    `graph` (for a pass that runs where the layout pass has left its new tensors untyped)."""
    light = light_copy(graph)
    _standard_stand_ins(light)
    infos = _inferred_value_infos(light) or []
    types = {}
    for vi in infos:
        t = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else None
        types[vi.name] = (dtype, _dims(vi) if t.HasField("shape") else None)
    return types


def infer_shapes_again(graph: gs.Graph) -> None:
    """Shapes inferred afresh, written onto `graph`'s tensors where known (after a rewrite that lets
    inference see further, such as a Reshape shape made constant)."""
    inferred = _inferred_shapes(light_copy(graph))
    for name, t in graph.tensors().items():
        dims = (inferred or {}).get(name)
        if isinstance(t, gs.Variable) and t not in graph.inputs and dims is not None:
            t.shape = dims
