// What every kernel's launch path uses beside the kernel (kernel_api.h): the device's SM count, the
// programmatic-launch switch, CUDA error statuses. Apart from kernel_table.cu so that the benchmark
// harnesses (bench/*.cu, EPIFUSE_BENCH=ON) link the same code instead of copies.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernel_api.h"

namespace epifuse::cuda {

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

Status current_device_info(DeviceInfo* out) {
  // Cached per device like the SM count: the split pool's launch asks on every run.
  static std::atomic<int> cached_sm[64] = {};
  int device = 0, major = 0, minor = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  const bool cacheable = e == cudaSuccess && device >= 0 && device < 64;
  int sm = cacheable ? cached_sm[device].load(std::memory_order_relaxed) : 0;
  if (e == cudaSuccess && sm == 0) {
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    sm = major * 10 + minor;
    if (e == cudaSuccess && cacheable) cached_sm[device].store(sm, std::memory_order_relaxed);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();  // non-sticky: not the caller's next check's
    *out = {};
    return Status::Error(std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  if (!current_device_sms(&device, &sms)) sms = 0;
  *out = {sm, sms};
  return Status::Ok();
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
