// 1x1 stride-1 conv as GEMM: CTA tile 128x64x64, persistent ping-pong kernel (two consumer warpgroups
// on alternate tiles, so one tile's epilogue overlaps the next one's mainloop). See the f16 file.
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1_128x64_pingpong, "sm90_bf16_gemm1x1_128x64_pingpong", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Pingpong)
