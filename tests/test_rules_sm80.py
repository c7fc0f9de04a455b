"""Rules of the CUTLASS 2.x sm80 kernels (plugins/core/rules_sm80.cc) through the C ABI, on the
CPU: which problems each configuration accepts. They must match the kernels' CUTLASS
can_implement (plus the int32 limits the kernels need); the GPU tests check the numbers."""
from __future__ import annotations

import pytest

from optimizer import registry
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc

ALIGNED = ["64x64x64_4st", "128x64x64_4st", "128x128x64_3st", "splitk_64x64x64_4st"]
FEWCH = "fewch_128x64x32_2st"
UNALIGNED = "unaligned_64x64x32_2st"
GROUPED = ["grouped_128x32x32_4st", "grouped_64x8x32_4st"]  # tile N 32 and 8
DTYPES = {FLOAT16: "f16", BFLOAT16: "bf16"}


def sm80(target: str, desc: ConvDesc) -> list[str]:
    return [n for n in registry.kernel_names(target, desc) if n.startswith("sm80_")]


def desc(dtype=FLOAT16, x=(8, 56, 56, 64), w=(64, 3, 3, 64), **kw) -> ConvDesc:
    kw.setdefault("pads", (1, 1, 1, 1))
    return ConvDesc.from_attributes(dtype, x, w, **kw)


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
def test_aligned_takes_the_tensorop_tiles_in_order(target, dtype):
    t = DTYPES[dtype]
    assert sm80(target, desc(dtype)) == [f"sm80_{t}_{c}" for c in ALIGNED]


def test_not_on_cpu_target():
    assert sm80("ort-cpu", desc()) == []


def test_kernel_names_lists_the_whole_registry_order():
    names = registry.kernel_names("ort-cuda", desc())
    assert names[-1] == "cuda_direct"
    assert len(names) == registry.kernel_count("ort-cuda", desc())[0]
    assert registry.kernel_names("nope", desc()) == []


@pytest.mark.parametrize("shape", [
    dict(x=(32, 224, 224, 3), w=(64, 7, 7, 3), strides=(2, 2), pads=(3, 3, 3, 3)),  # ResNet stem
    dict(x=(8, 640, 640, 3), w=(16, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),  # YOLOv8 stem
    dict(x=(1, 224, 224, 4), w=(32, 3, 3, 4), strides=(2, 2)),
    dict(x=(1, 15, 17, 1), w=(8, 5, 5, 1), strides=(3, 3), dilations=(2, 2), pads=(0, 2, 1, 0)),
])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
def test_few_channels_only_the_stem_kernel(shape, dtype):
    assert sm80("ort-cuda", desc(dtype, **shape)) == [f"sm80_{DTYPES[dtype]}_{FEWCH}"]


@pytest.mark.parametrize("x,w", [((2, 9, 11, 12), (20, 3, 3, 12)),   # C = 12, K = 20
                                 ((2, 9, 11, 64), (20, 1, 1, 64)),   # K unaligned
                                 ((2, 9, 11, 12), (64, 3, 3, 12)),   # C unaligned, >= 8
                                 ((1, 7, 7, 3), (5, 3, 3, 3)),       # C < 8 but K unaligned
                                 ((1, 40, 40, 8), (8, 33, 1, 8))])   # R > 32: not the optimized iterator
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
def test_unaligned_only_the_unaligned_kernel(x, w, dtype):
    assert sm80("ort-cuda", desc(dtype, x=x, w=w, pads=(0, 0, 0, 0))) == [f"sm80_{DTYPES[dtype]}_{UNALIGNED}"]


def test_fp32_takes_the_3xtf32_kernel():
    assert sm80("ort-cuda", desc(FLOAT)) == ["sm80_f32_3xtf32_128x64x16_4st"]
    assert sm80("tensorrt", desc(FLOAT, x=(1, 9, 9, 12), w=(20, 3, 3, 12))) == ["sm80_f32_3xtf32_128x64x16_4st"]


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_tf32_kernels_only_where_the_node_allows_tf32(target):
    tf32 = ["sm80_tf32_64x64x32_4st", "sm80_tf32_128x128x32_3st", "sm80_tf32_splitk_64x64x32_4st"]
    assert sm80(target, desc(FLOAT, allow_tf32=1)) == [*tf32, "sm80_f32_3xtf32_128x64x16_4st"]
    assert not set(tf32) & set(registry.kernel_names(target, desc(FLOAT)))
    assert not set(tf32) & set(registry.kernel_names(target, desc(FLOAT16, allow_tf32=1)))  # float only
    ok, why = registry.kernel_count(target, desc(FLOAT, x=(1, 9, 9, 6), w=(20, 3, 3, 6), allow_tf32=1))
    assert ok >= 1 and not set(tf32) & set(registry.kernel_names(target, desc(FLOAT, x=(1, 9, 9, 6),
                                                                              w=(20, 3, 3, 6), allow_tf32=1)))


def test_a_bad_allow_tf32_is_refused():
    with pytest.raises(ValueError, match="allow_tf32 must be 0 or 1, got 2"):
        registry.validate(desc(FLOAT, allow_tf32=2))


@pytest.mark.parametrize("x,w", [((1, 9, 9, 3), (64, 3, 3, 3)), ((1, 9, 9, 64), (10, 3, 3, 64))])
def test_fp32_unaligned_none(x, w):
    assert sm80("ort-cuda", desc(FLOAT, x=x, w=w)) == []
    assert registry.kernel_count("ort-cuda", desc(FLOAT, x=x, w=w))[0] >= 1  # cuda_direct runs it


def test_fp32_2gib_counts_4_bytes():
    assert sm80("ort-cuda", desc(FLOAT, x=(512, 1024, 16, 64), w=(64, 1, 1, 64), pads=(0, 0, 0, 0))) == []
    assert sm80("ort-cuda", desc(FLOAT, x=(511, 1024, 16, 64), w=(64, 1, 1, 64), pads=(0, 0, 0, 0))) != []


def grouped(dtype, n, hw, c, k, group, stride=1, **kw):
    return desc(dtype, x=(n, hw, hw, c), w=(k, 3, 3, c // group), group=group, strides=(stride, stride), **kw)


# ResNeXt-50 32x4d's grouped 3x3s (32 groups of 4, 8, 16, 32 channels; the first of a stage at stride 2)
RESNEXT50 = [(56, 128, 1), (56, 256, 2), (28, 256, 1), (28, 512, 2), (14, 512, 1), (14, 1024, 2), (7, 1024, 1)]
# RegNetY-1.6GF's: 24 channels per group, widths 48, 120, 336, 888, each stage's first at stride 2
REGNETY16 = [(112, 48, 2), (56, 48, 1), (56, 120, 2), (28, 120, 1), (28, 336, 2), (14, 336, 1), (14, 888, 2),
             (7, 888, 1)]


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
@pytest.mark.parametrize("hw,width,stride", RESNEXT50)
def test_resnext_groups_take_both_grouped_tiles(dtype, hw, width, stride):
    """4-32 output channels per group divide both tiles' N (a CTA covers whole groups)."""
    d = grouped(dtype, 32, hw, width, width, 32, stride)
    assert sm80("ort-cuda", d) == [f"sm80_{DTYPES[dtype]}_{g}" for g in GROUPED]
    names = registry.kernel_names("ort-cuda", d)
    assert names.index(f"sm80_{DTYPES[dtype]}_{GROUPED[0]}") < names.index("cuda_direct")


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
@pytest.mark.parametrize("hw,width,stride", REGNETY16)
def test_regnet_24_per_group_takes_the_8_wide_tile(dtype, hw, width, stride):
    """24 neither divides nor is a multiple of 32; it is of 8 (each group spans three CTAs)."""
    d = grouped(dtype, 1, hw, width, width, width // 24, stride, residual="post", activation="silu")
    assert sm80("tensorrt", d) == [f"sm80_{DTYPES[dtype]}_{GROUPED[1]}"]


@pytest.mark.parametrize("c,k,group,expected", [
    (64, 64, 2, GROUPED),        # 32 per group: one group per CTA of the 32-wide tile
    (128, 128, 2, GROUPED),      # 64 per group: two CTAs of either tile per group
    (80, 80, 2, GROUPED[1:]),    # 40 per group: a multiple of 8 only
    (64, 128, 16, GROUPED),      # 4 input and 8 output channels per group
    (12, 12, 3, GROUPED[1:]),    # K = 12: the 32-wide tile's epilogue stores 8 channels at a time
    (48, 48, 4, []),             # 12 per group: neither divides nor is a multiple of 8 or 32
    (32, 96, 8, []),             # 12 output channels per group
    (64, 64, 32, []),            # 2 input channels per group: under one 64-bit access
    (24, 24, 4, []),             # 6 input channels per group: not a multiple of 4
    (64, 64, 64, []),            # depthwise: the depthwise kernels
    (64, 64, 1, ALIGNED),        # group 1: not the grouped kernels
])
def test_grouped_channels_per_group(c, k, group, expected):
    d = desc(x=(2, 14, 14, c), w=(k, 3, 3, c // group), group=group)
    assert sm80("ort-cuda", d) == [f"sm80_f16_{g}" for g in expected]


def test_grouped_not_fp32():
    assert sm80("ort-cuda", desc(FLOAT, x=(2, 14, 14, 128), w=(128, 3, 3, 4), group=32)) == []


@pytest.mark.parametrize("kw", [
    dict(strides=(2, 1), pads=(0, 1, 2, 0)), dict(dilations=(2, 3)), dict(x=(1, 9, 9, 128), w=(128, 7, 5, 4)),
    dict(w=(128, 1, 1, 4), pads=(0, 0, 0, 0)), dict(x=(-1, -1, -1, 128)), dict(x=(0, 8, 8, 128)),
    dict(activation="mish", residual="pre"), dict(activation="clip", activation_params=(0, 6), residual="post"),
])
def test_grouped_geometry_and_epilogue_accepted(kw):
    args = dict(x=(2, 17, 15, 128), w=(128, 3, 3, 4), group=32, pads=(1, 1, 1, 1)) | kw
    assert sm80("ort-cuda", desc(**args)) == [f"sm80_f16_{g}" for g in GROUPED]


def test_grouped_filter_size_counts_channels_per_group():
    # W is [K, R, S, C / group]: 65536 x 16384 fp16 elements are 2 GiB, 65472 x 16384 just under.
    big = desc(x=(1, 1, 1, 32768), w=(65536, 1, 1, 16384), group=2, pads=(0, 0, 0, 0))
    assert sm80("ort-cuda", big) == []
    under = desc(x=(1, 1, 1, 32768), w=(65472, 1, 1, 16384), group=2, pads=(0, 0, 0, 0))
    assert sm80("ort-cuda", under) == [f"sm80_f16_{g}" for g in GROUPED]


@pytest.mark.parametrize("kw", [
    dict(strides=(3, 3)), dict(dilations=(2, 2)), dict(pads=(0, 1, 2, 3)),
    dict(x=(1, 7, 9, 64)), dict(x=(1, 1, 1, 64), pads=(0, 0, 0, 0), w=(64, 1, 1, 64)),
    dict(activation="mish", residual="pre"), dict(activation="clip", activation_params=(0, 6), residual="post"),
    dict(x=(0, 8, 8, 64)),  # empty batch: nothing to launch
])
def test_geometry_and_epilogue_accepted(kw):
    assert sm80("ort-cuda", desc(**kw)) == [f"sm80_f16_{c}" for c in ALIGNED]


def test_symbolic_batch_and_spatial_sizes_accepted():
    assert sm80("ort-cuda", desc(x=(-1, -1, -1, 64))) == [f"sm80_f16_{c}" for c in ALIGNED]


def test_tensors_of_2gib_rejected():
    # 2^30 fp16 elements of X (exactly 2 GiB): CUTLASS's int32 offsets reject it.
    big = desc(x=(1024, 1024, 16, 64), w=(64, 1, 1, 64), pads=(0, 0, 0, 0))
    assert sm80("ort-cuda", big) == []
    just_under = desc(x=(1023, 1024, 16, 64), w=(64, 1, 1, 64), pads=(0, 0, 0, 0))
    # ... but split-K's fp32 partial sums of its 1 GiB fp16 output would be 4 GiB
    assert sm80("ort-cuda", just_under) == [f"sm80_f16_{c}" for c in ALIGNED if not c.startswith("splitk")]
    out_big = desc(x=(1, 1024, 1024, 8), w=(1024, 1, 1, 8), pads=(0, 0, 0, 0))  # Y is 2 GiB
    assert sm80("ort-cuda", out_big) == []


def test_grid_y_limit():
    # K / tile N > 65535 exceeds grid.y for the 64-wide tiles but not for the 128-wide one.
    k = 64 * 65536
    d = desc(x=(1, 1, 1, 8), w=(k, 1, 1, 8), pads=(0, 0, 0, 0))
    assert sm80("ort-cuda", d) == ["sm80_f16_128x128x64_3st"]


def test_int32_attributes_rejected():
    d = desc(x=(1, 8, 8, 64), w=(64, 3, 3, 64), strides=(1 << 31, 1), pads=(0, 0, 0, 0))
    assert sm80("ort-cuda", d) == []
