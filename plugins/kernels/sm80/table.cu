// The CUTLASS 2.x sm80 family compiled into this build, in the order of its rules
// (plugins/core/rules_sm80.cc). Each factory lives in its own translation unit.
#include "kernel_api.h"

namespace epifuse::cuda {
namespace sm80 {
#define EPIFUSE_SM80_CONFIGS(X) \
  X(fixed8_128x64x32_3st)       \
  X(64x64x64_4st)               \
  X(128x64x64_4st)              \
  X(128x128x64_3st)             \
  X(fewch_128x64x32_2st)        \
  X(unaligned_64x64x32_2st)     \
  X(splitk_64x64x64_4st)
#define EPIFUSE_SM80_DECLARE(cfg) EPIFUSE_IF_F16(KernelImpl f16_##cfg();) EPIFUSE_IF_BF16(KernelImpl bf16_##cfg();)
EPIFUSE_SM80_CONFIGS(EPIFUSE_SM80_DECLARE)
#undef EPIFUSE_SM80_DECLARE
KernelImpl f32_3xtf32_128x64x16_4st();
}  // namespace sm80

std::vector<KernelImpl> sm80_kernels() {
  std::vector<KernelImpl> v;
#define EPIFUSE_SM80_LIST(cfg) EPIFUSE_IF_F16(v.push_back(sm80::f16_##cfg());) EPIFUSE_IF_BF16(v.push_back(sm80::bf16_##cfg());)
  EPIFUSE_SM80_CONFIGS(EPIFUSE_SM80_LIST)
#undef EPIFUSE_SM80_LIST
  v.push_back(sm80::f32_3xtf32_128x64x16_4st());
  return v;
}

}  // namespace epifuse::cuda
