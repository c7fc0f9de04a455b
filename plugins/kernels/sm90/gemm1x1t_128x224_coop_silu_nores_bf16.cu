// 1x1 stride-1 conv as the GEMM Y^T = W X^T (channels as GEMM rows, as gemm1x1t_128x96): CTA tile 128
// channels x 224 pixels x 64, persistent cooperative, Identity and SiLU, no residual. cuBLAS's
// nvjet_sm90_hsh_128x224 tiling for ResNet-50's 7x7 512->2048 at batch 32: 1568 pixels are exactly 7
// tiles, 7 x 16 = 112 CTAs; 9.5 us vs 10.4-10.8 on the best 128/256-row tiles (bench/gemm1x1_variants.cu,
// H200).
//
// CuTe's WGMMA selector knows N = 224 only with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED; without it the
// tile runs as seven N = 32 instructions that each re-read A from shared memory (ncu: 7x cuBLAS's
// wgmma count, 11.4 us). The define pulls in ~150k lines of extra MMA headers: set for the whole SM90
// target it made each translation unit compile 1.45x slower (gemm1x1_128x128_coop_f16: 33 -> 48 s) for
// byte-identical SASS, so it is set here only. The selector runs at compile time and picks the same
// atom for the other kernels' widths (32/64/96/128) either way.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1t_128x224_coop_silu_nores, "sm90_bf16_gemm1x1t_128x224_coop_silu_nores", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::Int<224>, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>,
                 cutlass::epilogue::collective::EpilogueTileAuto, sm90::NoResidual, 0, /*kChannelRows=*/true)
