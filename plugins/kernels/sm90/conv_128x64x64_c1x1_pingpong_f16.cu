// SM90 implicit-GEMM conv, CTA tile 128x64x64, no cluster, persistent ping-pong (one CTA per SM, two
// math warp groups taking turns: conv_pingpong_kernel.hpp). For short-K convs with K = 64 (3x3 with
// C = 64: 9 k-steps per tile), where the non-persistent kernels spend as long on fill and epilogue.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x64x64_c1x1_pingpong, "sm90_f16_conv_128x64x64_c1x1_pingpong", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::Shape<cute::_64>>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kPingpong)
