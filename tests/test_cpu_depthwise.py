"""The CPU FusedConv's depthwise kernel (fp32, one channel a group; AVX-512 and AVX2, each where the CPU
has it; bf16 on AVX-512 with BW), through the core C ABI and through ONNX Runtime, against a float64 numpy
reference: every
activation and residual mode, every filter width and stride it unrolls and others it runs a column at
a time, maps narrower than a block of columns, padding wider than the filter, channel counts that leave
partial vectors, batches; and where it does not apply, the problem goes to the other kernels."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnxruntime as ort
import pytest

from conv_reference import rel_l2
from optimizer import registry
from optimizer.contract import ACTIVATIONS
from optimizer.runtime import session_options
from tests.helpers import conv_inputs, cpu_flags
from tests.test_cpu_onednn import PARAMS, _fused_conv_model
from tests.test_cpu_winograd import TOL, _desc, _reference, check_kernel, isa  # noqa: F401 (isa: the fixture of both ISAs)

pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the depthwise kernel needs AVX2 and FMA")


def _check(isa, shape, **attrs):
    attrs.setdefault("group", shape[3])
    check_kernel("depthwise", f"depthwise direct {isa}", shape, **attrs)


@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_and_residual(activation, residual, isa):
    """The epilogue over each output row: vector forms of the common activations, the others lane by
    lane; 40 channels end in a partial vector of either width."""
    _check(isa, (1, 13, 21, 40, 40, 3, 3), pads=(1, 1, 1, 1), activation=activation,
           activation_params=PARAMS.get(activation, ()), residual=residual)


# (N, H, W, C, R, S), strides, pads: each exercises another part of the row loop
GEOMETRY = {
    "3x3_s1_wider_than_a_block": ((1, 9, 37, 32, 3, 3), (1, 1), (1, 1, 1, 1)),
    "3x3_s2": ((1, 17, 23, 48, 3, 3), (2, 2), (1, 1, 1, 1)),
    "5x5_s1": ((1, 14, 30, 24, 5, 5), (1, 1), (2, 2, 2, 2)),
    "5x5_s2_odd_map": ((2, 15, 15, 72, 5, 5), (2, 2), (2, 2, 2, 2)),
    "7x7_s1_convnext": ((1, 14, 14, 96, 7, 7), (1, 1), (3, 3, 3, 3)),
    "rows_fewer_than_pieces_channels_split": ((1, 7, 7, 200, 5, 5), (1, 1), (2, 2, 2, 2)),
    "small_channels_rows_fewer_than_pieces": ((1, 7, 7, 64, 3, 3), (1, 1), (1, 1, 1, 1)),
    # a block's input past L1 through all channels: bands of rows, a pair of vectors each, the last partial
    "bands_of_channel_pairs": ((1, 14, 14, 484, 3, 3), (1, 1), (1, 1, 1, 1)),
    "bands_of_channel_pairs_s2_batch": ((2, 15, 15, 484, 5, 5), (2, 2), (2, 2, 2, 2)),
    "7x7_s2": ((1, 19, 26, 16, 7, 7), (2, 2), (3, 3, 3, 3)),
    "map_narrower_than_a_block": ((1, 3, 3, 64, 3, 3), (1, 1), (1, 1, 1, 1)),
    "one_pixel": ((1, 1, 1, 32, 3, 3), (1, 1), (1, 1, 1, 1)),
    "no_padding": ((1, 12, 40, 16, 3, 3), (1, 1), (0, 0, 0, 0)),
    "asymmetric_pads": ((1, 11, 29, 16, 5, 5), (2, 2), (0, 2, 1, 0)),
    "padding_wider_than_the_filter": ((1, 6, 18, 16, 3, 3), (1, 1), (4, 5, 4, 5)),
    "filter_wider_than_the_map": ((1, 4, 4, 16, 7, 7), (1, 1), (3, 3, 3, 3)),
    "channels_not_a_vector": ((1, 10, 30, 21, 3, 3), (1, 1), (1, 1, 1, 1)),
    "three_channels": ((1, 10, 30, 3, 5, 5), (2, 2), (2, 2, 2, 2)),
    "rows_strided_columns_not": ((1, 16, 30, 32, 3, 3), (2, 1), (1, 1, 1, 1)),
    # taps and strides it does not unroll: a column at a time
    "1x1": ((1, 8, 20, 32, 1, 1), (1, 1), (0, 0, 0, 0)),
    "3x5": ((1, 9, 20, 32, 3, 5), (1, 1), (1, 2, 1, 2)),
    "stride_3": ((1, 20, 20, 32, 3, 3), (3, 3), (1, 1, 1, 1)),
    "batch_3": ((3, 9, 17, 32, 3, 3), (1, 1), (1, 1, 1, 1)),
    "pieces_across_images": ((4, 5, 11, 32, 3, 3), (1, 1), (1, 1, 1, 1)),  # pieces of 2 rows, maps of 5
}


@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(name, isa):
    (n, h, w, c, r, s), strides, pads = GEOMETRY[name]
    _check(isa, (n, h, w, c, c, r, s), strides=strides, pads=pads, activation="silu", residual="post")


def test_large_values_and_nan_propagate(isa):
    """Outputs far into both tails of SiLU and sigmoid, and a NaN input pixel that spoils the outputs
    whose windows hold it."""
    shape = (1, 10, 20, 16, 16, 3, 3)
    x, w, b, _ = conv_inputs(np.float32, shape, group=16)
    x *= 40
    x[0, 4, 4, 3] = np.nan
    for activation in ("silu", "sigmoid", "relu"):
        attrs = dict(pads=(1, 1, 1, 1), activation=activation, group=16)
        y = registry.cpu_fused_conv(x, w, b, kernel="depthwise", **attrs)
        ref = _reference(x, w, b, None, **attrs)
        assert np.array_equal(np.isnan(y), np.isnan(ref)), activation
        finite = ~np.isnan(ref)
        assert rel_l2(y[finite], ref[finite]) <= TOL, activation


@pytest.mark.parametrize("attrs, shape", [
    (dict(group=4, pads=(1, 1, 1, 1)), (1, 16, 16, 16, 16, 3, 3)),  # grouped, not depthwise
    (dict(group=16, pads=(1, 1, 1, 1)), (1, 16, 16, 16, 32, 3, 3)),  # two outputs a channel
    (dict(group=16, dilations=(2, 2), pads=(2, 2, 2, 2)), (1, 16, 16, 16, 16, 3, 3)),
    (dict(pads=(1, 1, 1, 1)), (1, 16, 16, 16, 16, 3, 3)),  # dense 3x3: Winograd's, but not when depthwise is forced
])
def test_other_problems_run_elsewhere(attrs, shape):
    """The depthwise kernel computes one output channel per input channel, undilated; selecting it leaves
    the rest to oneDNN."""
    assert registry.cpu_kernel_name(_desc(shape, **attrs), "depthwise").startswith("onednn ")
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, kernel="depthwise", **attrs)
    assert rel_l2(y, _reference(x, w, b, None, **attrs)) <= TOL


def test_auto_runs_the_faster_kernel_correctly():
    """"auto" times the depthwise kernel against oneDNN on the problem and runs the faster; both give the
    answer."""
    shape, attrs = (1, 28, 28, 96, 96, 7, 7), dict(pads=(3, 3, 3, 3), group=96, activation="gelu", residual="pre")
    name = registry.cpu_kernel_name(_desc(shape, **attrs))
    assert name.startswith("depthwise direct ") or name.startswith("onednn "), name
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    assert rel_l2(registry.cpu_fused_conv(x, w, b, z, **attrs), _reference(x, w, b, z, **attrs)) <= TOL


def test_ort_concurrent_first_runs_and_batches(monkeypatch):
    """Runs from several threads at once, from the very first (which times the depthwise kernel against
    oneDNN and keeps the filters of whichever wins), at two batch sizes: each gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.delenv("EPIFUSE_CPU_KERNEL", raising=False)
    shape, attrs = (1, 24, 24, 48, 48, 5, 5), dict(pads=(2, 2, 2, 2), group=48, activation="silu")
    _, w, b, _ = conv_inputs(np.float32, shape, group=48)
    b[:] = 0
    model = _fused_conv_model(shape, weights=w, **{**attrs, "pads": list(attrs["pads"])})
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(seed).standard_normal((1 + seed % 2, 24, 24, 48)).astype(np.float32)
              for seed in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda x: session.run(None, {"x": x})[0], inputs))
    for x, y in zip(inputs, outputs):
        assert rel_l2(y, _reference(x, w, b, None, **attrs)) <= TOL


@pytest.mark.parametrize("kernel", ["depthwise", "onednn"])
@pytest.mark.parametrize("name", ["mobilenetv3_tiny", "efficientnet_tiny", "convnext_tiny"])
def test_zoo_models_verify_on_each_kernel(name, kernel, monkeypatch):
    """Whole optimized models against ORT on the original, with every depthwise conv on the one kernel and
    then on the other (auto picks per shape by time, so either may run a layer)."""
    from models import zoo
    from optimizer.passes.load import validate
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)
    original = validate(zoo.build(name))
    optimized, _ = optimize_model(original, precision="fp32", target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert not any(n.op_type == "Conv" for n in optimized.graph.node)
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


BF16_SHAPES = {  # (N, H, W, C, R, S), strides, pads
    "3x3_s1_partial_vector": ((1, 13, 21, 40, 3, 3), (1, 1), (1, 1, 1, 1)),
    "5x5_s2": ((2, 15, 15, 72, 5, 5), (2, 2), (2, 2, 2, 2)),
    "3x5_a_column_at_a_time": ((1, 9, 20, 24, 3, 5), (1, 1), (1, 2, 1, 2)),
    "bands_of_channel_pairs": ((1, 14, 14, 968, 3, 3), (1, 1), (1, 1, 1, 1)),  # a block's input past L1
}


@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags(), reason="bf16 needs AVX-512 with BW and VL")
@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("name", sorted(BF16_SHAPES))
def test_bf16_widened_computed_in_fp32_and_rounded_once(name, residual, monkeypatch):
    """bfloat16 tensors: the kernel reads them widened (masked 16-bit loads for the partial vectors), keeps
    fp32 filters and sums, and rounds each output once, so it is within bf16's unit roundoff (2^-8) of the
    float64 result on the same bf16 values; and it is this kernel that runs them, not oneDNN's."""
    import ml_dtypes

    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    (n, h, w, c, r, s), strides, pads = BF16_SHAPES[name]
    shape = (n, h, w, c, c, r, s)
    attrs = dict(strides=strides, pads=pads, group=c, activation="silu", residual=residual)
    x, wt, b, z = (None if a is None else a.astype(ml_dtypes.bfloat16) for a in conv_inputs(np.float32, shape, **attrs))
    desc = dataclasses.replace(_desc(shape, **attrs), dtype=registry.BFLOAT16)
    assert registry.cpu_kernel_name(desc, "depthwise") == "depthwise direct avx512"
    y = registry.cpu_fused_conv(x, wt, b, z, kernel="depthwise", **attrs)
    ref = _reference(x, wt, b, z, **attrs)
    assert y.dtype == ml_dtypes.bfloat16 and rel_l2(y.astype(np.float64), ref) <= 2.0 ** -8
    onednn = registry.cpu_fused_conv(x, wt, b, z, kernel="onednn", **attrs)
    assert rel_l2(onednn.astype(np.float64), ref) <= 2.0 ** -7  # the same problem on oneDNN's kernel


def _is_amd_zen5() -> bool:
    """AMD family 26 (Zen 5), read from /proc/cpuinfo independently of the library's CPUID check."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return False
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", info, re.M)
    return bool(vendor and family and vendor.group(1) == "AuthenticAMD" and family.group(1) == "26")


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the untimed choice is AVX-512's")
@pytest.mark.parametrize("dtype", [registry.FLOAT, registry.BFLOAT16], ids=["fp32", "bf16"])
def test_auto_chooses_depthwise_layers_untimed(tmp_path, monkeypatch, dtype):
    """With AVX-512 no first-run timing against oneDNN (warm, in a loop, it picked oneDNN for layers the
    direct kernel runs faster in whole models): nothing timed, nothing kept in the tuning cache. The
    direct kernel, except fp32 layers on Zen 5, where oneDNN's measured faster."""
    if dtype == registry.BFLOAT16 and "avx512bw" not in cpu_flags():
        pytest.skip("the bf16 direct kernel needs AVX-512 BW")
    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuning.tsv"))
    desc = registry.ConvDesc.from_attributes(dtype, (1, 11, 11, 48), (48, 5, 5, 1), pads=(2, 2, 2, 2),
                                             group=48, activation="hardswish")
    name = registry.cpu_kernel_name(desc, "auto")
    if dtype == registry.FLOAT and _is_amd_zen5():
        assert name.startswith("onednn "), name
    else:
        assert name == "depthwise direct avx512", name
    assert not (tmp_path / "tuning.tsv").exists()


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the untimed choice is AVX-512's")
def test_auto_times_depthwise_widths_the_direct_kernel_runs_a_column_at_a_time(tmp_path, monkeypatch):
    """A filter width the direct kernel does not unroll (MixNet's merged 9x9 groups) is timed against oneDNN
    at the first run and the choice kept for the machine."""
    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuning.tsv"))
    desc = registry.ConvDesc.from_attributes(registry.FLOAT, (1, 15, 15, 48), (48, 9, 9, 1), pads=(4, 4, 4, 4),
                                             group=48, activation="hardswish")
    name = registry.cpu_kernel_name(desc, "auto")
    assert name == "depthwise direct avx512" or name.startswith("onednn "), name
    kept = (tmp_path / "tuning.tsv").read_text().strip().split("\t")[-1]  # key, then the choice
    assert kept == ("onednn" if name.startswith("onednn ") else "depthwise direct avx512"), kept
