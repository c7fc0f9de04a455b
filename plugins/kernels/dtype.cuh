// Element types of the op contract in device code: load as float, store rounded to nearest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv_problem.h"

namespace epifuse::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Calls f(T{}) with the device type of `dtype`.
template <class F>
auto visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(__half{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
    case DType::kFloat: break;
  }
  return f(float{});
}

}  // namespace epifuse::cuda
