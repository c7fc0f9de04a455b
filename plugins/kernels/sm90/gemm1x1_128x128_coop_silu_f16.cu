// The cooperative 128x128 1x1 GEMM (gemm1x1_128x128_coop_f16.cu) with an epilogue that carries only
// Identity and SiLU (sm90_common.cuh: ActivationSet): no 14-way switch per fragment.
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_f16_gemm1x1_128x128_coop_silu, "sm90_f16_gemm1x1_128x128_coop_silu", DType::kFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, void, sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>,
                 cute::Shape<cute::_128, cute::_64>)
