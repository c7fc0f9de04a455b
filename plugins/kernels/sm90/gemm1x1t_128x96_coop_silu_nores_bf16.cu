// 1x1 stride-1 conv as the GEMM Y^T = W X^T (GEMM rows = output channels, columns = pixels; Y's NHWC
// memory is the column-major D): CTA tile 128 channels x 96 pixels x 64, persistent cooperative,
// Identity and SiLU, no residual. The 96-pixel side sizes the tile count to the SM count where the
// pixel count is small (cuBLAS's nvjet_sm90_hsh_128x96 for the same layer): ResNet-50's 14x14
// 1024->256 at batch 32 is 66 x 2 = 132 tiles, 7.9 us vs 9.4 on the best 128-pixel tile
// (bench/gemm1x1_variants.cu, H200; cuDNN's conv alone 8.0-8.3).
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1t_128x96_coop_silu_nores, "sm90_bf16_gemm1x1t_128x96_coop_silu_nores", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::Int<96>, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>,
                 cutlass::epilogue::collective::EpilogueTileAuto, sm90::NoResidual, 0, /*kChannelRows=*/true)
