"""Rule of cuda_gemv_1x1 (plugins/core/rules_direct.cc): a 1x1 conv over at most 32 output pixels
(squeeze-excite blocks on [N,1,1,C], batch-1 heads) and at most 2^24 multiply-adds goes to the
warp-per-channel kernel first, for any dtype; anything else, more pixels or more work, is left to the
other families."""
import dataclasses

import pytest

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

# EfficientNet-B0's squeeze conv of its 96-channel stage: [N,1,1,96] -> 4 channels, SiLU.
SQUEEZE = ConvDesc(FLOAT16, 1, 1, 1, 96, 4, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, "silu", (), "none")


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("desc", [
    SQUEEZE,
    dataclasses.replace(SQUEEZE, dtype=FLOAT),
    dataclasses.replace(SQUEEZE, dtype=BFLOAT16, C=4, K=96, activation="sigmoid"),  # the excite conv
    dataclasses.replace(SQUEEZE, N=32),                  # 32 pixels: the limit
    dataclasses.replace(SQUEEZE, N=-1),                  # dynamic batch: checked again at launch
    dataclasses.replace(SQUEEZE, N=2, H=4, W=4, C=1152, K=48, residual="post"),
    dataclasses.replace(SQUEEZE, dil_h=2, dil_w=3),      # dilation does not move a 1x1 tap
    dataclasses.replace(SQUEEZE, C=2048, K=1000),        # a classifier at batch 1
    dataclasses.replace(SQUEEZE, N=32, C=960, K=240),    # MobileNetV3's largest squeeze at batch 32
], ids=["squeeze", "fp32", "excite_bf16", "n32", "unknown_n", "4x4_residual", "dilated", "classifier_b1",
        "squeeze_960_b32"])
def test_few_pixel_1x1_convs_get_gemv_first(target, desc):
    names = registry.kernel_names(target, desc)
    assert names[0] == "cuda_gemv_1x1" and names[-1] == "cuda_direct", names


@pytest.mark.parametrize("desc", [
    dataclasses.replace(SQUEEZE, N=33),                  # past 32 pixels the GEMMs win
    dataclasses.replace(SQUEEZE, N=1, H=7, W=7),
    dataclasses.replace(SQUEEZE, N=-1, H=-1, W=-1),     # pixels unknown
    dataclasses.replace(SQUEEZE, R=3, S=3, pad_top=1, pad_left=1, pad_bottom=1, pad_right=1),
    dataclasses.replace(SQUEEZE, H=3, W=3, stride_h=2, stride_w=2),
    dataclasses.replace(SQUEEZE, H=2, W=2, pad_bottom=1),
    dataclasses.replace(SQUEEZE, C=96, K=96, group=96),  # depthwise
    # a classifier at batch 32: 32 x 2048 x 1000 multiply-adds, each warp rereading X (30.0 µs vs 7.7 on a
    # tensor-core tile); at batch 1 GEMV keeps it
    dataclasses.replace(SQUEEZE, N=32, C=2048, K=1000),
], ids=["n33", "7x7_b1", "unknown_hw", "3x3", "strided", "padded", "depthwise", "classifier_b32"])
def test_gemv_is_not_offered_where_it_does_not_apply(desc):
    assert "cuda_gemv_1x1" not in registry.kernel_names("ort-cuda", desc)


def test_cpu_target_never_gets_gemv():
    assert registry.kernel_names("ort-cpu", SQUEEZE) == ["cpu_eigen"]
