// Workspace helpers of the wrapper kernel families (padded_channels.cu, im2col_gemm.cu), which copy
// operands into a zero-padded layout before running an inner kernel.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "conv_problem.h"
#include "dtype.cuh"

namespace epifuse::cuda {

inline size_t element_bytes(DType t) { return t == DType::kFloat ? 4 : 2; }

// Sub-buffers of a workspace start 256-byte aligned, as cudaMalloc'd memory does.
inline size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Internal linkage: each .cu gets its own copy of the kernel (no relocatable device code).
namespace {

// out [rows, c_padded] = in [rows, c] with zero columns c..c_padded-1.
template <class T>
__global__ void pad_channels(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int c, int c_padded) {
  const int64_t total = rows * c_padded;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / c_padded;
    const int ch = int(i - row * c_padded);
    out[i] = ch < c ? in[row * c + ch] : from_float<T>(0.f);
  }
}

template <class T>
void launch_pad_channels(const void* in, void* out, int64_t rows, int c, int c_padded, cudaStream_t stream) {
  const int64_t total = rows * c_padded;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>((total + 255) / 256, 1 << 20)));
  pad_channels<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(in), static_cast<T*>(out), rows, c, c_padded);
}

}  // namespace
}  // namespace epifuse::cuda
