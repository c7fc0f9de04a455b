// The ping-pong 128x64 conv (conv_128x64x64_c1x1_pingpong_f16.cu) with an epilogue that carries only
// Identity and Relu (sm90_common.cuh: ActivationSet).
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x64x64_c1x1_pingpong_relu, "sm90_f16_conv_128x64x64_c1x1_pingpong_relu",
                 DType::kFloat16, cute::Shape<cute::_128, cute::_64, cute::Shape<cute::_64>>,
                 cute::Shape<cute::_1, cute::_1, cute::_1>, sm90::ConvSchedule::kPingpong,
                 sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kRelu>)
