"""The CPU FusedConv's Winograd F(2x2, 3x3) kernel (fp32, 3x3 stride 1; AVX-512 and AVX2, each where the
CPU has it), through the core C ABI and through ONNX Runtime, against a float64 numpy reference: every
activation and residual mode, tile grids with odd and tiny maps, every padding, channel counts that
leave partial vectors and several GEMM column blocks, batches, concurrent first runs; and where it does
not apply, the problem goes to the other kernels. Filters constant or changing between runs:
test_cpu_onednn.py, for each kernel that keeps a copy of them."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from conv_reference import fused_conv, rel_l2
from optimizer import registry
from optimizer.contract import ACTIVATIONS
from optimizer.registry import ConvDesc
from optimizer.runtime import session_options
from tests.helpers import conv_inputs, cpu_flags
from tests.test_cpu_onednn import PARAMS, _fused_conv_model


FLAGS = cpu_flags()
pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= FLAGS, reason="the Winograd kernel needs AVX2 and FMA")
TOL = 1e-5  # fp32, as for every CPU kernel


@pytest.fixture(params=["avx512", "avx2"])
def isa(request, monkeypatch):
    """Each ISA's kernel, AVX2's on an AVX-512 CPU too (EPIFUSE_CPU_ISA caps the one chosen)."""
    if request.param == "avx512" and "avx512f" not in FLAGS:
        pytest.skip("no AVX-512F on this CPU")
    if request.param == "avx2":
        monkeypatch.setenv("EPIFUSE_CPU_ISA", "avx2")
    else:
        monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    return request.param


def _reference(x, w, b, z, **attrs):
    return fused_conv(*(None if a is None else a.astype(np.float64) for a in (x, w, b, z)), **attrs)


def _desc(shape, **attrs) -> ConvDesc:
    n, h, w, c, k, r, s = shape
    return ConvDesc.from_attributes(registry.FLOAT, (n, h, w, c), (k, r, s, c // attrs.get("group", 1)), **attrs)


def check_kernel(kernel: str, name: str, shape, **attrs):
    """`kernel` (EPIFUSE_CPU_KERNEL's value) runs the problem as `name` and computes it within TOL of float64."""
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, z, kernel=kernel, **attrs)
    assert registry.cpu_kernel_name(_desc(shape, **attrs), kernel) == name
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL


def _check(isa, shape, **attrs):
    check_kernel("winograd", f"winograd F(2x2,3x3) {isa}", shape, **attrs)


@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_and_residual(activation, residual, isa):
    """The epilogue on the tile in registers: vector forms of the common activations, the others lane
    by lane; 20 input and 44 output channels end in partial vectors of either width."""
    _check(isa, (1, 17, 15, 20, 44, 3, 3), pads=(1, 1, 1, 1), activation=activation,
           activation_params=PARAMS.get(activation, ()), residual=residual)


# (N, H, W, C, K, 3, 3), pads: each exercises another part of the tiling
GEOMETRY = {
    "odd_map_last_tiles_half_written": ((1, 13, 7, 16, 16), (1, 1, 1, 1)),
    "no_padding": ((1, 12, 10, 32, 32), (0, 0, 0, 0)),
    "asymmetric_pads": ((1, 11, 9, 16, 32), (0, 2, 1, 0)),
    "pads_of_two_tiles_wholly_in_padding": ((1, 6, 6, 16, 16), (2, 2, 2, 2)),
    "one_pixel_input": ((1, 1, 1, 16, 16), (1, 1, 1, 1)),
    "three_channels": ((1, 20, 20, 3, 16), (1, 1, 1, 1)),
    "channels_not_a_vector": ((1, 18, 18, 21, 19), (1, 1, 1, 1)),
    "k_80_five_vectors": ((1, 16, 16, 64, 80), (1, 1, 1, 1)),
    "k_96_blocks_of_4_and_2": ((1, 10, 10, 32, 96), (1, 1, 1, 1)),
    "k_112_blocks_of_4_and_3": ((1, 10, 10, 16, 112), (1, 1, 1, 1)),
    "k_24_an_odd_count_of_avx2_vectors": ((1, 10, 10, 16, 24), (1, 1, 1, 1)),
    "wide_c_256": ((1, 20, 20, 256, 64), (1, 1, 1, 1)),
    "batch_tiles_span_images": ((3, 9, 11, 16, 32), (1, 1, 1, 1)),
    "many_blocks": ((2, 80, 80, 32, 32), (1, 1, 1, 1)),
}


@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(name, isa):
    (n, h, w, c, k), pads = GEOMETRY[name]
    _check(isa, (n, h, w, c, k, 3, 3), pads=pads, activation="silu", residual="post")


def test_large_values_and_nan_propagate(isa):
    """Outputs far into both tails of SiLU and sigmoid, and a NaN input pixel that spoils the outputs
    whose windows hold it."""
    shape = (1, 10, 10, 16, 16, 3, 3)
    x, w, b, _ = conv_inputs(np.float32, shape)
    x *= 40
    x[0, 4, 4, 3] = np.nan
    for activation in ("silu", "sigmoid", "relu"):
        y = registry.cpu_fused_conv(x, w, b, pads=(1, 1, 1, 1), activation=activation, kernel="winograd")
        ref = _reference(x, w, b, None, pads=(1, 1, 1, 1), activation=activation)
        assert np.array_equal(np.isnan(y), np.isnan(ref)), activation
        finite = ~np.isnan(ref)
        assert rel_l2(y[finite], ref[finite]) <= TOL, activation


@pytest.mark.parametrize("attrs, shape", [
    (dict(strides=(2, 2), pads=(1, 1, 1, 1)), (1, 16, 16, 16, 16, 3, 3)),
    (dict(dilations=(2, 2), pads=(2, 2, 2, 2)), (1, 16, 16, 16, 16, 3, 3)),
    (dict(group=4, pads=(1, 1, 1, 1)), (1, 16, 16, 16, 16, 3, 3)),
    (dict(group=16, pads=(1, 1, 1, 1)), (1, 16, 16, 16, 16, 3, 3)),  # depthwise: not the depthwise kernel either
    (dict(pads=(2, 2, 2, 2)), (1, 16, 16, 16, 16, 5, 5)),
    (dict(), (1, 16, 16, 16, 16, 1, 1)),
])
def test_other_problems_run_elsewhere(attrs, shape):
    """Winograd F(2x2, 3x3) computes 3x3 stride-1 dense convolutions only; selecting it leaves the rest
    to oneDNN."""
    assert registry.cpu_kernel_name(_desc(shape, **attrs), "winograd").startswith("onednn ")
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, kernel="winograd", **attrs)
    assert rel_l2(y, _reference(x, w, b, None, **attrs)) <= TOL


def test_auto_runs_the_faster_kernel_correctly():
    """"auto" times Winograd against oneDNN on the problem and runs the faster; both give the answer."""
    shape, attrs = (1, 40, 40, 64, 64, 3, 3), dict(pads=(1, 1, 1, 1), activation="hardswish", residual="pre")
    name = registry.cpu_kernel_name(_desc(shape, **attrs))
    assert name.startswith("winograd F(2x2,3x3) ") or name.startswith("onednn "), name
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    assert rel_l2(registry.cpu_fused_conv(x, w, b, z, **attrs), _reference(x, w, b, z, **attrs)) <= TOL


def test_ort_concurrent_first_runs(monkeypatch):
    """Runs from several threads at once, from the very first (which times Winograd against oneDNN and
    keeps the filters of whichever wins): each gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.delenv("EPIFUSE_CPU_KERNEL", raising=False)
    shape = (1, 24, 24, 32, 32, 3, 3)
    _, w, b, _ = conv_inputs(np.float32, shape)
    b[:] = 0
    session = ort.InferenceSession(_fused_conv_model(shape, weights=w, pads=[1, 1, 1, 1], activation="silu")
                                   .SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(seed).standard_normal((1, 24, 24, 32)).astype(np.float32) for seed in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda x: session.run(None, {"x": x})[0], inputs))
    for x, y in zip(inputs, outputs):
        assert rel_l2(y, _reference(x, w, b, None, pads=(1, 1, 1, 1), activation="silu")) <= TOL


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        registry.cpu_kernel_name(_desc((1, 8, 8, 16, 16, 3, 3), pads=(1, 1, 1, 1)), "fastest")


@pytest.mark.parametrize("kernel", ["winograd", "onednn"])
@pytest.mark.parametrize("name", ["yolo_tiny", "resnet_tiny", "act_zoo"])
def test_zoo_models_verify_on_each_kernel(name, kernel, monkeypatch):
    """Whole optimized models against ORT on the original, with every 3x3 stride-1 conv on the one kernel
    and then on the other (auto picks per shape by time, so either may run a layer)."""
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
