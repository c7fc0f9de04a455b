// The fallback kernel: one thread per output element, any dtype, group, stride, dilation and
// padding. Correct for every valid problem; the CUTLASS kernels are the fast paths.
#include "dtype.cuh"
#include "epilogue.cuh"
#include "kernel_api.h"

namespace epifuse::cuda {
namespace {

struct Geometry {
  int64_t N, H, W, C, K, R, S, P, Q, Cg, Kg;
  int64_t stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
};

template <class T>
__global__ void direct_fused_conv(Geometry g, const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ b, const T* __restrict__ z, T* __restrict__ y,
                                  Epilogue epilogue) {
  const int64_t total = g.N * g.P * g.Q * g.K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i % g.K;
    const int64_t q = (i / g.K) % g.Q;
    const int64_t p = (i / (g.K * g.Q)) % g.P;
    const int64_t n = i / (g.K * g.Q * g.P);
    const int64_t c0 = (k / g.Kg) * g.Cg;
    float acc = 0.f;
    for (int64_t r = 0; r < g.R; ++r) {
      const int64_t h = p * g.stride_h - g.pad_top + r * g.dil_h;
      if (h < 0 || h >= g.H) continue;
      for (int64_t s = 0; s < g.S; ++s) {
        const int64_t wi = q * g.stride_w - g.pad_left + s * g.dil_w;
        if (wi < 0 || wi >= g.W) continue;
        const T* xp = x + ((n * g.H + h) * g.W + wi) * g.C + c0;
        const T* wp = w + ((k * g.R + r) * g.S + s) * g.Cg;
        for (int64_t c = 0; c < g.Cg; ++c) acc += to_float(xp[c]) * to_float(wp[c]);
      }
    }
    y[i] = from_float<T>(epilogue(acc, to_float(b[k]), z ? to_float(z[i]) : 0.f));
  }
}


Status launch(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  const Geometry g{p.N, p.H, p.W, p.C, p.K, p.R, p.S, p.P(), p.Q(), p.C / p.attr.group, p.K / p.attr.group,
                   p.attr.stride_h, p.attr.stride_w, p.attr.dil_h, p.attr.dil_w, p.attr.pad_top, p.attr.pad_left};
  const int64_t total = g.N * g.P * g.Q * g.K;
  if (total == 0) return Status::Ok();
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 65535LL * 32));
  visit_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    direct_fused_conv<T><<<blocks, threads, 0, stream>>>(g, static_cast<const T*>(t.x), static_cast<const T*>(t.w),
                                                         static_cast<const T*>(t.b), static_cast<const T*>(t.z),
                                                         static_cast<T*>(t.y), Epilogue::of(p));
  });
  return check_launch("cuda_direct", cudaGetLastError());
}

}  // namespace

KernelImpl direct_kernel() { return {"cuda_direct", no_workspace, launch}; }

}  // namespace epifuse::cuda
