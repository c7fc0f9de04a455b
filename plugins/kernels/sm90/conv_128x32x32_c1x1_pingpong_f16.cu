// SM90 implicit-GEMM conv, CTA tile 128x32x32, no cluster, persistent ping-pong (conv_pingpong_kernel.hpp).
// For C, K <= 32 (YOLO's 160x160 32->32 3x3s), where a 64-deep k-step would be half zero fill.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x32x32_c1x1_pingpong, "sm90_f16_conv_128x32x32_c1x1_pingpong", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_32, cute::Shape<cute::_32>>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kPingpong)
