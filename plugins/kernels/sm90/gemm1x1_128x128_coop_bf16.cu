// 1x1 stride-1 conv as GEMM: CTA tile 128x128x64, cluster 1x1x1, persistent cooperative kernel (two consumer
// warpgroups split each tile: lower latency per tile, for layers with few tiles and long C),
// 128x64 epilogue sub-tiles, all 14 activations (the _relu and _silu kernels carry two).
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1_128x128_coop, "sm90_bf16_gemm1x1_128x128_coop", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::AnyActivation,
                 cute::Shape<cute::_128, cute::_64>)
