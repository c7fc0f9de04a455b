// Name -> implementation for every kernel compiled into this build.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernel_api.h"

namespace epifuse::cuda {

KernelImpl direct_kernel();
KernelImpl depthwise_kernel();
KernelImpl gemv_kernel();
KernelImpl stem_kernel();

std::vector<KernelImpl> direct_kernels() { return {gemv_kernel(), stem_kernel(), depthwise_kernel(), direct_kernel()}; }
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

bool current_device_sms(int* device, int* sms) {
  static std::atomic<int> cached[64] = {};
  if (cudaGetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool cacheable = *device >= 0 && *device < 64;
  *sms = cacheable ? cached[*device].load(std::memory_order_relaxed) : 0;
  if (*sms > 0) return true;
  if (cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *device) != cudaSuccess || *sms < 1) {
    cudaGetLastError();
    return false;
  }
  if (cacheable) cached[*device].store(*sms, std::memory_order_relaxed);
  return true;
}

bool programmatic_launch_enabled() {
  const char* v = std::getenv("EPIFUSE_PDL");
  return v && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

Status check_launch(const char* kernel, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(kernel) + ": CUDA error " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace epifuse::cuda
