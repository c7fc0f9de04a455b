// The CUTLASS 2.x sm80 family compiled into this build: every kernels.def line in its dtypes (the
// 16-bit twins of EPIFUSE_CUDA_DTYPES), one generated translation unit each (sources.cmake).
#include "kernel_api.h"

#define EPIFUSE_SM80_DTYPES_F16_BF16(name, X) EPIFUSE_IF_F16(X(f16_##name)) EPIFUSE_IF_BF16(X(bf16_##name))
#define EPIFUSE_SM80_DTYPES_F32_3XTF32(name, X) X(f32_##name)
#define EPIFUSE_SM80_DTYPES_F32_TF32(name, X) X(tf32_##name)
#define SM80_CONV(name, kind, dtypes, ...) EPIFUSE_SM80_DTYPES_##dtypes(name, EPIFUSE_SM80_EACH)

namespace epifuse::cuda {
namespace sm80 {
#define EPIFUSE_SM80_EACH(fn) KernelImpl fn();
#include "kernels.def"
#undef EPIFUSE_SM80_EACH
}  // namespace sm80

std::vector<KernelImpl> sm80_kernels() {
  return {
#define EPIFUSE_SM80_EACH(fn) sm80::fn(),
#include "kernels.def"
  };
}

}  // namespace epifuse::cuda
