#!/usr/bin/env bash
# GPU machine only: compute-sanitizer memcheck over one problem per kernel family (SM90 conv, 1x1
# GEMM with and without a C operand, the channels-as-rows GEMMs on partial tiles, SM80 aligned/3xTF32,
# the TF32 kernels of both families, the tensor-core grouped kernels, channel padding, unaligned, depthwise tile (small and wide
# grids) and strip, the global pool split over blocks and with images grouped, RGB stems (16-bit and fp32), direct).
#   EPIFUSE_LIB_DIR=<CUDA build> .ci/gpu_memcheck.sh
# Last run: H200, 2026-12-04 (02:40 UTC), all 14 cases then, "ERROR SUMMARY: 0 errors", on a build without the
# CUTLASS bf16 twins (.ci/gpu/build.sh's default: its bf16 cases ran the other kernels); with them: 2026-12-03.
# The two global-pool cases (and the 112x112 and residual ones): 2026-12-04 (06:05 UTC), 0 errors.
# test_tf32_kernels[none] with the TF32 split-K kernel (7x7x512 3x3, 16 slices): 2026-12-04 (13:00 UTC), 0 errors.
set -euo pipefail
cd "$(dirname "$0")/.."
compute-sanitizer --tool memcheck --error-exitcode 7 --print-limit 5 \
  python3 -m pytest -q -m gpu tests/test_cuda_kernels.py -p no:cacheprovider -k \
  "64to64_3x3_s2_g1-float16 or 3to32_7x7_s2_g1-float16 or 12to20_3x3_s1_g1-float16 or 96to96_7x7_s1_g96-float16 \
   or 80to80_7x7_s1_g80-float16 or 64to64_7x7_s2_g64-float16 or 24to24_5x5_s1_g24-float32 \
   or 24to36_3x3_s1_g3-float32 or 32to48_1x1_s1_g1-bfloat16 or 64to64_3x3_s2_g1-float32 \
   or 64to192_1x1_s1_g1-float16 or 96to200_1x1_s1_g1-bfloat16 or test_tf32_kernels[none] \
   or (test_grouped_kernels and post and float16) or 72to72_28x28_s1_g72-float32 or 4to4_3x5_s1_g4-float16 \
   or 3to10_3x3_s2_g1-float32"
