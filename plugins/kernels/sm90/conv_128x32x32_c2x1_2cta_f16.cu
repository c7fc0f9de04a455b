// SM90 implicit-GEMM conv for narrow layers (C, K <= 32): CTA tile 128x32x32, cluster 2x1x1, two
// CTAs per SM (as the 128x64 _2cta kernel). With C = 32 the 64-deep k-step of the other convs is half
// zero fill and a K = 32 layer fills half of a 64-wide N tile: YOLOv8s's 160x160 32->32 3x3 at batch
// 32 took 207 us (identity) on the 128x64x64 tile, 122 on this one; cuDNN's conv 72.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x32x32_c2x1_2cta, "sm90_f16_conv_128x32x32_c2x1_2cta", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_32, cute::Shape<cute::_32>>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kTwoCtas)
