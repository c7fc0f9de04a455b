"""Recognise every way exporters write the activations of the op contract.

`match_activation(x)` looks at the consumers of tensor `x` and returns the activation applied to
it, the nodes that compute it and the tensor that holds the result, or None. Single ops map by a
table; the multi-node forms (x*Sigmoid(x), Paddle's x*Clip(x+3,0,6)/6, x*HardSigmoid(x), the Erf
and tanh GELUs, x*Tanh(Softplus(x))) are products, so they are matched by flattening the Mul/Div
tree into its factors and naming the one non-constant factor that is not x. That handles every
operand order and every place the constant (0.5, 1/6, 1/sqrt2) is multiplied or divided in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from .graph import producer, scalar_value


@dataclass
class ActivationMatch:
    name: str
    params: tuple[float, ...]
    output: gs.Tensor
    nodes: list[gs.Node] = field(default_factory=list)


def _close(a: float | None, b: float, rel: float = 1e-4) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-7)


def _clip_bounds(node: gs.Node) -> tuple[float, float] | None:
    """Constant Clip bounds (inputs from opset 11, attributes before); None if not constant."""
    lo, hi = -math.inf, math.inf
    if len(node.inputs) > 1 and node.inputs[1].name:
        lo = scalar_value(node.inputs[1])
        if lo is None:
            return None
    if len(node.inputs) > 2 and node.inputs[2].name:
        hi = scalar_value(node.inputs[2])
        if hi is None:
            return None
    lo = float(node.attrs.get("min", lo))
    hi = float(node.attrs.get("max", hi))
    return lo, hi


def _single_op(node: gs.Node) -> tuple[str, tuple[float, ...]] | None:
    a = node.attrs
    op = node.op
    if op == "Relu":
        return "relu", ()
    if op == "LeakyRelu":
        return "leaky_relu", (float(a.get("alpha", 0.01)),)
    if op == "Elu":
        return "elu", (float(a.get("alpha", 1.0)),)
    if op in ("Sigmoid", "Tanh", "Softplus", "Mish"):
        return op.lower(), ()
    if op == "HardSigmoid":
        return "hardsigmoid", (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)))
    if op == "HardSwish":
        return "hardswish", ()
    if op == "Gelu":
        return ("gelu_tanh" if a.get("approximate", "none") == "tanh" else "gelu"), ()
    if op == "Clip":
        bounds = _clip_bounds(node)
        return ("clip", bounds) if bounds is not None else None
    return None


def _only_consumer(t: gs.Tensor) -> gs.Node | None:
    return t.outputs[0] if len(t.outputs) == 1 else None


def _div_by_constant(node: gs.Node) -> float | None:
    if node.op == "Div":
        c = scalar_value(node.inputs[1])
        if c not in (None, 0.0):
            return 1.0 / c
    return None


def _is_product_node(node: gs.Node | None) -> bool:
    return node is not None and (node.op == "Mul" or _div_by_constant(node) is not None)


class _Product:
    """A Mul/Div-by-constant tree flattened into factors."""

    def __init__(self, top: gs.Tensor, stop: gs.Tensor):
        self.nodes: list[gs.Node] = []
        self.constant = 1.0
        self.factors: list[gs.Tensor] = []
        self._flatten(top, stop, is_top=True)

    def _flatten(self, t: gs.Tensor, stop: gs.Tensor, is_top: bool) -> None:
        node = producer(t)
        inner = t is not stop and _is_product_node(node) and (is_top or len(t.outputs) == 1)
        if not inner:
            c = scalar_value(t)
            if c is not None:
                self.constant *= c
            else:
                self.factors.append(t)
            return
        self.nodes.append(node)
        recip = _div_by_constant(node)
        if recip is not None:
            self.constant *= recip
            self._flatten(node.inputs[0], stop, False)
        else:
            for operand in node.inputs:
                self._flatten(operand, stop, False)

    def split(self, x: gs.Tensor) -> tuple[int, list[gs.Tensor]]:
        xs = sum(1 for f in self.factors if f is x)
        return xs, [f for f in self.factors if f is not x]


def _unary(t: gs.Tensor, op: str) -> gs.Node | None:
    """The producer of `t` if it is `op` and `t` is used only once (it is internal to a pattern)."""
    node = producer(t)
    return node if node is not None and node.op == op and len(t.outputs) == 1 else None


def _add_constant(t: gs.Tensor, value: float) -> tuple[gs.Node, gs.Tensor] | None:
    """`t` = Add(other, value) in either order, `t` used once: returns (node, other)."""
    node = _unary(t, "Add")
    if node is None:
        return None
    a, b = node.inputs
    if _close(scalar_value(b), value):
        return node, a
    if _close(scalar_value(a), value):
        return node, b
    return None


def _scaled_x(t: gs.Tensor, x: gs.Tensor, scale: float) -> list[gs.Node] | None:
    """`t` = x * scale written as any Mul/Div tree: returns its nodes."""
    prod = _Product(t, x)
    xs, rest = prod.split(x)
    if xs == 1 and not rest and _close(prod.constant, scale) and all(len(n.outputs[0].outputs) == 1 for n in prod.nodes):
        return prod.nodes
    return None


def _x_cubed(t: gs.Tensor, x: gs.Tensor) -> tuple[float, list[gs.Node]] | None:
    """`t` = c * x^3 (Pow(x, 3) or x*x*x): returns (c, nodes)."""
    prod = _Product(t, x)
    xs, rest = prod.split(x)
    nodes = list(prod.nodes)
    if len(rest) == 1 and xs == 0:
        pow_node = _unary(rest[0], "Pow")
        if pow_node is None or pow_node.inputs[0] is not x or not _close(scalar_value(pow_node.inputs[1]), 3.0):
            return None
        return prod.constant, nodes + [pow_node]
    if xs == 3 and not rest:
        return prod.constant, nodes
    return None


def _second_factor(g: gs.Tensor, x: gs.Tensor, constant: float) -> tuple[str, list[gs.Node]] | None:
    """Names the activation `x * constant * g`, with g computed from x; returns its nodes."""
    node = producer(g)
    if node is None or len(g.outputs) != 1:
        return None
    if node.op == "Sigmoid" and node.inputs[0] is x and _close(constant, 1.0):
        return "silu", [node]
    if node.op == "HardSigmoid" and node.inputs[0] is x and _close(constant, 1.0) \
            and _close(float(node.attrs.get("alpha", 0.2)), 1 / 6) and _close(float(node.attrs.get("beta", 0.5)), 0.5):
        return "hardswish", [node]
    if node.op == "Tanh" and _close(constant, 1.0):
        softplus = _unary(node.inputs[0], "Softplus")
        if softplus is not None and softplus.inputs[0] is x:
            return "mish", [node, softplus]
    if node.op == "Clip" and _close(constant, 1 / 6) and _clip_bounds(node) == (0.0, 6.0):
        add = _add_constant(node.inputs[0], 3.0)
        if add is not None and add[1] is x:
            return "hardswish", [node, add[0]]
    if node.op == "Add" and _close(constant, 0.5):
        one_plus = _add_constant(g, 1.0)
        if one_plus is None:
            return None
        inner = one_plus[1]
        erf = _unary(inner, "Erf")
        if erf is not None:
            scaled = _scaled_x(erf.inputs[0], x, 1 / math.sqrt(2))
            return ("gelu", [one_plus[0], erf, *scaled]) if scaled is not None else None
        tanh = _unary(inner, "Tanh")
        if tanh is not None:
            return _gelu_tanh_argument(tanh, x, [one_plus[0], tanh])
    return None


def _gelu_tanh_argument(tanh: gs.Node, x: gs.Tensor, nodes: list[gs.Node]) -> tuple[str, list[gs.Node]] | None:
    """tanh(sqrt(2/pi) * (x + 0.044715 * x^3))."""
    outer = _Product(tanh.inputs[0], x)
    if len(outer.factors) != 1 or not _close(outer.constant, math.sqrt(2 / math.pi)):
        return None
    add = _unary(outer.factors[0], "Add") if outer.factors[0] is not x else None
    if add is None:
        return None
    a, b = add.inputs
    for lin, cub in ((a, b), (b, a)):
        if lin is x:
            cubed = _x_cubed(cub, x)
            if cubed is not None and _close(cubed[0], 0.044715, rel=1e-3):
                return "gelu_tanh", nodes + outer.nodes + [add] + cubed[1]
    return None


def _product_activation(x: gs.Tensor, start: gs.Node) -> ActivationMatch | None:
    """Tries the product trees rooted at `start` and at each single-consumer Mul/Div above it,
    largest first, so that e.g. SiLU followed by an SE scaling Mul still matches the SiLU."""
    tops = [start]
    while True:
        nxt = _only_consumer(tops[-1].outputs[0])
        if not _is_product_node(nxt) or (nxt.op == "Div" and nxt.inputs[0] is not tops[-1].outputs[0]):
            break
        tops.append(nxt)
    for top in reversed(tops):
        prod = _Product(top.outputs[0], x)
        xs, rest = prod.split(x)
        if xs != 1 or len(rest) != 1:
            continue
        named = _second_factor(rest[0], x, prod.constant)
        if named is not None:
            return ActivationMatch(named[0], (), top.outputs[0], prod.nodes + named[1])
    return None


def match_replaceable_activation(graph: gs.Graph, x: gs.Tensor) -> ActivationMatch | None:
    """match_activation(x) where its nodes can go: every tensor they write but the activation's output is
    read only inside the pattern and is no graph output."""
    match = match_activation(x)
    if match is None:
        return None
    inside = {id(n) for n in match.nodes}
    for t in (t for n in match.nodes for t in n.outputs if t is not match.output):
        if t in graph.outputs or any(id(c) not in inside for c in t.outputs):
            return None
    return match


def match_activation(x: gs.Tensor) -> ActivationMatch | None:
    """The activation applied to `x`, if every consumer of `x` belongs to one recognised pattern."""
    consumers = x.outputs
    if len(consumers) == 1:
        single = _single_op(consumers[0])
        if single is not None and consumers[0].inputs[0] is x:
            return ActivationMatch(single[0], single[1], consumers[0].outputs[0], [consumers[0]])
    for start in consumers:
        if _is_product_node(start) and (start.op == "Mul" or start.inputs[0] is x):
            match = _product_activation(x, start)
            if match is not None and all(c in match.nodes for c in consumers):
                return match
    return None
