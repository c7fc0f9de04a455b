"""Independent float64 numpy reference of epifuse::FusedConv (shared/docs/fusedconv-op.md).

Written from the contract alone, sharing no code with the plugins, so the tests compare two
implementations rather than one with itself.
"""
from __future__ import annotations

import math

import numpy as np

from optimizer.contract import ACTIVATIONS

_erf = np.vectorize(math.erf)


def _softplus(x):
    return np.logaddexp(0.0, x)


ACTIVATION_FUNCTIONS = {
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "leaky_relu": lambda x, alpha: np.where(x >= 0, x, alpha * x),
    "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "hardsigmoid": lambda x, alpha, beta: np.clip(alpha * x + beta, 0.0, 1.0),
    "hardswish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "elu": lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
    "softplus": _softplus,
}


def output_size(size, pad_begin, pad_end, dilation, kernel, stride):
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def fused_conv(x, w, b, z=None, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
               activation="identity", activation_params=(), residual="none"):
    """X [N,H,W,C], W [K,R,S,C/group], B [K], Z [N,P,Q,K] -> Y [N,P,Q,K], all in float64."""
    x, w, b = (np.asarray(a, dtype=np.float64) for a in (x, w, b))
    n, h, wd, c = x.shape
    k, r_size, s_size, cg = w.shape
    assert cg * group == c and k % group == 0
    kg = k // group
    pt, pl, pb, pr = pads
    p = output_size(h, pt, pb, dilations[0], r_size, strides[0])
    q = output_size(wd, pl, pr, dilations[1], s_size, strides[1])
    xg = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0))).reshape(n, h + pt + pb, wd + pl + pr, group, cg)
    wg = w.reshape(group, kg, r_size, s_size, cg)
    y = np.zeros((n, p, q, group, kg))
    for r in range(r_size):
        for s in range(s_size):
            h0, w0 = r * dilations[0], s * dilations[1]
            taps = xg[:, h0:h0 + strides[0] * (p - 1) + 1:strides[0], w0:w0 + strides[1] * (q - 1) + 1:strides[1]]
            y += np.einsum("npqgc,gkc->npqgk", taps, wg[:, :, r, s, :])
    y = y.reshape(n, p, q, k) + b
    if residual == "pre":
        y = y + np.asarray(z, dtype=np.float64)
    params = tuple(activation_params) or ACTIVATIONS[activation]
    y = ACTIVATION_FUNCTIONS[activation](y, *params)
    if residual == "post":
        y = y + np.asarray(z, dtype=np.float64)
    return y


def rel_l2(actual, expected) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))
