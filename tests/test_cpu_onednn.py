"""The CPU FusedConv on oneDNN, through the core C ABI and through ONNX Runtime: every activation and
residual mode and dtype against a float64 numpy reference, the ways the work is cut into chunks
(row pieces of one image, groups of whole images, strided convs whose last rows are never read),
and filters that are or are not constant between runs (for oneDNN and the Winograd kernel, both of
which keep a copy of constant filters). oneDNN is selected by name: "auto" may run
3x3 stride-1 fp32 problems on the Winograd kernel (test_cpu_winograd.py)."""
from __future__ import annotations

import importlib.metadata
import math
import os
import platform

import ml_dtypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conv_reference import fused_conv, output_size, rel_l2
from optimizer import registry
from tests.helpers import conv_inputs, cpu_flags
from optimizer.contract import ACTIVATIONS
from optimizer.registry import ConvDesc
from optimizer.runtime import session_options

ONEDNN = registry.onednn_version() != ""
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="library built without oneDNN")
TOL = {np.float32: 1e-5, np.float16: 2e-3, ml_dtypes.bfloat16: 1.6e-2}
ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, ml_dtypes.bfloat16: TensorProto.BFLOAT16}
# Non-default parameters where an activation takes some, so a swapped or dropped one shows.
PARAMS = {"leaky_relu": (0.2,), "clip": (-0.5, 0.75), "hardsigmoid": (0.3, 0.4), "elu": (0.7,)}


def test_built_with_onednn_where_its_package_is_installed():
    """`pip install .` brings onednn-cpu-gomp on x86-64 Linux; the library built then must use it."""
    try:
        importlib.metadata.distribution("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("onednn-cpu-gomp is not installed")
    if platform.machine() != "x86_64":
        pytest.skip("oneDNN's wheel is x86-64 only")
    assert registry.onednn_version().startswith("oneDNN 3.")


def _reference(x, w, b, z, **attrs):
    return fused_conv(*(None if a is None else a.astype(np.float64) for a in (x, w, b, z)), **attrs)


def _kernel(dtype, shape, kernel="onednn", **attrs) -> str:
    n, h, w, c, k, r, s = shape
    code = {np.float32: registry.FLOAT, np.float16: registry.FLOAT16, ml_dtypes.bfloat16: registry.BFLOAT16}[dtype]
    desc = ConvDesc.from_attributes(code, (n, h, w, c), (k, r, s, c // attrs.get("group", 1)), **attrs)
    return registry.cpu_kernel_name(desc, kernel)


# N=1, 24x24x16 -> 16, 3x3: enough work to be cut into row pieces on a machine of two or more threads.
ACT_SHAPE = (1, 24, 24, 16, 16, 3, 3)
# 7 output rows, which two threads would share 4 + 3: cut into pieces of output channels instead,
# each computed into a buffer (z's channels copied in) and copied out.
CHANNEL_PIECES_SHAPE = (1, 7, 7, 32, 64, 3, 3)


@needs_onednn
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", [ACT_SHAPE, CHANNEL_PIECES_SHAPE], ids=["row_pieces", "channel_pieces"])
def test_every_activation_and_residual(activation, residual, dtype, shape):
    attrs = dict(pads=(1, 1, 1, 1), activation=activation, activation_params=PARAMS.get(activation, ()),
                 residual=residual)
    x, w, b, z = conv_inputs(dtype, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, z, kernel="onednn", **attrs)
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL[dtype]
    kernel = _kernel(dtype, shape, **attrs)
    if dtype == np.float32:
        assert kernel.startswith("onednn "), kernel  # fp32 never falls back on an x86-64 CPU
    else:  # oneDNN where the CPU computes the 16-bit type natively, the reference kernel elsewhere
        assert kernel == "reference" or kernel.startswith("onednn "), kernel


# (shape N,H,W,C,K,R,S, attributes): each cuts the work another way.
GEOMETRY = {
    "row_pieces_stride2_asymmetric_pads": ((1, 33, 29, 16, 24, 3, 3), dict(strides=(2, 2), pads=(1, 0, 2, 1))),
    "row_pieces_dilated_7x7": ((1, 30, 30, 8, 16, 7, 7), dict(dilations=(2, 2), pads=(6, 6, 6, 6))),
    "image_groups": ((5, 16, 16, 16, 32, 3, 3), dict(pads=(1, 1, 1, 1))),
    # 1x1 stride 2 on an even height: the last input row is never read, so images go one at a time
    "unread_last_rows_batch3": ((3, 16, 16, 16, 64, 1, 1), dict(strides=(2, 2), residual="pre", activation="relu")),
    "unread_last_rows_batch2_small": ((2, 6, 6, 4, 8, 1, 1), dict(strides=(2, 2))),
    "padding_larger_than_a_piece": ((1, 20, 20, 8, 8, 3, 3), dict(pads=(5, 5, 5, 5))),
    "grouped": ((2, 14, 14, 32, 64, 3, 3), dict(group=4, pads=(1, 1, 1, 1), activation="silu")),
    "depthwise": ((1, 28, 28, 32, 32, 5, 5), dict(group=32, pads=(2, 2, 2, 2), activation="hardswish")),
    "channel_multiplier": ((1, 20, 20, 8, 16, 3, 3), dict(group=8, pads=(1, 1, 1, 1))),
    "too_small_to_split": ((1, 4, 4, 4, 4, 3, 3), dict(pads=(1, 1, 1, 1), residual="post", activation="tanh")),
    "stem_3_channels": ((1, 64, 64, 3, 16, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1), activation="silu")),
    # SiLU as cpu_epilogue's pass: row pieces of 5-channel rows, no multiple of 16 floats, the residual after it
    "silu_pass_tails_and_residual": ((1, 13, 7, 16, 5, 3, 3), dict(pads=(1, 1, 1, 1), activation="silu",
                                                                   residual="post")),
    # one output row: output-channel pieces; stride 2 reads 3 of 4 input rows
    "channel_pieces_one_row": ((1, 1, 9, 48, 96, 3, 3), dict(pads=(1, 1, 1, 1), residual="pre", activation="relu")),
    "channel_pieces_stride2": ((1, 14, 14, 64, 128, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1),
                                                                 activation="silu", residual="post")),
    # one pixel, filters large enough to split for (a squeeze-excite gate): uneven output-channel pieces
    # of multiples of 16, 128 + 112 and 112 + 88
    "channel_pieces_uneven_se_gate": ((1, 1, 1, 960, 240, 1, 1), dict(activation="relu")),
    "channel_pieces_uneven_residual": ((1, 1, 1, 240, 200, 1, 1), dict(activation="hardsigmoid",
                                                                       activation_params=(0.2, 0.5), residual="post")),
    # SiLU / GELU as a pass over outputs over 512 KB: more row pieces than threads (23, 23, 23, 21 rows;
    # 1600 pixels each), each piece's pass while its output is in cache
    "pass_pieces_3x3_silu_residual": ((1, 90, 90, 16, 40, 3, 3), dict(pads=(1, 1, 1, 1), activation="silu",
                                                                      residual="post")),
    "pass_pieces_1x1_gelu": ((1, 80, 80, 24, 48, 1, 1), dict(activation="gelu", residual="pre")),
    # a batch as large as the threads: each image's rows in two pieces (786 KB of output an image)
    "pass_pieces_batch2_3x3_silu": ((2, 64, 64, 16, 48, 3, 3), dict(pads=(1, 1, 1, 1), activation="silu")),
    # 1x1 whose filters outweigh its input (a 7x7 map's MLP layer): output-channel pieces, 256 + 244, so
    # that each thread streams only its share of the filters
    "channel_pieces_filters_larger_than_input": ((1, 7, 7, 384, 500, 1, 1), dict(activation="gelu",
                                                                                 residual="post")),
    # a 1x1 on 96 pixels or more with 1 MB of filters or more, outweighing its input: output-channel pieces
    # as matmuls writing their strided rows of y in place (304 + 296 channels), the residual read the same
    # way, before the activation in oneDNN and after it in the GELU pass row by row
    "in_place_pieces_residual_pre_relu": ((1, 14, 14, 448, 600, 1, 1), dict(activation="relu", residual="pre")),
    "in_place_pieces_gelu_pass_residual_post": ((1, 14, 14, 448, 600, 1, 1), dict(activation="gelu",
                                                                                  residual="post")),
    "in_place_pieces_identity": ((1, 12, 8, 512, 520, 1, 1), dict(activation="identity")),
    # 1x1, unit stride, no padding: one GEMM over all the pixels of every image, cut evenly
    "pixel_pieces_batch3_7x7": ((3, 7, 7, 64, 48, 1, 1), dict(activation="silu", residual="post")),
    "pixel_pieces_grouped": ((1, 7, 7, 64, 64, 1, 1), dict(group=4, residual="pre", activation="relu")),
}


@needs_onednn
@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(name):
    shape, attrs = GEOMETRY[name]
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    y = registry.cpu_fused_conv(x, w, b, z, kernel="onednn", **attrs)
    kernel = _kernel(np.float32, shape, **attrs)
    assert kernel.startswith("onednn ")
    if name.startswith("in_place") and os.cpu_count() > 1:  # one thread: one chunk, nothing to split
        assert kernel.startswith("onednn matmul "), kernel
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL[np.float32]


def test_reference_kernel_is_selectable(monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "reference")
    assert _kernel(np.float32, ACT_SHAPE, kernel="auto", pads=(1, 1, 1, 1)) == "reference"
    x, w, b, _ = conv_inputs(np.float32, ACT_SHAPE)
    y = registry.cpu_fused_conv(x, w, b)
    assert rel_l2(y, _reference(x, w, b, None)) <= TOL[np.float32]


def _fused_conv_model(shape, *, weights: np.ndarray | None, dtype=np.float32, **attrs) -> onnx.ModelProto:
    """One FusedConv; W an initializer when `weights` is given, else a graph input."""
    n, h, w, c, k, r, s = shape
    p = output_size(h, *attrs["pads"][::2], 1, r, 1)
    t = ONNX_TYPE[dtype]
    inputs = [helper.make_tensor_value_info("x", t, ["n", h, w, c])]
    inits = [helper.make_tensor("b", t, [k], np.zeros(k, np.float32).astype(dtype).tobytes(), raw=True)]
    if weights is None:
        inputs.append(helper.make_tensor_value_info("w", t, [k, r, s, c]))
    else:
        inits.append(helper.make_tensor("w", t, list(weights.shape), weights.astype(dtype).tobytes(), raw=True))
    node = helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="epifuse", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", t, ["n", p, p, k])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _session(model, monkeypatch, kernel):
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)  # read when the session creates its kernels
    return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


# Each kernel that keeps a copy of constant filters (oneDNN's reorder, Winograd's transform).
FILTER_KEEPING_KERNELS = [
    pytest.param("onednn", marks=needs_onednn),
    pytest.param("winograd", marks=pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(),
                                                      reason="the Winograd kernel needs AVX2 and FMA")),
]


@pytest.mark.parametrize("kernel", FILTER_KEEPING_KERNELS)
def test_ort_constant_filters_across_runs_and_batches(monkeypatch, kernel):
    """The filters reordered or transformed at the first run serve later runs, of other batch sizes too."""
    shape = (1, 20, 20, 16, 32, 3, 3)
    attrs = dict(pads=[1, 1, 1, 1], activation="silu")
    _, w, b, _ = conv_inputs(np.float32, shape)
    b[:] = 0
    session = _session(_fused_conv_model(shape, weights=w, **attrs), monkeypatch, kernel)
    rng = np.random.default_rng(1)
    for n in (1, 3, 1, 2):
        x = rng.standard_normal((n, 20, 20, 16)).astype(np.float32)
        y = session.run(None, {"x": x})[0]
        assert rel_l2(y, _reference(x, w, b, None, pads=(1, 1, 1, 1), activation="silu")) <= TOL[np.float32]


@pytest.mark.parametrize("kernel", FILTER_KEEPING_KERNELS)
def test_ort_filters_that_change_between_runs(monkeypatch, kernel):
    """W as a graph input: each run reorders or transforms the filters it is given, never a copy of earlier ones."""
    shape = (1, 20, 20, 16, 32, 3, 3)
    session = _session(_fused_conv_model(shape, weights=None, pads=[1, 1, 1, 1], activation="relu"), monkeypatch,
                       kernel)
    x = np.random.default_rng(2).standard_normal((2, 20, 20, 16)).astype(np.float32)
    b = np.zeros(32, np.float32)
    for seed in (3, 4):
        w = (np.random.default_rng(seed).standard_normal((32, 3, 3, 16)) / 12).astype(np.float32)
        y = session.run(None, {"x": x, "w": w})[0]
        assert rel_l2(y, _reference(x, w, b, None, pads=(1, 1, 1, 1), activation="relu")) <= TOL[np.float32]


def _silu_pass_isa() -> bool:
    flags = cpu_flags()
    return "avx512f" in flags or {"avx2", "fma"} <= flags


@needs_onednn
@pytest.mark.parametrize("isa", ["widest", "avx2"])
@pytest.mark.parametrize("k", [48, 45])
@pytest.mark.parametrize("activation, residual",
                         [("silu", "none"), ("silu", "post"), ("silu", "pre"), ("gelu", "none"), ("gelu", "post"),
                          ("gelu", "pre"), ("relu", "none")])
def test_silu_and_gelu_run_as_the_activation_pass_on_avx512_or_avx2(activation, residual, k, isa, monkeypatch):
    """oneDNN's swish and gelu_erf post-ops cost more than the conv on thin 1x1 layers: with AVX-512 (16 lanes)
    or AVX2 and FMA (8 lanes; EPIFUSE_CPU_ISA=avx2 picks it on an AVX-512 CPU), fp32 SiLU and GELU run as a
    pass over each piece's output (the name says so), with the same result, inputs of either sign and
    magnitude included; 45 output channels leave the vector loop a masked tail."""
    if isa == "avx2":
        if not {"avx2", "fma"} <= cpu_flags():
            pytest.skip("no AVX2 + FMA")
        monkeypatch.setenv("EPIFUSE_CPU_ISA", "avx2")
    shape = (1, 24, 23, 32, k, 1, 1)
    attrs = dict(activation=activation, residual=residual)
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    x[0, :2] = np.float32(40.0) * np.sign(x[0, :2])  # outputs far into both tails of the sigmoid and erf
    y = registry.cpu_fused_conv(x, w, b, z, kernel="onednn", **attrs)
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL[np.float32]
    in_pass = "activation pass" in _kernel(np.float32, shape, **attrs)
    assert in_pass == (activation in ("silu", "gelu") and _silu_pass_isa())


@needs_onednn
@pytest.mark.parametrize("isa", ["widest", "avx2"])
def test_the_gelu_pass_is_accurate_everywhere(isa, monkeypatch):
    """The pass's erf is a polynomial per piece of [0, 4): every value from -12 to 12 (a million of them, each
    piece boundary on the way), through a 1x1 conv by the identity, against GELU in double precision: within
    1e-6 of max(1, |gelu|), and exactly x or -0 far out."""
    if isa == "avx2":
        if not {"avx2", "fma"} <= cpu_flags():
            pytest.skip("no AVX2 + FMA")
        monkeypatch.setenv("EPIFUSE_CPU_ISA", "avx2")
    values = np.concatenate([np.linspace(-12, 12, 1 << 20), np.arange(0, 4.01, 0.125) * np.sqrt(2),
                             -np.arange(0, 4.01, 0.125) * np.sqrt(2), [1e4, -1e4, 3e38, -3e38]]).astype(np.float32)
    values = np.resize(values, (values.size + 15) // 16 * 16)
    x = values.reshape(1, -1, 1, 16)
    w = np.eye(16, dtype=np.float32).reshape(16, 1, 1, 16)
    y = registry.cpu_fused_conv(x, w, np.zeros(16, np.float32), None, kernel="onednn", activation="gelu")
    v = values.astype(np.float64)
    expected = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    err = np.abs(y.reshape(-1).astype(np.float64) - expected) / np.maximum(1, np.abs(expected))
    assert err.max() <= 1e-6, values[err.argmax()]
