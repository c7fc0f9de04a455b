// SM90 implicit-GEMM conv, CTA tile 128x64x64, cluster 2x1x1 (the filter tile is TMA-multicast to the two
// CTAs that share an output-channel block), automatic stage count. Best for K = 64 layers.
// Two CTAs per SM (ConvConfig's kTwoCtas: 3 stages in <= 113 KiB) would need <= 128 registers; the
// runtime-activation epilogue takes ~168 and CUTLASS's __launch_bounds__(256, 1) overrides
// -maxrregcount, so it runs one CTA per SM with the deeper pipeline instead.
#include "sm90_conv.cuh"
SM90_CONV_KERNEL(sm90_f16_conv_128x64x64_c2x1, "sm90_f16_conv_128x64x64_c2x1", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_64, cute::Shape<cute::_64>>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                 /*two CTAs per SM=*/false)
