"""Every CUDA kernel the registry lists for a problem, on fresh random inputs, against a float64
reference (torch on upcast inputs): outputs poisoned with NaN first and checked fully written;
relative L2 error bounded by dtype. Runs on the GPU machine (`pytest -m gpu`)."""
import dataclasses
import itertools

import numpy as np
import pytest

from optimizer import contract
from optimizer.registry import FLOAT16, ConvDesc

pytestmark = pytest.mark.gpu

REL_L2 = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
# TF32 kernels (float operands rounded to a 10-bit mantissa, fp32 sums), against the float64 reference of
# the unrounded fp32 inputs: each product is off by up to ~2^-10 relative
REL_L2_TF32 = 2e-3
ONNX_DTYPE = {"float32": 1, "float16": 10, "bfloat16": 16}


def _reference(x, w, b, z, act, params, residual, stride, pads, dil, group):
    """float64 on the GPU: torch.conv2d on NCHW views of the NHWC tensors, explicit padding."""
    import torch
    import torch.nn.functional as F

    xd = x.double().permute(0, 3, 1, 2)
    xd = F.pad(xd, (pads[1], pads[3], pads[0], pads[2]))
    wd = w.double().permute(0, 3, 1, 2)
    v = F.conv2d(xd, wd, b.double(), stride=stride, dilation=dil, groups=group).permute(0, 2, 3, 1)
    if residual == "pre":
        v = v + z.double()
    p = params or contract.ACTIVATIONS[act]
    f = {
        "identity": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
        "leaky_relu": lambda t: torch.where(t >= 0, t, p[0] * t), "clip": lambda t: t.clamp(p[0], p[1]),
        "silu": lambda t: t * torch.sigmoid(t), "hardsigmoid": lambda t: (p[0] * t + p[1]).clamp(0, 1),
        "hardswish": lambda t: t * (t / 6 + 0.5).clamp(0, 1), "gelu": lambda t: 0.5 * t * (1 + torch.erf(t / 2**0.5)),
        "gelu_tanh": lambda t: 0.5 * t * (1 + torch.tanh((2 / np.pi) ** 0.5 * (t + 0.044715 * t**3))),
        "mish": lambda t: t * torch.tanh(F.softplus(t)), "elu": lambda t: torch.where(t > 0, t, p[0] * torch.expm1(t)),
        "softplus": F.softplus,
    }[act]
    v = f(v)
    if residual == "post":
        v = v + z.double()
    return v


def _run_all(dtype, n, h, w_, c, k, r, s, *, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), group=1,
             act="silu", params=(), residual="none", seed=0, allow_tf32=0):
    import torch

    from optimizer import cuda

    tdtype = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, w_, c, device="cuda", generator=g).to(tdtype)
    wt = (torch.randn(k, r, s, c // group, device="cuda", generator=g) / (r * s * c // group) ** 0.5).to(tdtype)
    b = torch.randn(k, device="cuda", generator=g).to(tdtype)
    desc = ConvDesc(ONNX_DTYPE[dtype], n, h, w_, c, k, r, s, group, stride[0], stride[1], dil[0], dil[1], *pads,
                    act, tuple(params), residual, allow_tf32)
    p = (h + pads[0] + pads[2] - dil[0] * (r - 1) - 1) // stride[0] + 1
    q = (w_ + pads[1] + pads[3] - dil[1] * (s - 1) - 1) // stride[1] + 1
    z = torch.randn(n, p, q, k, device="cuda", generator=g).to(tdtype) if residual != "none" else None
    ref = _reference(x, wt, b, z, act, params, residual, stride, pads, dil, group)
    names = cuda.kernels(desc)
    assert names, "no kernel for a valid problem"
    results = {}
    for name in names:
        y = torch.full((n, p, q, k), float("nan"), device="cuda", dtype=tdtype)
        ws = torch.empty(max(cuda.workspace_size(name, desc), 1), device="cuda", dtype=torch.uint8)
        cuda.fused_conv(desc, x.data_ptr(), wt.data_ptr(), b.data_ptr(), z.data_ptr() if z is not None else None,
                        y.data_ptr(), kernel=name, workspace=ws.data_ptr(), workspace_bytes=ws.numel(),
                        stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert not torch.isnan(y).any(), f"{name}: output not fully written (or NaN)"
        err = float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))
        results[name] = err
    bad = {k_: e for k_, e in results.items() if not e <= (REL_L2_TF32 if "_tf32_" in k_ else REL_L2[dtype])}
    assert not bad, f"relative L2 over {REL_L2[dtype]} (TF32 kernels: {REL_L2_TF32}): {bad} (all: {results})"
    return results


SHAPES = [  # n, h, w, c, k, r, s, stride, pads, dil, group
    (1, 7, 9, 16, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (2, 15, 13, 64, 64, 3, 3, (2, 2), (1, 0, 2, 1), (1, 1), 1),
    (3, 11, 11, 32, 48, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 20, 17, 64, 128, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),
    (2, 12, 12, 16, 16, 3, 3, (3, 3), (2, 2, 2, 2), (2, 2), 1),
    (1, 33, 35, 3, 32, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),     # few-channel stem
    (2, 19, 23, 3, 24, 3, 3, (2, 1), (0, 2, 1, 1), (2, 1), 1),     # RGB stem: stride, dilation, asymmetric pads
    (1, 28, 30, 1, 16, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1),     # one channel (grayscale)
    (1, 16, 16, 4, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (2, 21, 18, 3, 20, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),     # stem, K % 8 != 0 (scalar stores)
    (1, 30, 31, 2, 96, 5, 5, (2, 2), (2, 1, 2, 1), (1, 1), 1),     # stem, two channel blocks, the second partial
    (1, 40, 37, 3, 64, 3, 3, (3, 1), (0, 4, 2, 0), (2, 3), 1),     # stem, stride 3x1, dilation 2x3
    (2, 17, 18, 3, 10, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),     # stem, K = 10: fp32's last quad partial
    (2, 9, 10, 12, 20, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),     # unaligned channels
    (2, 21, 19, 32, 40, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),    # C = 32: the 32-deep SM90 conv, 2 N tiles
    (2, 14, 14, 24, 36, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),    # grouped: 8 in, 12 out per group (cuda_direct)
    (2, 29, 27, 128, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),   # ResNeXt 4 per group: 8 groups per 32-wide CTA
    (2, 15, 16, 256, 256, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 32),   # ResNeXt 8 per group, stride 2
    (3, 9, 11, 512, 512, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),    # ResNeXt 16 per group
    (2, 7, 7, 1024, 1024, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 32),   # ResNeXt 32 per group, stride 2
    (2, 14, 15, 120, 120, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 5),    # RegNetY 24 per group: 3 CTAs of 8 each
    (1, 9, 9, 888, 888, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 37),     # RegNetY-1.6GF's last stage
    (1, 10, 9, 128, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),     # 64 per group: 2 CTAs of 32 per group
    (2, 10, 9, 64, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 16),     # grouped: 4 in, 8 out per group
    (1, 8, 9, 12, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),        # grouped K = 12: the last 8-wide tile half past K
    (2, 17, 15, 128, 128, 5, 3, (2, 1), (0, 1, 2, 0), (2, 1), 32),   # grouped: stride, dilation, asymmetric pads
    (2, 17, 19, 32, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),   # depthwise 3x3
    (1, 28, 28, 48, 48, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 48),   # depthwise 5x5 s2
    (2, 14, 14, 96, 96, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), 96),   # ConvNeXt 7x7
    (1, 10, 10, 8, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),     # depthwise multiplier 2
    (2, 13, 13, 32, 32, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 32),   # depthwise dilated
    (1, 23, 29, 64, 64, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), 64),   # depthwise 7x7, tile path (small grid)
    (4, 56, 57, 80, 80, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), 80),   # depthwise 7x7, wide tiles, last column tile partial
    (8, 33, 30, 64, 64, 3, 3, (1, 1), (0, 1, 2, 1), (1, 1), 64),   # depthwise 3x3, wide tiles, asymmetric pads
    (2, 19, 37, 24, 24, 5, 5, (1, 1), (1, 3, 3, 1), (1, 1), 24),   # depthwise 5x5, C = 24: half a channel slice
    (1, 23, 29, 64, 64, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 64),   # depthwise 7x7 s2, strip path
    (2, 17, 16, 40, 40, 3, 3, (2, 2), (0, 1, 1, 0), (1, 1), 40),   # depthwise s2 asymmetric pads
    (48, 14, 13, 64, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 64),  # depthwise 3x3 s1, narrow rows, full grid: strip
    (1, 9, 9, 1032, 1032, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1032),  # depthwise C > 512: channel split
    (1, 9, 11, 10, 10, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 10),    # depthwise C % 4 != 0: scalar only
    (3, 7, 7, 96, 96, 7, 7, (1, 1), (0, 0, 0, 0), (1, 1), 96),     # global 7x7 pool as a depthwise conv
    (2, 28, 28, 72, 72, 28, 28, (1, 1), (0, 0, 0, 0), (1, 1), 72),  # global 28x28: 4 pixel ranges, partial sums, part slice
    (16, 112, 112, 32, 32, 112, 112, (1, 1), (0, 0, 0, 0), (1, 1), 32),  # squeeze-excite pool 112x112: 49 ranges
    (901, 3, 5, 4, 4, 3, 5, (1, 1), (0, 0, 0, 0), (1, 1), 4),   # global, 901 images: two a block, the last alone
    (3, 5, 9, 34, 34, 5, 9, (2, 2), (0, 0, 0, 0), (1, 1), 34),     # global 5x9, strided, C = 34
    (2, 11, 12, 40, 40, 9, 9, (1, 1), (4, 4, 4, 4), (1, 1), 40),   # depthwise 9x9 (MixNet): vector kernel
    (1, 6, 40, 16, 16, 1, 5, (1, 2), (0, 2, 0, 2), (1, 1), 16),    # depthwise non-square, stride 1x2
    (1, 1, 1, 1152, 48, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),    # squeeze-excite 1x1 on one pixel (gemv)
    (32, 1, 1, 4, 96, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),      # excite, batch 32: C = 4 (scalar loads)
    (3, 2, 5, 37, 19, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),      # 30 pixels, odd C and K (gemv)
    (32, 1, 1, 1280, 1000, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # classifier, batch 32: GEMM tiles
    (24, 1, 1, 64, 400, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),    # gemv, 8 rows a warp
    (20, 1, 1, 96, 600, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),    # gemv, 16 rows a warp, the second block partial
    (4, 96, 96, 64, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),    # 288 tiles of 128x64: persistent CTAs loop
    (3, 60, 62, 64, 192, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),   # several N tiles, last M tile partial
    (1, 7, 7, 1024, 256, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),   # batch-1 1x1, 4 tiles x 16 k-tiles: 64-row tiles, stream-K
    (4, 96, 95, 64, 192, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),   # 1x1, 286 tiles of 256x128: CTAs loop, M and N partial
    (3, 13, 11, 96, 200, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 1x1, 429 pixels x 200 channels: 96/224-pixel and 128-channel tiles partial
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[3]}to{s[4]}_{s[5]}x{s[6]}_s{s[7][0]}_g{s[10]}" for s in SHAPES])
def test_shapes(dtype, shape):
    n, h, w_, c, k, r, s, stride, pads, dil, group = shape
    _run_all(dtype, n, h, w_, c, k, r, s, stride=stride, pads=pads, dil=dil, group=group)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act,residual", list(itertools.product(contract.ACTIVATIONS, ["none"]))
                         + [("relu", "pre"), ("silu", "post"), ("identity", "pre"), ("hardswish", "post")])
def test_activations_and_residuals(dtype, act, residual):
    params = {"leaky_relu": (0.1,), "clip": (-0.5, 1.5), "hardsigmoid": (0.25, 0.4), "elu": (0.7,)}.get(act, ())
    _run_all(dtype, 2, 12, 10, 64, 64, 3, 3, pads=(1, 1, 1, 1), act=act, params=params, residual=residual)
    _run_all(dtype, 2, 8, 8, 64, 128, 1, 1, act=act, params=params, residual=residual, seed=1)
    _run_all(dtype, 3, 1, 1, 40, 24, 1, 1, act=act, params=params, residual=residual, seed=2)  # gemv
    _run_all(dtype, 2, 10, 12, 32, 32, 3, 3, pads=(1, 1, 1, 1), group=32, act=act, params=params,  # depthwise tile
             residual=residual, seed=3)
    _run_all(dtype, 2, 9, 10, 128, 128, 3, 3, pads=(1, 1, 1, 1), group=32, act=act, params=params,  # grouped
             residual=residual, seed=4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("residual", ["none", "pre", "post"])
def test_grouped_kernels(dtype, residual):
    """The tensor-core grouped kernels (sm80 grouped_*) with each residual mode and several activations:
    ResNeXt-50 32x4d's 4 and 32 channels per group (several groups per CTA, one group per CTA) and
    RegNetY-1.6GF's 24 (a group over three CTAs), at stride 1 and 2."""
    from optimizer import cuda

    t = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    built = any(k.startswith(f"sm80_{t}_grouped_") for k in cuda.compiled_kernels())
    for seed, (n, hw, c, group, stride, act) in enumerate([
            (4, 28, 128, 32, 1, "relu"), (2, 14, 1024, 32, 2, "silu"), (2, 28, 120, 5, 2, "hardswish"),
            (1, 14, 336, 14, 1, "gelu"), (2, 16, 256, 32, 2, "leaky_relu")]):
        params = (0.1,) if act == "leaky_relu" else ()
        results = _run_all(dtype, n, hw, hw, c, c, 3, 3, stride=(stride, stride), pads=(1, 1, 1, 1), group=group,
                           act=act, params=params, residual=residual, seed=seed)
        assert not built or any(k.startswith(f"sm80_{t}_grouped_") for k in results), results


@pytest.mark.parametrize("residual", ["none", "pre", "post"])
def test_tf32_kernels(residual):
    """fp32 nodes with allow_tf32: the TF32 kernels (sm80_tf32_*, and sm90_tf32_* on SM90) run, within
    REL_L2_TF32 of float64 and within twice the error of cuDNN's own TF32 conv (torch, allow_tf32) on the
    same inputs; the other fp32 kernels stay within fp32's bound. Without allow_tf32 no TF32 kernel is
    offered."""
    import torch
    import torch.nn.functional as F

    from optimizer import cuda

    compiled = cuda.compiled_kernels()
    built = any(k.startswith("sm80_tf32_") for k in compiled)
    sm90 = torch.cuda.get_device_capability() == (9, 0) and any(k.startswith("sm90_tf32_") for k in compiled)
    for seed, (n, hw, c, k, rs, stride, act) in enumerate([
            (1, 14, 64, 64, 3, 1, "relu"), (8, 28, 128, 256, 1, 1, "silu"), (2, 29, 64, 128, 3, 2, "hardswish"),
            (1, 7, 512, 2048, 1, 1, "identity"), (4, 56, 64, 64, 3, 1, "gelu"),
            (2, 20, 64, 96, 3, 1, "silu"), (1, 14, 256, 512, 1, 1, "relu"),  # the _silu / _relu twins
            (1, 7, 512, 512, 3, 1, "relu"),  # few output tiles, a long reduction: split-K's 16 slices
            (2, 10, 12, 20, 3, 1, "relu")]):  # fp32 rows of 16 bytes at 4 channels: C, K not multiples of 8
        pads = (rs // 2,) * 4
        results = _run_all("float32", n, hw, hw, c, k, rs, rs, stride=(stride, stride), pads=pads, act=act,
                           residual=residual, seed=seed, allow_tf32=1)
        tf32 = {name: e for name, e in results.items() if "_tf32_" in name}
        assert not built or tf32, results
        assert not sm90 or any(name.startswith("sm90_tf32_") for name in tf32), results
        strict = _run_all("float32", n, hw, hw, c, k, rs, rs, stride=(stride, stride), pads=pads, act=act,
                          residual=residual, seed=seed)
        assert not any("_tf32_" in name for name in strict)
        # cuDNN's TF32 on the same problem (conv only: the epilogue adds no error of its own to speak of)
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(n, c, hw, hw, device="cuda", generator=g)
        w = torch.randn(k, c, rs, rs, device="cuda", generator=g) / (rs * rs * c) ** 0.5
        ref = F.conv2d(x.double(), w.double(), stride=stride, padding=rs // 2)
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        try:
            cudnn = F.conv2d(x, w, stride=stride, padding=rs // 2)
        finally:
            torch.backends.cudnn.allow_tf32 = before
        cudnn_err = float((cudnn.double() - ref).norm() / ref.norm())
        if cudnn_err > 1e-4:  # cuDNN chose a TF32 algorithm: ours within twice its error
            assert all(e <= 2 * cudnn_err for e in tf32.values()), (tf32, cudnn_err)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("residual", ["pre", "post"])
def test_persistent_kernels_with_residual(dtype, residual):
    """Enough tiles that each persistent CTA (and each of a ping-pong CTA's math warp groups) runs
    several, each loading its own residual tile; K = 192: N tiles of 64 and a partial one of 128."""
    _run_all(dtype, 4, 48, 50, 64, 192, 3, 3, pads=(1, 1, 1, 1), act="hardswish", residual=residual, seed=4)


@pytest.mark.parametrize("residual", ["pre", "post"])
def test_residual_depthwise_and_fp32(residual):
    _run_all("float32", 2, 9, 9, 16, 16, 3, 3, pads=(1, 1, 1, 1), group=16, residual=residual, act="relu")
    _run_all("float16", 1, 9, 9, 16, 32, 3, 3, pads=(1, 1, 1, 1), residual=residual, act="mish")
    _run_all("bfloat16", 2, 14, 15, 96, 96, 7, 7, pads=(3, 3, 3, 3), group=96, residual=residual, act="silu")
    _run_all("float16", 3, 7, 7, 96, 96, 7, 7, group=96, residual=residual, act="hardswish")  # global
    _run_all("float32", 2, 40, 40, 64, 64, 40, 40, group=64, residual=residual, act="silu")  # global, split map


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("residual", ["pre", "post"])
def test_rgb_stems_with_residual(dtype, residual):
    """Few-channel stems (the stem kernels, im2col + GEMM, channel padding, few-channel kernels) with Z:
    stride, dilation and asymmetric pads; then ResNet-50's stem at batch 5, which the im2col kernels run
    in chunks of 4 images and 1 (the last chunk's Y and Z at an offset); then EfficientNet-B0's."""
    ran = _run_all(dtype, 2, 19, 23, 3, 24, 3, 3, stride=(2, 1), pads=(0, 2, 1, 1), dil=(2, 1), act="relu",
                   residual=residual)
    ran.update(_run_all(dtype, 5, 224, 224, 3, 64, 7, 7, stride=(2, 2), pads=(3, 3, 3, 3), act="silu",
                        residual=residual, seed=2))
    ran.update(_run_all(dtype, 3, 224, 224, 3, 32, 3, 3, stride=(2, 2), pads=(1, 1, 1, 1), act="silu",
                        residual=residual, seed=3))
    assert ("cuda_stem_ffma" if dtype == "float32" else "cuda_stem_mma") in ran, ran


def test_a_kernel_that_cannot_run_the_problem_is_refused():
    import torch

    from optimizer import cuda

    desc = ConvDesc(1, 1, 8, 8, 12, 21, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, "relu", (), "none")
    t = torch.zeros(4096, device="cuda")
    with pytest.raises(cuda.CudaKernelError, match="cannot run|unknown kernel"):
        cuda.fused_conv(desc, t.data_ptr(), t.data_ptr(), t.data_ptr(), None, t.data_ptr(), kernel="cuda_depthwise_scalar")


@pytest.mark.parametrize("kernel", ["sm90_f16_conv_128x64x64_c1x1_pingpong_silu", "sm90_f16_gemm1x1_128x128_coop_silu",
                                    "sm90_f16_conv_64x64x64_c1x1_2cta_silu"])
def test_a_two_activation_kernel_refuses_other_activations(kernel):
    """The _silu kernels' epilogues carry Identity and SiLU only: a Relu node is refused with the reason,
    never run with the wrong activation."""
    import torch

    from optimizer import cuda

    if kernel not in cuda.kernels(ConvDesc(FLOAT16, 2, 8, 8, 64, 64, 1, 1, activation="silu")) + \
            cuda.kernels(ConvDesc(FLOAT16, 2, 8, 8, 64, 64, 3, 3, pad_top=1, pad_left=1, pad_bottom=1, pad_right=1,
                                  activation="silu")):
        pytest.skip(f"{kernel} not in this build (sm_90a only)")
    r = 1 if "gemm" in kernel else 3
    desc = ConvDesc(FLOAT16, 2, 8, 8, 64, 64, r, r, pad_top=r // 2, pad_left=r // 2, pad_bottom=r // 2,
                    pad_right=r // 2, activation="relu")
    t = torch.zeros(1 << 16, device="cuda")
    with pytest.raises(cuda.CudaKernelError, match="silu"):
        cuda.fused_conv(desc, t.data_ptr(), t.data_ptr(), t.data_ptr(), None, t.data_ptr(), kernel=kernel)


def test_a_residual_free_kernel_refuses_a_residual():
    """The _nores GEMM's epilogue has no C operand: the registry never offers it for a problem with a
    residual, and forcing it fails with the reason instead of dropping Z."""
    import torch

    from optimizer import cuda

    kernel = "sm90_f16_gemm1x1_256x128_coop_silu_nores"
    plain = ConvDesc(FLOAT16, 2, 8, 8, 64, 64, 1, 1, activation="silu")
    if kernel not in cuda.kernels(plain):
        pytest.skip(f"{kernel} not in this build (sm_90a only)")
    with_z = dataclasses.replace(plain, residual="post")
    assert kernel not in cuda.kernels(with_z)
    t = torch.zeros(1 << 16, device="cuda")
    with pytest.raises(cuda.CudaKernelError, match="residual"):
        cuda.fused_conv(with_z, t.data_ptr(), t.data_ptr(), t.data_ptr(), t.data_ptr(), t.data_ptr(), kernel=kernel)


@pytest.mark.parametrize("shape", [(4, 28, 28, 64, 3), (8, 14, 14, 128, 3), (8, 28, 28, 128, 1), (1, 7, 7, 256, 1)],
                         ids=["3x3_k64", "3x3_k128", "1x1_m6272", "1x1_b1"])
def test_programmatic_dependent_launch_keeps_chains_exact(monkeypatch, shape):
    """EPIFUSE_PDL=1 launches the SM90 kernels so that each may start while the one before it drains:
    a chain of 12 launches, each reading the previous output (NaN until written), on one stream without
    synchronisation, must match the same chain launched normally (a missing wait reads NaN)."""
    import torch

    from optimizer import cuda

    n, h, w_, c, r = shape
    desc = ConvDesc(ONNX_DTYPE["float16"], n, h, w_, c, c, r, r, 1, 1, 1, 1, 1, r // 2, r // 2, r // 2, r // 2,
                    "tanh", (), "post")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(n, h, w_, c, device="cuda", generator=g).half()
    wt = (torch.randn(c, r, r, c, device="cuda", generator=g) / (r * r * c) ** 0.5).half()
    b = torch.randn(c, device="cuda", generator=g).half()
    names = [k for k in cuda.kernels(desc) if k.startswith("sm90_")]
    assert names, cuda.kernels(desc)
    stream = torch.cuda.current_stream().cuda_stream

    def chain(name):
        ws = torch.empty(max(cuda.workspace_size(name, desc), 1), device="cuda", dtype=torch.uint8)
        outs = [x] + [torch.full_like(x, float("nan")) for _ in range(12)]
        for prev, out in zip(outs, outs[1:]):  # Z = the previous output too: the epilogue's load waits as well
            cuda.fused_conv(desc, prev.data_ptr(), wt.data_ptr(), b.data_ptr(), prev.data_ptr(), out.data_ptr(),
                            kernel=name, workspace=ws.data_ptr(), workspace_bytes=ws.numel(), stream=stream)
        torch.cuda.synchronize()
        return outs[-1]

    for name in names:
        monkeypatch.delenv("EPIFUSE_PDL", raising=False)
        expected = chain(name)
        monkeypatch.setenv("EPIFUSE_PDL", "1")
        assert not torch.isnan(expected).any(), name
        for _ in range(3):  # stream-K may sum its partial tiles in another order: not bit-exact
            torch.testing.assert_close(chain(name), expected, rtol=2e-3, atol=2e-3, msg=name)
