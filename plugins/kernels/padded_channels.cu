// Channel padding in front of a tensor-core kernel: X [N,H,W,C] and W [K,R,S,C] are copied into
// the workspace with zero channels up to C' = roundup(C, 8), then the inner kernel (named by
// padded_inner_kernel) runs the padded problem. The extra channels multiply zeros, so the result
// is the unpadded convolution; the copy costs one pass over X, far less than a few-channel
// kernel loses (C = 3 cannot feed 16-byte cp.async/TMA rows).
#include <cstdint>
#include <utility>

#include "dtype.cuh"
#include "kernel_api.h"
#include "pad_copy.cuh"
#include "registry.h"

namespace epifuse::cuda {
namespace {

struct Layout {
  size_t x_bytes, w_bytes, inner_bytes;
};

Layout layout(const char* name, const ConvProblem& p) {
  const ConvProblem q = channel_padded(p);
  const KernelImpl* inner = find_impl(padded_inner_kernel(name));
  return {align256(size_t(q.N) * q.H * q.W * q.C * element_bytes(p.dtype)),
          align256(size_t(q.K) * q.R * q.S * q.C * element_bytes(p.dtype)), inner ? inner->workspace_size(q) : 0};
}

size_t workspace_size(const char* name, const ConvProblem& p) {
  const Layout l = layout(name, p);
  return l.x_bytes + l.w_bytes + l.inner_bytes;
}

Status launch(const char* name, const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  const KernelImpl* inner = find_impl(padded_inner_kernel(name));
  if (!inner) return Status::Error(std::string(name) + ": inner kernel not in this build");
  const Layout l = layout(name, p);
  if (workspace_bytes < l.x_bytes + l.w_bytes + l.inner_bytes) return Status::Error(std::string(name) + ": workspace too small");
  const ConvProblem q = channel_padded(p);
  auto* base = static_cast<char*>(workspace);
  void* x = base;
  void* w = base + l.x_bytes;
  visit_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_pad_channels<T>(t.x, x, p.N * p.H * p.W, int(p.C), int(q.C), stream);
    launch_pad_channels<T>(t.w, w, p.K * p.R * p.S, int(p.C), int(q.C), stream);
  });
  EPIFUSE_RETURN_IF_ERROR(check_launch(name, cudaGetLastError()));
  return inner->launch(q, {x, w, t.b, t.z, t.y}, base + l.x_bytes + l.w_bytes, l.inner_bytes, stream);
}

}  // namespace

std::vector<KernelImpl> padded_kernels() {
  return NamedFamily<padded_kernel_name, workspace_size, launch, kPaddedKernelCount>::kernels();
}

}  // namespace epifuse::cuda
