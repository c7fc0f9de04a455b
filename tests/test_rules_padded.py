"""Rules of the channel-padding kernels: a stem with C = 3 (or any C not a multiple of 8) goes to
a tensor-core kernel on zero-padded channels when that kernel accepts the padded problem."""
import dataclasses

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

STEM = ConvDesc(FLOAT16, 32, 224, 224, 3, 64, 7, 7, 1, 2, 2, 1, 1, 3, 3, 3, 3, "relu", (), "none")


def without_im2col(names):
    """The stem and im2col + GEMM kernels (test_rules_stem.py, test_rules_im2col.py) come first for
    stems; these tests are about what follows them."""
    return [n for n in names if not n.startswith("im2col_") and n != "cuda_stem_mma"]


def test_rgb_stem_prefers_the_padded_tensor_core_kernels():
    names = without_im2col(registry.kernel_names("ort-cuda", STEM))
    assert names[:3] == ["pad8_sm80_f16_fixed8_128x64x32_3st", "pad8_sm90_f16_conv_128x64x64_c2x1",
                         "pad8_sm80_f16_64x64x64_4st"]
    assert names[-1] == "cuda_direct"
    bf16 = without_im2col(registry.kernel_names("tensorrt", dataclasses.replace(STEM, dtype=BFLOAT16)))
    assert bf16[:3] == ["pad8_sm80_bf16_fixed8_128x64x32_3st", "pad8_sm90_bf16_conv_128x64x64_c2x1",
                        "pad8_sm80_bf16_64x64x64_4st"]


def test_padding_is_not_offered_where_it_does_not_apply():
    aligned = registry.kernel_names("ort-cuda", dataclasses.replace(STEM, C=64))
    assert not any(n.startswith("pad8_") for n in aligned)
    fp32 = registry.kernel_names("ort-cuda", dataclasses.replace(STEM, dtype=FLOAT))
    assert not any(n.startswith("pad8_") for n in fp32)  # the inner kernels are 16-bit
    grouped = registry.kernel_names("ort-cuda", dataclasses.replace(STEM, C=6, K=64, group=3))
    assert not any(n.startswith("pad8_") for n in grouped)
    odd_k = registry.kernel_names("ort-cuda", dataclasses.replace(STEM, K=60))
    assert not any(n.startswith("pad8_") for n in odd_k)  # the inner kernels need K % 8 == 0
