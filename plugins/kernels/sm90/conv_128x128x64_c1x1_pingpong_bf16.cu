// SM90 implicit-GEMM conv, CTA tile 128x128x64, no cluster, persistent ping-pong (one CTA per SM, two
// math warp groups taking turns: conv_pingpong_kernel.hpp). For K >= 128.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_bf16_conv_128x128x64_c1x1_pingpong, "sm90_bf16_conv_128x128x64_c1x1_pingpong", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kPingpong)
