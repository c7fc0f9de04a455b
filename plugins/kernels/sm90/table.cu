// The CUTLASS 3.x SM90 kernels in this build (sm_90a only): every kernels.def entry in its dtypes (the
// 16-bit twins of EPIFUSE_CUDA_DTYPES, or tf32), one generated translation unit each (sources.cmake).
#include "kernel_api.h"

#define EPIFUSE_SM90_DTYPES_F16_BF16(name, X) EPIFUSE_IF_F16(X(sm90_f16_##name)) EPIFUSE_IF_BF16(X(sm90_bf16_##name))
#define EPIFUSE_SM90_DTYPES_F32_TF32(name, X) X(sm90_tf32_##name)
#define SM90_GEMM(name, tu, dtypes, ...) EPIFUSE_SM90_DTYPES_##dtypes(name, EPIFUSE_SM90_EACH)
#define SM90_CONV(name, tu, dtypes, ...) EPIFUSE_SM90_DTYPES_##dtypes(name, EPIFUSE_SM90_EACH)

namespace epifuse::cuda {

#define EPIFUSE_SM90_EACH(fn) KernelImpl fn();
#include "kernels.def"
#undef EPIFUSE_SM90_EACH

std::vector<KernelImpl> sm90_kernels() {
  return {
#define EPIFUSE_SM90_EACH(fn) fn(),
#include "kernels.def"
  };
}

}  // namespace epifuse::cuda
