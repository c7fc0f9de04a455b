// SM90 implicit-GEMM conv, CTA tile 128x64x64, cluster 2x1x1 (the filter tile is TMA-multicast to the two
// CTAs that share an output-channel block), one CTA per SM with the automatic (deepest) stage count
// and 168 registers. Best for K = 64 layers with long K loops; the _2cta variant trades stages for
// a second CTA per SM.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x64x64_c2x1, "sm90_f16_conv_128x64x64_c2x1", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::Shape<cute::_64>>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kOneCta)
