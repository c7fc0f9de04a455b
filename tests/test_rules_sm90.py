"""Rules of the CUTLASS 3.x SM90 kernels (plugins/core/rules_sm90.cc) through libepifuse_core.so's
C ABI, on the CPU: which problems each SM90 configuration accepts, and the order (best first).

With ``registry.kernel_names`` (epifuse_kernel_names) the SM90 names a problem gets are compared
with the expected list; without it, the tests compare kernel counts of problem pairs that differ
only in one SM90 limit (stride, padding, TMA im2col corners, filter span, 1x1 shape, alignment),
which no other kernel family looks at.
"""
from __future__ import annotations

import dataclasses

import pytest

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc
from tests.helpers import sm90_manifest

CUDA_TARGETS = ("ort-cuda", "tensorrt")
# From the manifest (plugins/kernels/sm90/kernels.def), in registry order.
# GEMM: (name, the one activation besides identity its epilogue carries (None: all 14), residual input)
# CONV: (name, N tile, the one activation besides identity its epilogue carries (None: all 14))
# each for the 16-bit twins (F16_BF16 lines) and for fp32 as TF32 (F32_TF32 lines).
_ACTS = {"ANY": None, "RELU": "relu", "SILU": "silu"}


def _lines(kind: str, dtypes: str) -> list[dict]:
    return [e for e in sm90_manifest() if e["kind"] == kind and e["dtypes"] == dtypes]


def _gemms(dtypes):
    return tuple((e["name"], _ACTS[e["acts"]], e["residual"] == "RESIDUAL") for e in _lines("GEMM", dtypes))


def _convs(dtypes):
    return tuple((e["name"], int(e["tile_n"]), _ACTS[e["acts"]]) for e in _lines("CONV", dtypes))


GEMM, CONV = _gemms("F16_BF16"), _convs("F16_BF16")
TF32_GEMM, TF32_CONV = _gemms("F32_TF32"), _convs("F32_TF32")
DT = {FLOAT16: "f16", BFLOAT16: "bf16"}
INT32_MAX = 2**31 - 1


def _names_available() -> bool:
    try:
        registry.kernel_names("ort-cuda", ConvDesc(FLOAT16, 1, 8, 8, 8, 8, 1, 1))
        return True
    except (AttributeError, TypeError):
        return False


HAVE_NAMES = hasattr(registry, "kernel_names") and _names_available()


def _out(size, pb, pe, dil, k, stride):
    return (size + pb + pe - dil * (k - 1) - 1) // stride + 1


def expected(d: ConvDesc) -> list[str]:
    """The SM90 kernels that must accept `d`, best first (a mirror of rules_sm90.cc)."""
    if d.dtype == FLOAT and d.allow_tf32:  # fp32 only as TF32, for nodes that allow it
        dt, gemm_lines, conv_lines, size = "tf32", TF32_GEMM, TF32_CONV, 4
    elif d.dtype in DT:
        dt, gemm_lines, conv_lines, size = DT[d.dtype], GEMM, CONV, 2
    else:
        return []
    row = 16 // size  # elements per 16-byte row
    if d.group != 1 or min(d.C, d.K, d.R, d.S) < 0 or d.C % row or d.K % row:
        return []
    if max(d.N, d.H, d.W, d.C, d.K, d.R, d.S) > INT32_MAX:
        return []
    names = []
    pads = (d.pad_top, d.pad_left, d.pad_bottom, d.pad_right)
    known_nhw = min(d.N, d.H, d.W) >= 0
    if (d.R, d.S, d.stride_h, d.stride_w, pads) == (1, 1, 1, 1, (0, 0, 0, 0)) and \
            not (known_nhw and d.N * d.H * d.W > INT32_MAX):
        names += [f"sm90_{dt}_{g}" for g, act, residual in gemm_lines if (act is None or d.activation in ("identity", act))
                  and (residual or d.residual == "none")]
    ok = max(d.stride_h, d.stride_w) <= 8 and all(0 <= p <= 256 for p in pads)
    ok &= d.pad_top <= 128 and d.pad_left <= 128
    for extent, dil, pad_end in ((d.R, d.dil_h, d.pad_bottom), (d.S, d.dil_w, d.pad_right)):
        span = (extent - 1) * dil
        ok &= span <= 254 and -128 <= pad_end - span <= 127
    if known_nhw:
        p = _out(d.H, d.pad_top, d.pad_bottom, d.dil_h, d.R, d.stride_h)
        q = _out(d.W, d.pad_left, d.pad_right, d.dil_w, d.S, d.stride_w)
        ok &= d.N * p * q <= INT32_MAX and d.H * d.W * d.C * size < 2**40 and p * q * d.K * size < 2**40
    for conv, tile_n, act in conv_lines:
        if ok and -(-d.K // tile_n) <= 65535 and (act is None or d.activation in ("identity", act)):
            names.append(f"sm90_{dt}_{conv}")
    return names


def sm90_names(target: str, d: ConvDesc) -> list[str]:
    return [n for n in registry.kernel_names(target, d) if n.startswith("sm90_")]


def f16(shape, r=3, s=None, **kw) -> ConvDesc:
    n, h, w, c, k = shape
    return ConvDesc(FLOAT16, n, h, w, c, k, r, r if s is None else s, **kw)


# The anchor layers (shared/docs/anchors.md) and the cases the GPU tests run.
ANCHORS = {
    "r50.s1.3x3": f16((32, 56, 56, 64, 64), pad_top=1, pad_left=1, pad_bottom=1, pad_right=1),
    "r50.s1.1x1up": f16((32, 56, 56, 64, 256), r=1),
    "r50.s3.1x1dn": f16((32, 14, 14, 1024, 256), r=1),
    "r50.s4.1x1up": f16((32, 7, 7, 512, 2048), r=1),
    "y8s.80.3x3s2": f16((8, 160, 160, 128, 128), stride_h=2, stride_w=2, pad_top=1, pad_left=1, pad_bottom=1,
                        pad_right=1),
    "y8s.b1.80.3x3": f16((1, 80, 80, 128, 128), pad_top=1, pad_left=1, pad_bottom=1, pad_right=1),
    "asym_pads_dil2_odd": f16((1, 13, 11, 24, 40), pad_top=0, pad_left=2, pad_bottom=3, pad_right=1, dil_h=2,
                              dil_w=2),
    "stride2_1x1_downsample": f16((4, 28, 28, 256, 512), r=1, stride_h=2, stride_w=2),
    "symbolic_batch_1x1": f16((-1, -1, -1, 64, 64), r=1, activation="silu", residual="post"),
    "stride8": f16((2, 64, 64, 16, 16), stride_h=8, stride_w=8),
    "pad128": f16((1, 8, 8, 8, 8), pad_top=128, pad_left=128, pad_bottom=0, pad_right=0),
    "big_dilation": f16((1, 300, 300, 8, 8), dil_h=127, dil_w=1),  # (R-1)*dil = 254
    "stem_c3": f16((32, 224, 224, 3, 64), r=7, stride_h=2, stride_w=2, pad_top=3, pad_left=3, pad_bottom=3,
                   pad_right=3),
    "depthwise": f16((1, 8, 8, 32, 32), group=32),
}


def test_expected_lists_are_what_the_brief_says():
    convs = [f"sm90_f16_{c}" for c in (
        "conv_128x64x64_c1x1_pingpong_relu", "conv_128x64x64_c1x1_pingpong_silu", "conv_128x64x64_c1x1_pingpong",
        "conv_64x64x64_c1x1_2cta_relu", "conv_64x64x64_c1x1_2cta_silu",
        "conv_128x128x64_c1x1_pingpong_silu", "conv_128x128x64_c1x1_pingpong", "conv_128x32x32_c1x1_pingpong",
        "conv_128x64x64_c2x1_2cta", "conv_128x64x64_c2x1", "conv_128x128x64_c1x1", "conv_128x32x32_c2x1_2cta_relu",
        "conv_128x32x32_c2x1_2cta")]
    gemms = [f"sm90_f16_{g}" for g in (
        "gemm1x1_128x128_coop", "gemm1x1_128x128_pingpong", "gemm1x1_128x128_streamk", "gemm1x1_128x64_pingpong")]
    relu, silu = ("_relu",), ("_silu",)
    only = lambda names, drop: [n for n in names if not n.endswith(drop)]  # noqa: E731
    assert expected(ANCHORS["r50.s1.1x1up"]) == [  # identity: both kinds of two-activation kernels
        "sm90_f16_gemm1x1_128x128_coop_relu", "sm90_f16_gemm1x1_128x128_coop_silu", "sm90_f16_gemm1x1_256x128_coop_relu",
        "sm90_f16_gemm1x1t_128x224_coop_silu_nores", "sm90_f16_gemm1x1_256x128_coop_silu_nores",
        "sm90_f16_gemm1x1t_128x96_coop_silu_nores"] + gemms + convs
    assert expected(dataclasses.replace(ANCHORS["r50.s1.1x1up"], activation="silu")) == [
        "sm90_f16_gemm1x1_128x128_coop_silu", "sm90_f16_gemm1x1t_128x224_coop_silu_nores",
        "sm90_f16_gemm1x1_256x128_coop_silu_nores", "sm90_f16_gemm1x1t_128x96_coop_silu_nores"] + gemms + only(convs, relu)
    assert expected(dataclasses.replace(ANCHORS["r50.s1.1x1up"], activation="relu")) == [
        "sm90_f16_gemm1x1_128x128_coop_relu", "sm90_f16_gemm1x1_256x128_coop_relu"] + gemms + only(convs, silu)
    assert expected(dataclasses.replace(ANCHORS["r50.s1.1x1up"], activation="hardswish")) == gemms + only(
        convs, relu + silu)
    assert expected(ANCHORS["r50.s1.3x3"]) == convs
    assert expected(dataclasses.replace(ANCHORS["r50.s1.3x3"], dtype=BFLOAT16)) == [
        n.replace("_f16_", "_bf16_") for n in convs]
    assert expected(ANCHORS["stride2_1x1_downsample"]) == convs
    for name in ("stem_c3", "depthwise"):
        assert expected(ANCHORS[name]) == []
    assert expected(dataclasses.replace(ANCHORS["r50.s1.3x3"], dtype=FLOAT)) == []
    tf32 = dataclasses.replace(ANCHORS["r50.s1.1x1up"], dtype=FLOAT, allow_tf32=1)
    tf32_convs = [f"sm90_tf32_{c}" for c in (
        "conv_128x64x32_c1x1_pingpong_relu", "conv_128x64x32_c1x1_pingpong_silu", "conv_128x64x32_c1x1_pingpong",
        "conv_128x64x32_c2x1_2cta", "conv_64x64x32_c1x1_2cta")]
    assert expected(tf32) == [  # identity: both two-activation twins
        "sm90_tf32_gemm1x1_128x128x32_coop_relu", "sm90_tf32_gemm1x1_128x128x32_coop_silu",
        "sm90_tf32_gemm1x1_128x128x32_coop", "sm90_tf32_gemm1x1_128x64x32_pingpong",
        "sm90_tf32_gemm1x1_128x128x32_streamk"] + tf32_convs
    assert expected(dataclasses.replace(tf32, activation="gelu")) == [
        "sm90_tf32_gemm1x1_128x128x32_coop", "sm90_tf32_gemm1x1_128x64x32_pingpong",
        "sm90_tf32_gemm1x1_128x128x32_streamk"] + only(tf32_convs, relu + silu)
    assert expected(dataclasses.replace(ANCHORS["r50.s1.3x3"], dtype=FLOAT, allow_tf32=1,
                                        activation="relu")) == only(tf32_convs, silu)
    # fp32 rows are 16 bytes at 4 channels: C = 12 fits TF32 but not the 16-bit kernels
    assert len(expected(dataclasses.replace(ANCHORS["r50.s1.3x3"], C=12, dtype=FLOAT, allow_tf32=1))) == 5
    assert expected(dataclasses.replace(ANCHORS["r50.s1.3x3"], C=12)) == []


@pytest.mark.skipif(not HAVE_NAMES, reason="registry.kernel_names / epifuse_kernel_names not in this build")
@pytest.mark.parametrize("target", CUDA_TARGETS)
@pytest.mark.parametrize("dtype,allow_tf32", [(FLOAT16, 0), (BFLOAT16, 0), (FLOAT, 0), (FLOAT, 1)])
@pytest.mark.parametrize("case", sorted(ANCHORS))
def test_names(case, dtype, allow_tf32, target):
    """The set the rules accept; the order is the registry's unless a `preferred` rule applies
    (test_untuned_conv_choice_follows_the_measured_winners)."""
    d = dataclasses.replace(ANCHORS[case], dtype=dtype, allow_tf32=allow_tf32)
    assert sorted(sm90_names(target, d)) == sorted(expected(d))


PAD1 = dict(pad_top=1, pad_left=1, pad_bottom=1, pad_right=1)


@pytest.mark.skipif(not HAVE_NAMES, reason="registry.kernel_names / epifuse_kernel_names not in this build")
@pytest.mark.parametrize("desc,first", [
    (ANCHORS["r50.s1.3x3"], "conv_128x64x64_c1x1_pingpong_relu"),                  # 784 tiles of 128x64
    (f16((8, 160, 160, 64, 64), activation="silu", **PAD1), "conv_128x64x64_c1x1_pingpong_silu"),  # y8s.160.3x3
    (f16((1, 160, 160, 32, 32), **PAD1), "conv_128x32x32_c2x1_2cta_relu"),          # C <= 32: the 32-deep k-step
    (f16((32, 160, 160, 32, 32), **PAD1), "conv_128x32x32_c2x1_2cta_relu"),
    (f16((32, 320, 320, 32, 64), stride_h=2, stride_w=2, **PAD1), "conv_128x64x64_c1x1_pingpong_relu"),  # K = 64
    (f16((32, 14, 14, 256, 256), **PAD1), "conv_128x64x64_c1x1_pingpong_relu"),     # r50.s3.3x3
    (ANCHORS["y8s.80.3x3s2"], "conv_128x64x64_c1x1_pingpong_relu"),
    (f16((8, 40, 40, 256, 256), **PAD1), "conv_128x64x64_c1x1_pingpong_relu"),      # y8s.40.3x3
    (ANCHORS["y8s.b1.80.3x3"], "conv_128x64x64_c1x1_pingpong_relu"),
    (f16((1, 28, 28, 128, 128), **PAD1), "conv_64x64x64_c1x1_2cta_relu"),      # r50.b1.s2.3x3: 14 tiles
    (f16((32, 7, 7, 512, 512), **PAD1), "conv_128x64x64_c1x1_pingpong_relu"),      # ResNet-50 b32 7x7x512
    (f16((1, 80, 80, 64, 64), **PAD1), "conv_64x64x64_c1x1_2cta_relu"),        # YOLO b1, 50 tiles
    (f16((1, 80, 80, 128, 128), activation="silu", **PAD1), "conv_128x64x64_c1x1_pingpong_silu"),  # 100 tiles
    (f16((1, 80, 80, 64, 64), activation="hardswish", **PAD1), "conv_128x64x64_c1x1_pingpong"),
    (f16((-1, 56, 56, 64, 64), **PAD1), "conv_128x64x64_c1x1_pingpong_relu"),       # symbolic batch: registry order
    (ANCHORS["r50.s1.1x1up"], "gemm1x1_256x128_coop_relu"),                    # the GEMMs keep large 1x1s
    (f16((32, 56, 56, 64, 256), r=1, activation="silu"), "gemm1x1_256x128_coop_silu_nores"),
    (f16((32, 56, 56, 64, 256), r=1, activation="gelu"), "gemm1x1_128x128_coop"),  # all 14 activations
    (f16((32, 14, 14, 1024, 256), r=1, activation="relu"), "gemm1x1_128x128_coop_relu"),  # 50 tiles of 256x128
    (f16((32, 14, 14, 1024, 256), r=1, activation="silu"), "gemm1x1t_128x96_coop_silu_nores"),  # 132 of 128x96
    (f16((32, 7, 7, 512, 2048), r=1), "gemm1x1_256x128_coop_relu"),            # 112 tiles of 256x128
    (f16((32, 7, 7, 512, 2048), r=1, activation="silu"), "gemm1x1t_128x224_coop_silu_nores"),  # 112 of 128x224
    (f16((32, 7, 7, 512, 2048), r=1, activation="silu", residual="post"), "gemm1x1_128x128_coop_silu"),
    (f16((1, 56, 56, 256, 128), r=1), "conv_64x64x64_c1x1_2cta_relu"),         # batch-1 1x1: 25 wide tiles
    (f16((1, 7, 7, 512, 2048), r=1), "conv_64x64x64_c1x1_2cta_relu"),          # 16 wide tiles
    (f16((1, 7, 7, 512, 2048), r=1, activation="gelu"), "conv_128x64x64_c2x1"),  # no 64-row kernel for GELU
    (ANCHORS["stride2_1x1_downsample"], "conv_64x64x64_c1x1_2cta_relu"),       # strided 1x1: a conv, 56 tiles
], ids=["r50.s1.3x3", "y8s.160.3x3", "y8s.b1.160x32", "y8s.b32.160x32", "y8s.b32.320x32s2", "r50.s3.3x3", "y8s.80.3x3s2", "y8s.40.3x3",
        "y8s.b1.80.3x3", "r50.b1.s2.3x3", "r50.b32.7x7x512", "y8s.b1.80x64", "y8s.b1.80x128_silu",
        "y8s.b1.80x64_hardswish", "symbolic", "1x1", "1x1_silu",
        "1x1_gelu", "1x1_98tiles", "1x1_132tiles_of_96px",
        "1x1_208tiles", "1x1_112tiles_of_224px", "1x1_112tiles_residual", "1x1_b1", "1x1_b1_7x7", "1x1_b1_7x7_gelu", "1x1_s2"])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
def test_untuned_conv_choice_follows_the_measured_winners(desc, first, dtype):
    """Without tuning the first name runs: by the H200 measurements (docs/bench-kernels.md) — for
    convs the GEMMs do not take, 128x32x32 for C, K <= 32, else the persistent ping-pong 128x64;
    1x1s stay with the GEMMs (256x128 tiles where they fill 0.7 of a wave) unless their 128x128 tiles
    fill < 0.7 of a wave (then one CTA of 128x64); any conv whose 128x64 tiles fill < 0.7 of a wave
    takes the 64-row tiles when its activation is in their epilogue; where an activation-specific kernel (_relu, _silu)
    takes the node it comes first (identity: the _relu one)."""
    d = dataclasses.replace(desc, dtype=dtype)
    names = registry.kernel_names("ort-cuda", d)
    assert names[0] == f"sm90_{'f16' if dtype == FLOAT16 else 'bf16'}_{first}", names
    assert sorted(names) == sorted(set(names))


@pytest.mark.parametrize("sm_count, first", [
    (0, "gemm1x1t_128x96_coop_silu_nores"),    # unknown device: an H200's 132 SMs, 132 tiles of 128x96
    (132, "gemm1x1t_128x96_coop_silu_nores"),
    (114, "gemm1x1_128x128_coop_silu"),         # an H100 PCIe: 132 tiles are more than a wave, 98 of 128x128 fill it
    (160, "gemm1x1t_128x96_coop_silu_nores"),   # 132 tiles still fill 0.83 of one wave
    (90, "gemm1x1_128x128_coop_silu"),          # 98 tiles of 128x128 fill more than one wave
])
def test_shape_rules_count_the_device_sms(sm_count, first):
    """The untuned order judges waves on the device's SM count (r50.s3.1x1dn, SiLU: 6272 pixels x 256
    channels are 132 tiles of 128x96 and 98 of 128x128)."""
    d = dataclasses.replace(ANCHORS["r50.s3.1x1dn"], activation="silu")
    names = registry.kernel_names("ort-cuda", d, sm=90, sm_count=sm_count)
    assert names[0] == f"sm90_f16_{first}", names[:4]
    assert sorted(names) == sorted(registry.kernel_names("ort-cuda", d))  # the same kernels, another order


@pytest.mark.skipif(not HAVE_NAMES, reason="registry.kernel_names / epifuse_kernel_names not in this build")
def test_sm90_first_and_gemm_first():
    # Relu: no `preferred` rule applies (the 96-pixel GEMM that 132 tiles would prefer carries SiLU): the registry order
    d = dataclasses.replace(ANCHORS["r50.s3.1x1dn"], activation="relu")
    names = registry.kernel_names("ort-cuda", d)
    assert names[:len(expected(d))] == expected(d)
    assert not [n for n in registry.kernel_names("ort-cpu", d) if n.startswith("sm90_")]


# --- limits, as pairs (accepted, rejected) that differ only in one SM90 limit ------------------

BASE = f16((2, 20, 20, 16, 16), pad_top=1, pad_left=1, pad_bottom=1, pad_right=1)
BASE_1X1 = f16((2, 20, 20, 16, 16), r=1)
PAIRS = {
    # TMA im2col element strides are 1..8
    "stride_h_8_vs_9": (dict(stride_h=8), dict(stride_h=9)),
    "stride_w_8_vs_9": (dict(stride_w=8), dict(stride_w=9)),
    # lower corner -pad_begin >= -128
    "pad_top_128_vs_129": (dict(pad_top=128), dict(pad_top=129)),
    "pad_left_128_vs_129": (dict(pad_left=128), dict(pad_left=129)),
    # upper corner pad_end - (R-1)*dil <= 127
    "pad_bottom_129_vs_130": (dict(pad_bottom=129), dict(pad_bottom=130)),
    "pad_right_129_vs_130": (dict(pad_right=129), dict(pad_right=130)),
    # filter offsets (R-1)*dil <= 254; upper corner >= -128
    "dil_h_127_vs_128": (dict(H=300, dil_h=127, pad_bottom=127), dict(H=300, dil_h=128, pad_bottom=128)),
    "upper_corner_-128_vs_-129": (dict(H=300, R=130, pad_bottom=1), dict(H=300, R=131, pad_bottom=1)),
    "span_254_vs_256_w": (dict(W=300, S=128, dil_w=2, pad_right=127), dict(W=300, S=129, dil_w=2, pad_right=128)),
}
PAIRS_1X1 = {
    "gemm_stride": (dict(), dict(stride_w=2)),
    "gemm_pad": (dict(), dict(pad_bottom=1)),
    "gemm_filter_1x1_vs_1x3": (dict(W=22), dict(S=3)),
    "gemm_dilation_is_irrelevant": (dict(dil_h=3), dict(dil_h=3, stride_h=2)),
}


def _pair(base, ok, bad):
    return dataclasses.replace(base, **ok), dataclasses.replace(base, **bad)


@pytest.mark.parametrize("dtype,allow_tf32", [(FLOAT16, 0), (BFLOAT16, 0), (FLOAT, 1)])
@pytest.mark.parametrize("case", sorted(PAIRS) + sorted(PAIRS_1X1))
def test_limit_pairs(case, dtype, allow_tf32):
    base, (ok, bad) = (BASE, PAIRS[case]) if case in PAIRS else (BASE_1X1, PAIRS_1X1[case])
    a, b = _pair(dataclasses.replace(base, dtype=dtype, allow_tf32=allow_tf32), ok, bad)
    registry.validate(a)
    registry.validate(b)
    assert len(expected(a)) > len(expected(b))
    for target in CUDA_TARGETS:
        if HAVE_NAMES:
            assert sorted(sm90_names(target, a)) == sorted(expected(a))
            assert sorted(sm90_names(target, b)) == sorted(expected(b))
        else:
            na, nb = registry.kernel_count(target, a)[0], registry.kernel_count(target, b)[0]
            assert na - nb == len(expected(a)) - len(expected(b)), (na, nb)


@pytest.mark.parametrize("change", [dict(C=12), dict(K=20), dict(C=12, K=20)])
def test_alignment(change):
    b = dataclasses.replace(BASE, **change)
    assert expected(b) == []
    if HAVE_NAMES:
        assert sm90_names("ort-cuda", b) == []
    # C % 8 / K % 8 also split the other families' aligned kernels, so only names can show it.


def test_cpu_target_has_no_sm90_kernels():
    # ort-cpu gets only the CPU kernel, whatever the SM90 rules accept.
    assert registry.kernel_count("ort-cpu", ANCHORS["r50.s1.1x1up"]) == (1, "")


def test_counts_grow_by_the_sm90_kernels():
    # A 1x1 stride-1 problem gets the GEMM kernels more than the same problem strided by 2,
    # for which the implicit-GEMM convs and every other family answer the same.
    a = ANCHORS["r50.s1.1x1up"]
    b = dataclasses.replace(a, stride_h=2, stride_w=2)
    for target in CUDA_TARGETS:
        assert registry.kernel_count(target, a)[0] - registry.kernel_count(target, b)[0] == len(GEMM)
