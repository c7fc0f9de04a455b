// 1x1 stride-1 conv as GEMM: CTA tile 256x128x64 (each math warp group a 128x128 half; cuDNN's tile for
// ResNet-50's 56x56 64->256), persistent cooperative, 128x64 epilogue sub-tiles, Identity and Relu only.
// With all 14 activations this tile lost to 128x128 (45.7 vs 40.2 µs, r50.s1.1x1up): the larger
// epilogue missed the instruction cache; with two it is the fastest (27.8 µs, cuDNN's conv alone 24.5).
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_f16_gemm1x1_256x128_coop_relu, "sm90_f16_gemm1x1_256x128_coop_relu", DType::kFloat16,
                 cute::Shape<cute::_256, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kRelu>,
                 cute::Shape<cute::_128, cute::_64>)
