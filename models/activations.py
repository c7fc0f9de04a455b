"""Activations written node for node as the exporters write them.

Each function takes the builder and the pre-activation tensor and returns the activated tensor.
The decomposed forms are what the optimizer's canonicalize pass must recognise, so operand order
and constant values are part of the contract here: change them only together with that pass.
"""
from __future__ import annotations

from models.builder import GraphBuilder


def silu(g: GraphBuilder, x: str, *, sigmoid_first: bool = False) -> str:
    """x·sigmoid(x). YOLOv8 (torch SiLU) writes Mul(x, Sigmoid(x)); torchvision EfficientNet's
    export reads Mul(Sigmoid(x), x)."""
    sig = g.op("Sigmoid", [x])
    return g.op("Mul", [sig, x] if sigmoid_first else [x, sig])


def hard_swish_via_hard_sigmoid(g: GraphBuilder, x: str) -> str:
    """x·HardSigmoid(x) with torch's hardsigmoid constants (alpha 1/6, beta 0.5)."""
    return g.op("Mul", [x, g.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)])


def hard_swish_paddle(g: GraphBuilder, x: str, *, x_first: bool = True,
                      divide: bool = True) -> str:
    """Paddle2ONNX's hard_swish: Add(x, 3) → Clip(0, 6) → Mul(x, ·) → Div(·, 6).

    `x_first=False` writes Mul(·, x); `divide=False` writes Mul(·, 0.16666667) instead of Div by 6
    (both occur in Paddle exports depending on the op version that produced them)."""
    shifted = g.op("Add", [x, g.constant(3.0)])
    clipped = g.op("Clip", [shifted, g.constant(0.0), g.constant(6.0)])
    product = g.op("Mul", [x, clipped] if x_first else [clipped, x])
    if divide:
        return g.op("Div", [product, g.constant(6.0)])
    return g.op("Mul", [product, g.constant(0.16666667)])


def gelu_erf(g: GraphBuilder, x: str, *, multiply_by_inv_sqrt2: bool = False) -> str:
    """0.5·x·(1 + erf(x/√2)) as the TorchScript exporter writes nn.GELU() below opset 20:
    Div(x, 1.4142135) → Erf → Add 1 → Mul(x, ·) → Mul 0.5. Some code writes the /√2 as a
    multiplication by 0.70710678 (`multiply_by_inv_sqrt2`)."""
    if multiply_by_inv_sqrt2:
        scaled = g.op("Mul", [x, g.constant(0.70710678)])
    else:
        scaled = g.op("Div", [x, g.constant(1.4142135)])
    one_plus_erf = g.op("Add", [g.op("Erf", [scaled]), g.constant(1.0)])
    return g.op("Mul", [g.op("Mul", [x, one_plus_erf]), g.constant(0.5)])


def gelu_tanh(g: GraphBuilder, x: str) -> str:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as `gelu(approximate="tanh")`-style code
    exports below opset 20, with x³ as Pow(x, 3)."""
    half_x = g.op("Mul", [g.constant(0.5), x])
    cubed = g.op("Pow", [x, g.constant(3.0)])
    inner = g.op("Add", [x, g.op("Mul", [g.constant(0.044715), cubed])])
    tanh = g.op("Tanh", [g.op("Mul", [g.constant(0.7978845608), inner])])
    return g.op("Mul", [half_x, g.op("Add", [g.constant(1.0), tanh])])


def mish_decomposed(g: GraphBuilder, x: str) -> str:
    """x·tanh(softplus(x)), as exported before the Mish op existed (opset < 18)."""
    return g.op("Mul", [x, g.op("Tanh", [g.op("Softplus", [x])])])
