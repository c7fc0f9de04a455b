// The CUTLASS 3.x SM90 kernels in this build (sm_90a only): every kernels.def entry in each dtype
// of EPIFUSE_CUDA_DTYPES, one generated translation unit each (sources.cmake).
#include "kernel_api.h"

namespace epifuse::cuda {

#define EPIFUSE_SM90_EACH(name) EPIFUSE_IF_F16(KernelImpl sm90_f16_##name();) EPIFUSE_IF_BF16(KernelImpl sm90_bf16_##name();)
#define SM90_GEMM(name, ...) EPIFUSE_SM90_EACH(name)
#define SM90_CONV(name, ...) EPIFUSE_SM90_EACH(name)
#include "kernels.def"
#undef EPIFUSE_SM90_EACH

std::vector<KernelImpl> sm90_kernels() {
  return {
#define EPIFUSE_SM90_EACH(name) EPIFUSE_IF_F16(sm90_f16_##name(), ) EPIFUSE_IF_BF16(sm90_bf16_##name(), )
#include "kernels.def"
  };
}

}  // namespace epifuse::cuda
