// SM90 implicit-GEMM conv, CTA tile 128x128x64 (M = N*P*Q, N = K, k-step 64 over R*S*C), cluster 1x1x1,
// automatic stage count (one CTA per SM: ~190 registers x 256 threads). Best where K >= 128.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_bf16_conv_128x128x64_c1x1, "sm90_bf16_conv_128x128x64_c1x1", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::ConvSchedule::kOneCta)
