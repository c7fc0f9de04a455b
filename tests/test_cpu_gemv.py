"""The CPU FusedConv's gemv kernel (fp32 1x1 convs on up to four pixels, a squeeze-excite block's convs on
its pooled vector; AVX-512 and AVX2, each where the CPU has it; bf16 on AVX-512 with BW), through the core C ABI and through ONNX
Runtime, against a float64 numpy reference: every activation and residual mode, output channels that
fill several filter panels or end in a partial vector, one to four pixels over batches and maps, the
split over threads; and where it does not apply, the problem goes to the other kernels."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conv_reference import rel_l2
from optimizer import registry
from optimizer.contract import ACTIVATIONS
from tests.helpers import conv_inputs, cpu_flags
from tests.test_cpu_onednn import PARAMS, _fused_conv_model, _session
from tests.test_cpu_winograd import TOL, _desc, _reference, check_kernel, isa  # noqa: F401 (isa: the fixture of both ISAs)

pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the gemv kernel needs AVX2 and FMA")


def _check(isa, shape, **attrs):
    check_kernel("gemv", f"gemv direct {isa}", shape, **attrs)


@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_and_residual(activation, residual, isa):
    """The epilogue on each output vector in registers; 44 output channels end in a partial vector of
    either width."""
    _check(isa, (1, 1, 1, 40, 44, 1, 1), activation=activation, activation_params=PARAMS.get(activation, ()),
           residual=residual)


# (N, H, W, C, K): each exercises another part of the blocking
GEOMETRY = {
    "squeeze_excite_reduce": (1, 1, 1, 672, 28),
    "squeeze_excite_expand": (1, 1, 1, 28, 672),
    "several_panels_and_a_partial_one": (1, 1, 1, 96, 300),
    "split_over_threads": (1, 1, 1, 960, 240),  # 230K multiply-adds: a piece a panel
    "one_input_channel": (1, 1, 1, 1, 20),
    "one_output_channel": (1, 1, 1, 50, 1),
    "batch_of_four": (4, 1, 1, 48, 40),
    "a_2x2_map": (1, 2, 2, 33, 129),
    "batch_2_of_1x2": (2, 1, 2, 300, 500),
}


@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(name, isa):
    n, h, w, c, k = GEOMETRY[name]
    _check(isa, (n, h, w, c, k, 1, 1), activation="silu", residual="post")


def test_large_values_and_nan_propagate(isa):
    """Outputs far into both tails of SiLU and sigmoid, and a NaN input that spoils its pixel only."""
    shape = (2, 1, 1, 64, 48, 1, 1)
    x, w, b, _ = conv_inputs(np.float32, shape)
    x *= 40
    x[1, 0, 0, 5] = np.nan
    for activation in ("silu", "sigmoid", "relu"):
        y = registry.cpu_fused_conv(x, w, b, kernel="gemv", activation=activation)
        ref = _reference(x, w, b, None, activation=activation)
        assert np.array_equal(np.isnan(y), np.isnan(ref)), activation
        assert rel_l2(y[0], ref[0]) <= TOL, activation


@pytest.mark.parametrize("attrs, shape", [
    ({}, (1, 1, 5, 32, 32, 1, 1)),  # five pixels
    ({}, (5, 1, 1, 32, 32, 1, 1)),  # a batch of five
    (dict(strides=(2, 2)), (1, 2, 2, 32, 32, 1, 1)),
    (dict(pads=(1, 1, 1, 1)), (1, 1, 1, 32, 32, 1, 1)),
    (dict(group=4), (1, 1, 1, 32, 32, 1, 1)),
    (dict(pads=(1, 1, 1, 1)), (1, 1, 1, 32, 32, 3, 3)),
])
def test_other_problems_run_elsewhere(attrs, shape):
    """The gemv kernel multiplies a few pixels' channels by the filter matrix, unpadded and unstrided; selecting
    it leaves the rest to the other kernels."""
    assert not registry.cpu_kernel_name(_desc(shape, **attrs), "gemv").startswith("gemv ")
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, kernel="gemv", **attrs)
    assert rel_l2(y, _reference(x, w, b, None, **attrs)) <= TOL


def test_auto_runs_the_faster_kernel_correctly():
    """"auto" times the gemv kernel against oneDNN on the problem and runs the faster; both give the answer."""
    shape, attrs = (1, 1, 1, 480, 20, 1, 1), dict(activation="silu", residual="none")
    name = registry.cpu_kernel_name(_desc(shape, **attrs))
    assert name.startswith("gemv direct ") or name.startswith("onednn "), name
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    assert rel_l2(registry.cpu_fused_conv(x, w, b, z, **attrs), _reference(x, w, b, z, **attrs)) <= TOL


@pytest.mark.parametrize("kernel", ["gemv", "auto"])
def test_ort_constant_filters_across_batches(monkeypatch, kernel):
    """The panels made at the first run serve later runs; a batch past four pixels goes to oneDNN and back."""
    shape, attrs = (1, 1, 1, 200, 150, 1, 1), dict(pads=[0, 0, 0, 0], activation="hardswish")
    _, w, b, _ = conv_inputs(np.float32, shape)
    b[:] = 0
    session = _session(_fused_conv_model(shape, weights=w, **attrs), monkeypatch, kernel)
    rng = np.random.default_rng(1)
    for n in (1, 4, 7, 2, 1):
        x = rng.standard_normal((n, 1, 1, 200)).astype(np.float32)
        y = session.run(None, {"x": x})[0]
        assert rel_l2(y, _reference(x, w, b, None, activation="hardswish")) <= TOL


def test_ort_filters_that_change_between_runs(monkeypatch):
    """W as a graph input: each run arranges the filters it is given, never a copy of earlier ones."""
    shape = (1, 1, 1, 64, 40, 1, 1)
    session = _session(_fused_conv_model(shape, weights=None, pads=[0, 0, 0, 0], activation="relu"), monkeypatch,
                       "gemv")
    x = np.random.default_rng(2).standard_normal((2, 1, 1, 64)).astype(np.float32)
    b = np.zeros(40, np.float32)
    for seed in (3, 4):
        w = (np.random.default_rng(seed).standard_normal((40, 1, 1, 64)) / 8).astype(np.float32)
        y = session.run(None, {"x": x, "w": w})[0]
        assert rel_l2(y, _reference(x, w, b, None, activation="relu")) <= TOL


@pytest.mark.parametrize("kernel", ["gemv", "onednn"])
@pytest.mark.parametrize("name", ["mobilenetv3_tiny", "efficientnet_tiny"])
def test_zoo_models_verify_on_each_kernel(name, kernel, monkeypatch):
    """Whole optimized models against ORT on the original, their squeeze-excite convs on the one kernel and
    then on the other."""
    from models import zoo
    from optimizer.passes.load import validate
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)
    original = validate(zoo.build(name))
    optimized, _ = optimize_model(original, precision="fp32", target="ort-cpu", policy=FusionPolicy(mode="always"))
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags(), reason="bf16 needs AVX-512 with BW and VL")
@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 672, 28), (1, 1, 1, 28, 672), (1, 1, 1, 96, 300), (1, 1, 1, 960, 240),
                                   (2, 1, 2, 40, 44)], ids=str)
def test_bf16_filters_and_data_with_fp32_sums(shape, residual, monkeypatch):
    """bfloat16 data and filters (the filters' bytes halved, what a squeeze-excite conv streams): each output
    summed in fp32 and rounded once, within bf16's unit roundoff (2^-8) of the float64 result on the same
    bf16 values, as oneDNN's kernel is; this kernel runs it, over panels, partial vectors and threads."""
    import ml_dtypes

    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    n, h, w, c, k = shape
    full = (n, h, w, c, k, 1, 1)
    attrs = dict(activation="hardsigmoid", activation_params=PARAMS.get("hardsigmoid", ()), residual=residual)
    x, wt, b, z = (None if a is None else a.astype(ml_dtypes.bfloat16) for a in conv_inputs(np.float32, full, **attrs))
    desc = dataclasses.replace(_desc(full, **attrs), dtype=registry.BFLOAT16)
    assert registry.cpu_kernel_name(desc, "gemv") == "gemv direct avx512"
    ref = _reference(x, wt, b, z, **attrs)
    y = registry.cpu_fused_conv(x, wt, b, z, kernel="gemv", **attrs)
    assert y.dtype == ml_dtypes.bfloat16 and rel_l2(y.astype(np.float64), ref) <= 2.0 ** -8
    onednn = registry.cpu_fused_conv(x, wt, b, z, kernel="onednn", **attrs)
    assert rel_l2(onednn.astype(np.float64), ref) <= 2.0 ** -7
