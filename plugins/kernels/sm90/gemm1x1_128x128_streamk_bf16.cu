// Persistent cooperative 1x1 GEMM, 128x128 tile, with CUTLASS's stream-K scheduler (see GemmConfig):
// for the small-M, long-K 1x1 layers of batch 1 that the data-parallel grid cannot spread over all SMs.
// CUTLASS 4.2's stream-K scheduler does not compile with grid dependency control (is_last_tile binds a
// const member to a non-const reference), so this kernel is built without it and never launched as a
// programmatic dependent (sm90_common.cuh: kGridDependencyControl).
#undef CUTLASS_ENABLE_GDC_FOR_SM90
#include "sm90_gemm.cuh"
SM90_GEMM_KERNEL(sm90_bf16_gemm1x1_128x128_streamk, "sm90_bf16_gemm1x1_128x128_streamk", DType::kBFloat16,
                 cute::Shape<cute::_128, cute::_128, cute::_64>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                 sm90::Cooperative, cutlass::gemm::StreamKScheduler)
