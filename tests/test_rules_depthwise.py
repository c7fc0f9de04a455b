"""Rules of the five depthwise kernels (plugins/core/rules_direct.cc, limits from depthwise_geometry.h)
and their untuned order (heuristics.cc, prefer_depthwise_strip): which kernels the registry offers a
depthwise problem, best first. The CUDA tests (tests/test_cuda_kernels.py) run every kernel offered
for each of their shapes; the last test here checks those shapes reach all five."""
import pytest

from optimizer import registry
from optimizer.registry import FLOAT, FLOAT16, ConvDesc
from tests.test_cuda_kernels import SHAPES

LOCAL = ["cuda_depthwise_tile", "cuda_depthwise_strip", "cuda_depthwise_vec", "cuda_depthwise_scalar"]
DEPTHWISE = ["cuda_depthwise_tile", "cuda_depthwise_strip", "cuda_depthwise_global", "cuda_depthwise_vec",
             "cuda_depthwise_scalar"]


def dw(n, h, w, c, r, *, dtype=FLOAT16, k=None, stride=1, dil=1, pad=None, group=None):
    pad = r // 2 if pad is None else pad
    return ConvDesc(dtype, n, h, w, c, c if k is None else k, r, r, c if group is None else group, stride, stride,
                    dil, dil, pad, pad, pad, pad, "silu", (), "none")


def offered(desc, sm_count=132):
    names = registry.kernel_names("ort-cuda", desc, sm=90, sm_count=sm_count)
    assert names[-1] == "cuda_direct", names  # the direct kernel runs everything, last
    return [n for n in names if n.startswith("cuda_depthwise")]


@pytest.mark.parametrize("desc, expected", [
    # ConvNeXt's dw7x7 at batch 32: the tile kernel first, every kernel able to run it
    (dw(32, 56, 56, 96, 7), LOCAL),
    # EfficientNet-B0's last stage, 5x5 on 7x7 maps: narrow rows and a full grid at batch 32 -> strip first;
    # at batch 1 the small tiles win. C = 1152: a 32-vector slice's 25 taps fit the vector kernel.
    (dw(32, 7, 7, 1152, 5), ["cuda_depthwise_strip", "cuda_depthwise_tile", "cuda_depthwise_vec",
                             "cuda_depthwise_scalar"]),
    (dw(1, 7, 7, 1152, 5), LOCAL),
    # a 7x7 filter keeps the tile kernel first on narrow rows (14x14x384 at batch 32: 26.6 vs 35.5 µs)
    (dw(32, 14, 14, 384, 7), ["cuda_depthwise_tile", "cuda_depthwise_strip", "cuda_depthwise_scalar"]),
    # a global average pool as a depthwise conv (one output pixel an image) on a 7x7 map: strip first at
    # batch 32 (7.4 vs 24.5 µs on the H200, global 7.5), the tile kernel's small tiles at batch 1 (3.6 vs 7.0,
    # global 4.1)
    (dw(32, 7, 7, 960, 7, pad=0), ["cuda_depthwise_strip", "cuda_depthwise_tile", "cuda_depthwise_global",
                                   "cuda_depthwise_scalar"]),
    (dw(1, 7, 7, 960, 7, pad=0), ["cuda_depthwise_tile", "cuda_depthwise_strip", "cuda_depthwise_global",
                                  "cuda_depthwise_scalar"]),
    # global over a larger or non-square map, strided: the global kernel first (28x28x120 at batch 32: 29.2 µs,
    # scalar 151.9)
    (dw(1, 28, 28, 72, 28, pad=0), ["cuda_depthwise_global", "cuda_depthwise_scalar"]),
    (ConvDesc(FLOAT16, 2, 5, 9, 34, 34, 5, 9, 34, 2, 2, 1, 1, 0, 0, 0, 0, "silu", (), "none"),
     ["cuda_depthwise_global", "cuda_depthwise_scalar"]),
    # not the whole map: padded, or a filter smaller than the map, or odd C
    (dw(1, 7, 7, 64, 7, pad=3), LOCAL),
    (dw(1, 9, 9, 64, 7, pad=0), LOCAL),
    (dw(1, 7, 7, 35, 7, pad=0), ["cuda_depthwise_scalar"]),
    # stride 2: no tile kernel; dilation: no strip or tile kernel; 9x9: neither is instantiated
    (dw(2, 17, 16, 40, 3, stride=2, dtype=FLOAT), ["cuda_depthwise_strip", "cuda_depthwise_vec",
                                                   "cuda_depthwise_scalar"]),
    (dw(2, 13, 13, 32, 3, dil=2, pad=2), ["cuda_depthwise_vec", "cuda_depthwise_scalar"]),
    (dw(1, 28, 28, 96, 9), ["cuda_depthwise_vec", "cuda_depthwise_scalar"]),
    # channel multiplier 2, or C not in whole vectors: only the scalar kernel
    (dw(1, 10, 10, 8, 3, k=16), ["cuda_depthwise_scalar"]),
    (dw(1, 9, 11, 10, 3), ["cuda_depthwise_scalar"]),
    # a symbolic batch: every kernel whose other limits hold, in the registry's order
    (dw(-1, 56, 56, 96, 3), LOCAL),
    # a symbolic batch on a whole-map filter: every kernel, the global one too (the batch is its grid)
    (dw(-1, 7, 7, 96, 7, pad=0), DEPTHWISE),
], ids=["cnx_b32", "effb0_5x5_b32", "effb0_5x5_b1", "7x7_narrow", "global_pool_b32", "global_pool_b1", "global_28x28",
        "global_5x9_strided", "padded_not_global", "smaller_filter", "global_odd_c", "stride2",
        "dilated", "9x9", "multiplier2", "c10", "symbolic_batch", "symbolic_batch_global"])
def test_depthwise_kernels_offered_best_first(desc, expected):
    assert offered(desc) == expected


def test_the_strip_rule_counts_the_devices_sms():
    """The same batch-32 problem fills a 132-SM H200 with wide tiles but not a 1000-SM device, where the
    tile kernel runs its small tiles and keeps its place."""
    desc = dw(32, 14, 14, 480, 3)
    assert offered(desc, sm_count=132)[0] == "cuda_depthwise_strip"
    assert offered(desc, sm_count=1000)[0] == "cuda_depthwise_tile"


def test_the_vector_kernels_shared_taps_are_bounded():
    """R*S taps x the channels of a 32-vector slice must fit 12288 floats (48 KB): 7x7 x 256 channels do not."""
    assert "cuda_depthwise_vec" in offered(dw(1, 14, 14, 248, 7))      # 31 vectors of 8: 49 * 248 floats
    assert "cuda_depthwise_vec" not in offered(dw(1, 14, 14, 256, 7))  # 49 * 256 = 12544


def test_a_non_depthwise_problem_gets_no_depthwise_kernel():
    assert offered(dw(1, 14, 14, 64, 3, group=32)) == []


def test_the_cuda_test_shapes_run_every_depthwise_kernel():
    covered = set()
    for n, h, w, c, k, r, s, stride, pads, dil, group in SHAPES:
        for dtype in (FLOAT16, FLOAT):
            desc = ConvDesc(dtype, n, h, w, c, k, r, s, group, *stride, *dil, *pads, "silu", (), "none")
            covered.update(registry.kernel_names("ort-cuda", desc, sm=90))
    assert set(DEPTHWISE) <= covered, set(DEPTHWISE) - covered
