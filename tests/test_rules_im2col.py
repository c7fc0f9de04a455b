"""Rules of the im2col + GEMM kernels (plugins/core/rules_im2col.cc): a few-channel conv (C % 8 != 0,
an RGB stem) is unrolled into an [n*P*Q, roundup(R*S*C, 8)] matrix per chunk of images and run on a
1x1 GEMM kernel, ahead of the channel-padding kernels (and behind cuda_stem_mma where that runs:
tests/test_rules_stem.py). The why-not reasons never reach Python here:
cuda_direct runs every valid problem, so a CUDA target always lists a kernel."""
import dataclasses

import pytest

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

# ResNet-50's stem: 7x7 stride 2 pad 3, C = 3 -> K = 64, batch 32 at 224x224.
STEM = ConvDesc(FLOAT16, 32, 224, 224, 3, 64, 7, 7, 1, 2, 2, 1, 1, 3, 3, 3, 3, "relu", (), "none")
# YOLOv8's stem: 3x3 stride 2 pad 1, C = 3 -> K = 16 at 640x640.
YOLO = ConvDesc(FLOAT16, 16, 640, 640, 3, 16, 3, 3, 1, 2, 2, 1, 1, 1, 1, 1, 1, "silu", (), "none")
DT = {FLOAT16: "f16", BFLOAT16: "bf16"}
INT32_MAX = 2**31 - 1


def im2col(names):
    return [n for n in names if n.startswith("im2col_")]


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
def test_rgb_stem_prefers_im2col_before_channel_padding(target, dtype):
    names = registry.kernel_names(target, dataclasses.replace(STEM, dtype=dtype))
    assert names[0] == "cuda_stem_mma"
    names = names[1:]
    d = DT[dtype]
    assert names[:3] == [f"im2col_sm90_{d}_gemm1x1_128x64_pingpong", f"im2col_sm90_{d}_gemm1x1_128x128_coop",
                         f"im2col_sm80_{d}_64x64x64_4st"]
    first_pad8 = next(i for i, n in enumerate(names) if n.startswith("pad8_"))
    assert first_pad8 == 3 and names[-1] == "cuda_direct"


@pytest.mark.parametrize("desc", [
    YOLO,
    dataclasses.replace(YOLO, N=1),
    dataclasses.replace(STEM, N=-1, H=-1, W=-1),  # dims unknown at optimize time
    dataclasses.replace(STEM, N=-1),
    dataclasses.replace(STEM, residual="post", activation="silu"),
    dataclasses.replace(STEM, residual="pre", K=16),
    # stride, dilation and asymmetric pads live in the im2col step; the GEMM is always 1x1
    dataclasses.replace(STEM, H=33, W=35, stride_h=1, stride_w=3, dil_h=2, dil_w=1, pad_top=0, pad_left=4,
                        pad_bottom=2, pad_right=1),
    dataclasses.replace(STEM, C=1, R=3, S=3, stride_h=1, stride_w=1, pad_top=1, pad_left=1, pad_bottom=1,
                        pad_right=1),
    dataclasses.replace(STEM, C=4, R=16, S=16, pad_top=0, pad_left=0, pad_bottom=0, pad_right=0),  # R*S*C = 1024
    dataclasses.replace(STEM, C=12, R=3, S=3),  # C > 8 but not a multiple of 8
    # a batch whose whole GEMM exceeds int32 M (N*P*Q) runs in chunks of a few images
    dataclasses.replace(STEM, N=200_000),
    ConvDesc(FLOAT16, 1, INT32_MAX - 1, 8, 3, 16, 3, 3, 1, 1 << 20, 1, 1, 1, 1, 0, 0, 0),  # H + pads = INT32_MAX
], ids=["yolo", "yolo_b1", "unknown_dims", "unknown_n", "residual_post", "residual_pre",
        "stride_dil_asym_pads", "c1", "rsc_1024", "c12", "huge_batch", "h_plus_pads_int32_max"])
def test_few_channel_problems_get_im2col_first(desc):
    names = [n for n in registry.kernel_names("ort-cuda", desc) if n != "cuda_stem_mma"]
    assert names[:3] == ["im2col_sm90_f16_gemm1x1_128x64_pingpong", "im2col_sm90_f16_gemm1x1_128x128_coop",
                         "im2col_sm80_f16_64x64x64_4st"], names


@pytest.mark.parametrize("desc", [
    dataclasses.replace(STEM, C=64),  # aligned C: the implicit-GEMM kernels read X directly
    dataclasses.replace(STEM, C=16, R=3, S=3),
    dataclasses.replace(STEM, dtype=FLOAT),  # the inner GEMMs are 16-bit
    dataclasses.replace(STEM, C=6, K=48, group=3),
    dataclasses.replace(STEM, K=60),  # the GEMMs store 16-byte rows of Y: K % 8
    dataclasses.replace(STEM, C=5, R=15, S=15),  # R*S*C = 1125 > 1024
    dataclasses.replace(STEM, C=4, R=16, S=17, pad_top=0, pad_left=0, pad_bottom=0, pad_right=0),  # 1088
    # one image alone has more than INT32_MAX GEMM rows (P*Q) and a 2 GiB+ im2col matrix
    ConvDesc(FLOAT16, 1, 50_000, 50_000, 3, 16, 1, 1),
    # input rows past INT32_MAX (the im2col kernel's int32 coordinates), though the GEMM would be small
    ConvDesc(FLOAT16, 1, INT32_MAX, 8, 3, 16, 3, 3, 1, 1 << 20, 1, 1, 1, 1, 0, 0, 0),
], ids=["aligned_c", "aligned_c16", "fp32", "grouped", "k60", "rsc_1125", "rsc_1088", "huge_image",
        "h_plus_pads_over_int32"])
def test_im2col_is_not_offered_where_it_does_not_apply(desc):
    names = registry.kernel_names("ort-cuda", desc)
    assert names and not im2col(names), names
