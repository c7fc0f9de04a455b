// 1x1 stride-1 conv as GEMM: CTA tile 256x128x64 (each math warp group a 128x128 half; cuDNN's tile for
// ResNet-50's 56x56 64->256), persistent cooperative, 128x64 epilogue sub-tiles, Identity and SiLU only,
// no residual: without a C operand the epilogue keeps 4 store buffers of its own and delays each TMA
// store by a sub-tile, so 3 stores are in flight (bench/gemm1x1_variants.cu, H200: r50.s1.1x1up 27.2 ->
// 24.1 µs, YOLOv8s's 80x80 128->128 at batch 32 37.6 -> 34.6). Residual SiLU layers take the 128x128 ones.
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_f16_gemm1x1_256x128_coop_silu_nores, "sm90_f16_gemm1x1_256x128_coop_silu_nores", DType::kFloat16,
                 cute::Shape<cute::_256, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>,
                 cute::Shape<cute::_128, cute::_64>, sm90::NoResidual, 4)
