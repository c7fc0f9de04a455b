"""Rules of the stem kernels (plugins/core/rules_direct.cc): convs with C <= 4 input channels (RGB, RGBA
and grayscale stems), group 1, at most 64 filter taps and an input patch (what one 8x16-pixel output
tile reads, channels padded to 4) of at most 32768 elements go to the tensor-core stem kernel first in
fp16/bf16, and with a patch of at most 8064 elements to the FFMA stem kernel first in fp32; anything else
is left to the im2col + GEMM, channel-padding and direct kernels."""
import dataclasses

import pytest

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

# ResNet-50's stem: 7x7 stride 2 pad 3, C = 3 -> K = 64, batch 32 at 224x224.
STEM = ConvDesc(FLOAT16, 32, 224, 224, 3, 64, 7, 7, 1, 2, 2, 1, 1, 3, 3, 3, 3, "relu", (), "none")
# YOLOv8s's stem: 3x3 stride 2 pad 1, C = 3 -> K = 32 at 640x640, batch 1.
YOLO = ConvDesc(FLOAT16, 1, 640, 640, 3, 32, 3, 3, 1, 2, 2, 1, 1, 1, 1, 1, 1, "silu", (), "none")


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("desc", [
    STEM,
    YOLO,
    dataclasses.replace(STEM, dtype=BFLOAT16),
    dataclasses.replace(STEM, N=-1, H=-1, W=-1),   # the patch depends on the filter, not the image
    dataclasses.replace(STEM, K=20, residual="post", activation="silu"),  # K % 8 != 0: scalar stores
    dataclasses.replace(STEM, K=200),              # several 64-channel blocks
    dataclasses.replace(STEM, C=1, R=3, S=3),      # grayscale
    dataclasses.replace(STEM, C=4, R=8, S=8),      # 64 taps: the limit
    dataclasses.replace(YOLO, stride_h=3, stride_w=1, dil_h=2, dil_w=3, pad_top=0, pad_right=4),
    dataclasses.replace(YOLO, R=1, S=1, pad_top=0, pad_left=0, pad_bottom=0, pad_right=0),  # 1x1
], ids=["resnet", "yolo", "bf16", "unknown_dims", "k20_residual", "k200", "c1", "rsc_256", "stride_dil", "1x1"])
def test_few_channel_convs_get_the_stem_kernel_first(target, desc):
    names = registry.kernel_names(target, desc)
    assert names[0] == "cuda_stem_mma" and names[-1] == "cuda_direct", names


@pytest.mark.parametrize("desc,why", [
    (dataclasses.replace(STEM, dtype=FLOAT), "fp32: no fp32 tensor-core path"),
    (dataclasses.replace(STEM, C=8), "C = 8: the implicit-GEMM kernels read X directly"),
    (dataclasses.replace(STEM, C=6, K=12, group=3), "grouped"),
    (dataclasses.replace(STEM, C=1, R=9, S=9), "81 taps > 64"),
    (dataclasses.replace(STEM, C=4, R=3, S=3, dil_h=40, dil_w=40), "patch of 95 x 111 x 4 elements"),
    (dataclasses.replace(STEM, C=3, R=3, S=3, stride_h=30, stride_w=30), "patch of 213 x 453 x 4 elements"),
], ids=["fp32", "c8", "grouped", "taps_81", "dilation", "stride"])
def test_stem_kernel_is_not_offered_where_it_cannot_run(desc, why):
    names = registry.kernel_names("ort-cuda", desc)
    assert "cuda_stem_mma" not in names, why
    assert names, "another kernel must still run it"


def test_cpu_target_never_gets_the_stem_kernel():
    assert registry.kernel_names("ort-cpu", STEM) == ["cpu_eigen"]


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("desc", [
    dataclasses.replace(STEM, dtype=FLOAT),
    dataclasses.replace(YOLO, dtype=FLOAT, K=10, residual="pre"),            # K % 4 != 0: scalar stores
    dataclasses.replace(STEM, dtype=FLOAT, N=-1, H=-1, W=-1),
    dataclasses.replace(STEM, dtype=FLOAT, C=1, R=8, S=8),                  # 64 taps: the limit
    dataclasses.replace(YOLO, dtype=FLOAT, R=7, S=7, stride_h=4, stride_w=3),  # patch 35 x 52 x 4 = 7280
], ids=["resnet", "k10_residual", "unknown_dims", "taps_64", "patch_7280"])
def test_fp32_few_channel_convs_get_the_ffma_stem_kernel_first(target, desc):
    names = registry.kernel_names(target, desc)
    assert names[0] == "cuda_stem_ffma" and "cuda_stem_mma" not in names and names[-1] == "cuda_direct", names


@pytest.mark.parametrize("desc,why", [
    (STEM, "fp16: the tensor-core stem kernel's"),
    (dataclasses.replace(STEM, dtype=FLOAT, C=8), "C = 8"),
    (dataclasses.replace(STEM, dtype=FLOAT, C=6, K=12, group=3), "grouped"),
    (dataclasses.replace(STEM, dtype=FLOAT, C=1, R=9, S=9), "81 taps > 64"),
    (dataclasses.replace(YOLO, dtype=FLOAT, R=7, S=7, stride_h=4, stride_w=4), "patch of 35 x 67 x 4 = 9380 elements"),
], ids=["fp16", "c8", "grouped", "taps_81", "patch_9380"])
def test_ffma_stem_kernel_is_not_offered_where_it_cannot_run(desc, why):
    names = registry.kernel_names("ort-cuda", desc)
    assert "cuda_stem_ffma" not in names, why
    assert names, "another kernel must still run it"
