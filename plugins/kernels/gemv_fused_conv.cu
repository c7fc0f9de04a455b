// A 1x1 conv over few pixels (squeeze-excite blocks on [N,1,1,C], heads at batch 1) is a GEMM with
// M = N*H*W <= 32 rows: a tensor-core tile of 64-128 rows computes mostly padding and walks the whole
// reduction in one CTA, and the direct kernel gives each output's C-long dot product to one thread.
// Here a warp owns one output channel k and kRows rows: its lanes split C (16-byte loads where C and
// the pointers allow), then a shuffle reduction and the fused epilogue. Blocks tile (k, rows): each row
// block reads all of W again (from L2), so a warp takes as many rows as still leave two blocks per SM
// (EfficientNet's 48 -> 1152 excite at batch 32: 2 row blocks instead of 8), never more than M needs,
// and the 4 rows that spread even K = 4 channels at M = 32 over 8 blocks where that is too few. Rule:
// plugins/core/rules_direct.cc.
#include <cstdint>
#include <type_traits>

#include "dtype.cuh"
#include "epilogue.cuh"
#include "kernel_api.h"

namespace epifuse::cuda {
namespace {

constexpr int kWarps = 4;  // output channels per block

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// X [M, C], W [K, C], Y and Z [M, K]; V elements per load (16 / sizeof(T) when aligned, else 1); kRows
// rows per warp (at most 32: lane r stores row r).
template <class T, int V, int kRows>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fused_conv(int M, int C, int K, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    const T* __restrict__ z, T* __restrict__ y, Epilogue epilogue) {
  const int lane = threadIdx.x % 32;
  const int k = blockIdx.x * kWarps + threadIdx.x / 32;
  const int m0 = blockIdx.y * kRows;
  if (k >= K) return;
  const T* wk = w + int64_t(k) * C;
  float acc[kRows] = {};
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<T, V> wv = *reinterpret_cast<const Vec<T, V>*>(wk + c);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (m0 + r >= M) break;
      const Vec<T, V> xv = *reinterpret_cast<const Vec<T, V>*>(x + int64_t(m0 + r) * C + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[r] += to_float(xv.v[j]) * to_float(wv.v[j]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  const float bias = to_float(b[k]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {  // lane r writes row m0 + r (all lanes hold every sum)
    const int m = m0 + r;
    if (lane != r || m >= M) continue;
    const int64_t out = int64_t(m) * K + k;
    y[out] = from_float<T>(epilogue(acc[r], bias, z ? to_float(z[out]) : 0.f));
  }
}


Status launch(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  const int64_t rows = p.N * p.H * p.W;
  if (rows == 0 || p.K == 0) return Status::Ok();
  if (rows > INT32_MAX || p.C > INT32_MAX || p.K > INT32_MAX)
    return Status::Error("cuda_gemv_1x1: M, C and K must fit in int32");
  const int M = int(rows), C = int(p.C), K = int(p.K);
  int device = 0, sms = 0;
  if (!current_device_sms(&device, &sms)) return Status::Error("cuda_gemv_1x1: the device's SM count is unknown");
  const int k_blocks = (K + kWarps - 1) / kWarps;
  const auto row_blocks = [&](int rows_per_warp) { return (M + rows_per_warp - 1) / rows_per_warp; };
  const auto worth = [&](int rows_per_warp) {  // M needs more than half of them, and the blocks still fill
    return M > rows_per_warp / 2 && int64_t(k_blocks) * row_blocks(rows_per_warp) >= 2 * sms;
  };
  const int rows_per_warp = worth(16) ? 16 : worth(8) ? 8 : 4;
  const dim3 grid(unsigned(k_blocks), unsigned(row_blocks(rows_per_warp)));
  const bool aligned16 = ((reinterpret_cast<uintptr_t>(t.x) | reinterpret_cast<uintptr_t>(t.w)) % 16) == 0;
  visit_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const auto* x = static_cast<const T*>(t.x);
    const auto* w = static_cast<const T*>(t.w);
    const auto* b = static_cast<const T*>(t.b);
    const auto* z = static_cast<const T*>(t.z);
    auto* y = static_cast<T*>(t.y);
    const auto run = [&](auto rows_tag) {
      constexpr int kRows = decltype(rows_tag)::value;
      if (aligned16 && C % kVec == 0)
        gemv_fused_conv<T, kVec, kRows><<<grid, kWarps * 32, 0, stream>>>(M, C, K, x, w, b, z, y, Epilogue::of(p));
      else
        gemv_fused_conv<T, 1, kRows><<<grid, kWarps * 32, 0, stream>>>(M, C, K, x, w, b, z, y, Epilogue::of(p));
    };
    if (rows_per_warp == 16)
      run(std::integral_constant<int, 16>());
    else if (rows_per_warp == 8)
      run(std::integral_constant<int, 8>());
    else
      run(std::integral_constant<int, 4>());
  });
  return check_launch("cuda_gemv_1x1", cudaGetLastError());
}

}  // namespace

KernelImpl gemv_kernel() { return {"cuda_gemv_1x1", no_workspace, launch}; }

}  // namespace epifuse::cuda
