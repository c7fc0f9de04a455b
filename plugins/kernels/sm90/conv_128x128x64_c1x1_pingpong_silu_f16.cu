// The ping-pong 128x128 conv (conv_128x128x64_c1x1_pingpong_f16.cu) with an epilogue that carries only
// Identity and SiLU (sm90_common.cuh: ActivationSet): YOLO's K >= 256 3x3s.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x128x64_c1x1_pingpong_silu, "sm90_f16_conv_128x128x64_c1x1_pingpong_silu",
                 DType::kFloat16, cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>,
                 cute::Shape<cute::_1, cute::_1, cute::_1>, sm90::ConvSchedule::kPingpong,
                 sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>)
