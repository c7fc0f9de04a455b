"""libepifuse_core.so's C ABI through optimizer.registry: validation, shape rule, kernel registry
and the CPU kernel, without ONNX Runtime."""
from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from conv_reference import fused_conv, output_size, rel_l2
from optimizer import registry
from tests.helpers import conv_inputs
from optimizer.contract import ACTIVATIONS
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

VALID = ConvDesc.from_attributes(FLOAT, (-1, 56, 56, 64), (64, 3, 3, 64), pads=(1, 1, 1, 1), activation="relu")


def test_abi_version():
    assert registry.abi_version() == registry.ABI_VERSION == 5


def test_activation_table_matches_contract():
    table = registry.activations()
    assert list(table) == list(ACTIVATIONS)
    for name, defaults in ACTIVATIONS.items():
        np.testing.assert_array_equal(np.float32(table[name]), np.float32(defaults), err_msg=name)


@pytest.mark.parametrize("args", [(56, 1, 1, 1, 3, 1), (56, 1, 1, 1, 3, 2), (224, 3, 3, 1, 7, 2),
                                  (13, 0, 2, 2, 3, 3), (5, 0, 0, 1, 5, 1), (7, 1, 0, 3, 2, 2)])
def test_output_size(args):
    assert registry.output_size(*args) == output_size(*args)


def test_output_size_symbolic():
    assert registry.output_size(-1, 1, 1, 1, 3, 1) == -1


def test_validate_accepts_symbolic_batch():
    registry.validate(VALID)


@pytest.mark.parametrize("change, message", [
    (dict(activation="swish"), "unknown activation 'swish'"),
    (dict(activation="clip", activation_params=(0.0,)), "takes 2 activation_params, got 1"),
    (dict(activation="relu", activation_params=(1.0,)), "takes 0 activation_params, got 1"),
    (dict(group=3), "group 3 does not divide C = 64"),
    (dict(C=6, group=2, K=5), "group 2 does not divide K = 5"),
    (dict(stride_w=0), "strides must be in [1, 2^31 - 1]"),
    (dict(dil_h=0), "dilations must be in [1, 2^31 - 1]"),
    (dict(pad_right=-1), "pads must be in [0, 2^31 - 1]"),
    (dict(H=2, R=5, pad_top=0, pad_bottom=0), "output height would be -2"),
    (dict(W=3, S=2, dil_w=3, pad_left=0, pad_right=0), "output width would be 0"),
    (dict(dtype=7), "unsupported dtype 7"),
    (dict(K=0), "K must be in [1, 2^31 - 1]"),
])
def test_validate_rejects(change, message):
    bad = dataclasses.replace(VALID, **change)
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.validate(bad)
    count, reason = registry.kernel_count("ort-cpu", bad)
    assert count == 0 and message in reason


@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16, BFLOAT16])
@pytest.mark.parametrize("target", registry.TARGETS)
def test_kernel_count(target, dtype):
    """Every valid problem has a kernel on every target: the CPU kernel on ort-cpu, at least the
    direct fallback (last, behind any faster kernel) on the CUDA targets."""
    for desc in (VALID, dataclasses.replace(VALID, C=32, K=32, group=32, stride_h=2, dil_w=2, residual="post"),
                 dataclasses.replace(VALID, N=-1, H=-1, W=-1, C=3, group=1, R=7, S=7)):
        desc = dataclasses.replace(desc, dtype=dtype)
        count, reason = registry.kernel_count(target, desc)
        names = registry.kernel_names(target, desc)
        assert reason == "" and count == len(names) >= 1
        assert names == ["cpu_eigen"] if target == "ort-cpu" else names[-1] == "cuda_direct"


def test_kernel_count_unknown_target():
    count, reason = registry.kernel_count("ort-rocm", VALID)
    assert count == 0 and "unknown target 'ort-rocm'" in reason


# --- the CPU kernel -------------------------------------------------------------------------

CASES = {
    "residual_pre_batch3": dict(shape=(3, 9, 7, 8, 12, 3, 3), pads=(1, 1, 1, 1), activation="silu", residual="pre"),
    "residual_post": dict(shape=(1, 6, 6, 8, 8, 3, 3), pads=(1, 1, 1, 1), activation="leaky_relu",
                          activation_params=(0.3,), residual="post"),
    "grouped_stride3": dict(shape=(1, 11, 10, 6, 9, 3, 3), group=3, strides=(3, 3), pads=(0, 2, 1, 0),
                            activation="hardsigmoid"),
    "depthwise_dilated": dict(shape=(2, 9, 9, 10, 10, 3, 3), group=10, dilations=(2, 2), pads=(2, 2, 2, 2),
                              activation="clip", activation_params=(-0.25, 0.5)),
    "pointwise": dict(shape=(2, 5, 5, 16, 24, 1, 1), activation="gelu"),
}


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float16, 1e-3), (ml_dtypes.bfloat16, 1e-2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_fused_conv(case, dtype, tol):
    attrs = dict(CASES[case])
    shape = attrs.pop("shape")
    x, w, b, z = conv_inputs(dtype, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, z, **attrs)
    assert y.dtype == dtype
    ref = fused_conv(*(None if a is None else a.astype(np.float64) for a in (x, w, b, z)), **attrs)
    assert rel_l2(y, ref) <= tol


def test_cpu_fused_conv_rejects_z_without_residual():
    x, w, b, _ = conv_inputs(np.float32, (1, 4, 4, 4, 4, 1, 1))
    with pytest.raises(ValueError, match="residual is 'none'"):
        registry.cpu_fused_conv(x, w, b, np.zeros((1, 4, 4, 4), np.float32))


@pytest.mark.parametrize("kernel", ["reference", "auto"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16bit_conversions_round_to_nearest_even(dtype, kernel):
    """Y = X[..., 0] + X[..., 1] via a 1x1 conv with unit weights: the fp32 sum is rounded once
    to the 16-bit type, which must match numpy's round-to-nearest-even bit for bit, including
    overflow to inf and exact ties, and subnormals on the reference kernel. oneDNN's native bf16
    (AVX512-BF16's conversion instructions treat subnormal inputs and results as zero) may flush
    those to zero of the same sign: 1e-38 and below, nothing an inference sees."""
    info = ml_dtypes.finfo(dtype)
    tiny, big, eps = float(info.smallest_subnormal), float(info.max), float(info.eps)
    rng = np.random.default_rng(0)
    mags = np.exp2(rng.uniform(np.log2(tiny), np.log2(big), 8192))
    x = (mags * rng.choice([-1.0, 1.0], mags.size)).astype(dtype).reshape(1, 64, 64, 2)
    x[0, 0, :6] = [[big, big], [0.0, -0.0], [tiny, tiny], [1.0, 0.0], [1.0, eps / 2], [1.0 + eps, eps / 2]]
    w = np.ones((1, 1, 1, 2), dtype)
    b = np.zeros(1, dtype)
    y = registry.cpu_fused_conv(x, w, b, kernel=kernel)
    with np.errstate(over="ignore"):
        expected = (x[..., :1].astype(np.float32) + x[..., 1:].astype(np.float32) + np.float32(0)).astype(dtype)
    desc = ConvDesc(dtype=FLOAT16 if dtype == np.float16 else BFLOAT16, N=1, H=64, W=64, C=2, K=1, R=1, S=1)
    if dtype == ml_dtypes.bfloat16 and kernel == "auto" and registry.cpu_kernel_name(desc).startswith("onednn"):
        normal = np.float32(info.smallest_normal)
        parts = [x[..., i:i + 1].astype(np.float32) for i in range(2)]
        with np.errstate(over="ignore"):
            daz = (sum(np.where(np.abs(p) < normal, np.float32(0), p) for p in parts) + np.float32(0)).astype(dtype)
        f = daz.astype(np.float32)
        daz = np.where(np.abs(f) < normal, np.copysign(np.float32(0), f).astype(dtype), daz)  # FTZ, sign kept
        expected = np.where(y.view(np.uint16) == daz.view(np.uint16), daz, expected)
    np.testing.assert_array_equal(y.view(np.uint16), expected.view(np.uint16))
