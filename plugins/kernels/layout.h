// Layout kernels of the ORT custom-op library besides FusedConv (epifuse::NchwToNhwc).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "status.h"

namespace epifuse::cuda {

// Y[n,h,w,c] = X[n,c,h,w] for elements of `element_bytes` (2 or 4) bytes, on `stream`; no
// synchronisation. Meant for few channels (an RGB input), where ONNX Runtime's Transpose tiles 32x32
// blocks of which only C rows hold data.
Status nchw_to_nhwc(const void* x, void* y, int64_t N, int64_t C, int64_t H, int64_t W, size_t element_bytes,
                    cudaStream_t stream);

}  // namespace epifuse::cuda
