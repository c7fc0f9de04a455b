// What every CUDA FusedConv kernel provides to the registry: a workspace size and a launch on
// a stream. Whether a kernel can run a problem is decided in plugins/core (registry + rules),
// which builds without CUDA, so the optimizer and TensorRT's tactic list agree with it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "conv_problem.h"
#include "heuristics.h"
#include "status.h"

// The 16-bit twins this build compiles (EPIFUSE_CUDA_DTYPES in CMake): the kernel tables list only those.
#ifdef EPIFUSE_BUILD_F16
#define EPIFUSE_IF_F16(...) __VA_ARGS__
#else
#define EPIFUSE_IF_F16(...)
#endif
#ifdef EPIFUSE_BUILD_BF16
#define EPIFUSE_IF_BF16(...) __VA_ARGS__
#else
#define EPIFUSE_IF_BF16(...)
#endif

namespace epifuse::cuda {

// Device pointers: X [N,H,W,C], W [K,R,S,C/group], B [K], Z [N,P,Q,K] or null, Y [N,P,Q,K],
// all in problem.dtype. No allocation, no synchronisation: everything runs on `stream`.
struct Tensors {
  const void* x;
  const void* w;
  const void* b;
  const void* z;
  void* y;
};

struct KernelImpl {
  const char* name;  // the registry's kernel name
  size_t (*workspace_size)(const ConvProblem& p);
  Status (*launch)(const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream);
};

// Each family lists the kernels compiled into this build (one translation unit per configuration).
std::vector<KernelImpl> direct_kernels();
std::vector<KernelImpl> sm80_kernels();
std::vector<KernelImpl> sm90_kernels();

// A family whose kernel I is named by plugins/core (kName(I), the names in one place) and implemented by
// kWorkspace(name, p) / kLaunch(name, ...): the im2col + GEMM and channel-padding kernels.
template <const char* (*kName)(int), size_t (*kWorkspace)(const char*, const ConvProblem&),
          Status (*kLaunch)(const char*, const ConvProblem&, const Tensors&, void*, size_t, cudaStream_t), int kCount>
struct NamedFamily {
  static std::vector<KernelImpl> kernels() { return kernels(std::make_integer_sequence<int, kCount>{}); }

 private:
  template <int I>
  static size_t workspace_of(const ConvProblem& p) {
    return kWorkspace(kName(I), p);
  }
  template <int I>
  static Status launch_of(const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes, cudaStream_t stream) {
    return kLaunch(kName(I), p, t, ws, ws_bytes, stream);
  }
  template <int... I>
  static std::vector<KernelImpl> kernels(std::integer_sequence<int, I...>) {
    return {KernelImpl{kName(I), workspace_of<I>, launch_of<I>}...};
  }
};

// The implementation of registry kernel `name`, or null when this build does not contain it.
const KernelImpl* find_impl(const char* name);
// Every implementation in this build, whether a registry rule names it or not (the manifest test's view).
std::vector<const char*> compiled_kernel_names();

// The current device and its SM count, cached per device (launch paths call it on every run);
// false, with the CUDA error cleared, when CUDA cannot say.
bool current_device_sms(int* device, int* sms);
// The current device as the registry's rules see it: compute capability and SM count (0 where CUDA
// cannot say: the heuristics' default). An error, with the CUDA error cleared, when there is no device.
Status current_device_info(DeviceInfo* out);

// The workspace size of the kernels that need none.
inline size_t no_workspace(const ConvProblem&) { return 0; }

// Programmatic dependent launch for the kernels that support it (EPIFUSE_PDL=1; off by default
// until measured): such a kernel may be scheduled while the previous kernel on the stream drains,
// and waits (griddepcontrol.wait) for that grid's completion and memory before its first access.
// Read on every launch, so tests can switch it per process state.
bool programmatic_launch_enabled();

// cudaError_t -> Status naming the kernel.
Status check_launch(const char* kernel, cudaError_t e);

}  // namespace epifuse::cuda
