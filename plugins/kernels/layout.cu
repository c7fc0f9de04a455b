// NCHW -> NHWC (epifuse::NchwToNhwc). One thread per pixel reads its C values from C planes (each
// plane read coalesced across the warp) and writes them contiguously (a warp writes 32*C adjacent
// elements), so for C = 3 both sides are coalesced, where ORT's Transpose kernel took 0.63 ms for
// 32x3x640x640 fp16 (H200, docs/bench-models.md; this kernel alone is not profiled yet: YOLOv8s b32
// went 5.44 -> 4.98 ms with it and one more kernel change). Any C is correct; large C would want a
// tiled transpose.
#include <algorithm>
#include <string>

#include "layout.h"

namespace epifuse::cuda {
namespace {

template <class E>
__global__ void nchw_to_nhwc_kernel(const E* __restrict__ x, E* __restrict__ y, int64_t C, int64_t pixels_per_image,
                                    int64_t pixels) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pixels; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / pixels_per_image;
    const E* src = x + n * C * pixels_per_image + (i - n * pixels_per_image);
    E* dst = y + i * C;
    for (int64_t c = 0; c < C; ++c) dst[c] = src[c * pixels_per_image];
  }
}

template <class E>
Status launch(const void* x, void* y, int64_t C, int64_t hw, int64_t pixels, cudaStream_t stream) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
                                                    cudaSuccess)
    sms = 132;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((pixels + kThreads - 1) / kThreads, int64_t(sms) * 16);
  nchw_to_nhwc_kernel<E><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const E*>(x),
                                                                                 static_cast<E*>(y), C, hw, pixels);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : Status::Error(std::string("nchw_to_nhwc: ") + cudaGetErrorString(e));
}

}  // namespace

Status nchw_to_nhwc(const void* x, void* y, int64_t N, int64_t C, int64_t H, int64_t W, size_t element_bytes,
                    cudaStream_t stream) {
  if (N < 0 || C < 0 || H < 0 || W < 0) return Status::Error("nchw_to_nhwc: negative extent");
  const int64_t pixels = N * H * W;
  if (pixels == 0 || C == 0) return Status::Ok();
  switch (element_bytes) {
    case 2: return launch<uint16_t>(x, y, C, H * W, pixels, stream);
    case 4: return launch<uint32_t>(x, y, C, H * W, pixels, stream);
    default: return Status::Error("nchw_to_nhwc: element size " + std::to_string(element_bytes) + " (2 or 4)");
  }
}

}  // namespace epifuse::cuda
