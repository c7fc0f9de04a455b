// 1x1 stride-1 conv as GEMM: CTA tile 128x64x64, persistent ping-pong kernel (two consumer warpgroups
// on alternate tiles, so one tile's epilogue overlaps the next one's mainloop). For K = 64 outputs
// and short reductions, where a 128-wide N tile computes half zeros and the epilogue dominates
// (tuning picked it for ResNet-50's 256->64 and 2048->512 1x1s). Not yet an im2col inner kernel.
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_f16_gemm1x1_128x64_pingpong, "sm90_f16_gemm1x1_128x64_pingpong", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Pingpong)
