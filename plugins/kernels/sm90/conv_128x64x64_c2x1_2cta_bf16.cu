// SM90 implicit-GEMM conv, CTA tile 128x64x64, cluster 2x1x1, two CTAs per SM: stages sized to fit
// shared memory twice and __launch_bounds__(256, 2), so ptxas keeps the runtime-activation
// epilogue in 128 registers (168 when left alone; no spills either way) and one CTA's epilogue
// overlaps the other's mainloop. Meant for short-K, many-tile layers (3x3 convs with C = 64..128).
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_bf16_conv_128x64x64_c2x1_2cta, "sm90_bf16_conv_128x64x64_c2x1_2cta", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::Shape<cute::_64>>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kTwoCtas)
