// The two-CTA 128x32 conv (conv_128x32x32_c2x1_2cta_bf16.cu) with an epilogue that carries only
// Identity and Relu (sm90_common.cuh: ActivationSet): the tuner's pick for 18 of ResNet-50's 28 batch-1
// problems before the 64-row tiles existed, for 7 problems of the five zoo models after.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_bf16_conv_128x32x32_c2x1_2cta_relu, "sm90_bf16_conv_128x32x32_c2x1_2cta_relu", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_32, cute::Shape<cute::_32>>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kTwoCtas, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kRelu>)
