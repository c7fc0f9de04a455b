// 1x1 stride-1 conv as GEMM: CTA tile 128x64x64, persistent ping-pong kernel (two consumer warpgroups
// on alternate tiles, so one tile's epilogue overlaps the next one's mainloop). For K = 64 outputs
// and short reductions — the 1x1 layers with 64 output channels, and the im2col GEMM of RGB stems
// (R*S*C = 27..152) — where a 128-wide N tile would compute half zeros and the epilogue dominates.
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1_128x64_pingpong, "sm90_bf16_gemm1x1_128x64_pingpong", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Pingpong)
