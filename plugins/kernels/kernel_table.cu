// Name -> implementation for every kernel compiled into this build.
#include <cstring>

#include "kernel_api.h"

namespace epifuse::cuda {

KernelImpl direct_kernel();
std::vector<KernelImpl> depthwise_kernels();
KernelImpl gemv_kernel();
KernelImpl stem_kernel();
KernelImpl stem_ffma_kernel();

std::vector<KernelImpl> direct_kernels() {
  std::vector<KernelImpl> v = {gemv_kernel(), stem_kernel(), stem_ffma_kernel()};
  for (const KernelImpl& k : depthwise_kernels()) v.push_back(k);
  v.push_back(direct_kernel());
  return v;
}
std::vector<KernelImpl> padded_kernels();
std::vector<KernelImpl> im2col_kernels();

#ifndef EPIFUSE_HAVE_SM80_FAMILY
std::vector<KernelImpl> sm80_kernels() { return {}; }
#endif
#ifndef EPIFUSE_HAVE_SM90
std::vector<KernelImpl> sm90_kernels() { return {}; }
#endif

namespace {
const std::vector<KernelImpl>& all_kernels() {
  static const std::vector<KernelImpl> all = [] {
    std::vector<KernelImpl> v;
    for (auto family : {sm90_kernels, im2col_kernels, padded_kernels, sm80_kernels, direct_kernels})
      for (const KernelImpl& k : family()) v.push_back(k);
    return v;
  }();
  return all;
}
}  // namespace

const KernelImpl* find_impl(const char* name) {
  for (const KernelImpl& k : all_kernels())
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

std::vector<const char*> compiled_kernel_names() {
  std::vector<const char*> names;
  for (const KernelImpl& k : all_kernels()) names.push_back(k.name);
  return names;
}

}  // namespace epifuse::cuda
