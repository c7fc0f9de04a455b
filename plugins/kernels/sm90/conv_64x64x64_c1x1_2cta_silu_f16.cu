// SM90 implicit-GEMM conv with 64-row tiles (one math warp group), two CTAs per SM, Identity and SiLU
// only: twice the CTAs of the 128-row tiles, for batch-1 layers with few output tiles. On ResNet-50's
// batch-1 layers it won 24 of 28 (the model's convs 352 -> 301 µs; cuDNN's conv alone 321).
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_64x64x64_c1x1_2cta_silu, "sm90_f16_conv_64x64x64_c1x1_2cta_silu", DType::kFloat16,
                 cute::Shape<cute::_64, cute::_64, cute::Shape<cute::_64>>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kTwoCtas, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>)
