// 1x1 stride-1 conv as GEMM: CTA tile 128x128x64, cluster 1x1x1, persistent ping-pong kernel (two consumer
// warpgroups on alternate tiles, so one's epilogue overlaps the other's mainloop: short-C layers).
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1_128x128_pingpong, "sm90_bf16_gemm1x1_128x128_pingpong", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Pingpong)
