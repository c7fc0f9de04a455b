// The CUDAExecutionProvider kernel of epifuse::NchwToNhwc (nchw_to_nhwc_op.h): one launch on ORT's
// compute stream, no synchronisation, no allocation besides the output (CUDA-graph capture works).
#include <cuda_runtime_api.h>

#include "layout.h"
#include "nchw_to_nhwc_op.h"

namespace epifuse::ort {
namespace {

template <class T>
struct NchwToNhwcCudaKernel {
  NchwToNhwcCudaKernel(const OrtApi*, const OrtKernelInfo* info) : node_(info) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, Tensor<T>& Y) {
    return node_.run(X, Y, [context](const T* x, T* y, int64_t N, int64_t C, int64_t H, int64_t W) {
      const auto stream = static_cast<cudaStream_t>(Ort::KernelContext(context).GetGPUComputeStream());
      return cuda::nchw_to_nhwc(x, y, N, C, H, W, sizeof(T), stream);
    });
  }

 private:
  LayoutNode node_;
};

}  // namespace

void add_layout_cuda_ops(OpList* ops) { add_layout_ops<NchwToNhwcCudaKernel>(ops, "CUDAExecutionProvider"); }

}  // namespace epifuse::ort
