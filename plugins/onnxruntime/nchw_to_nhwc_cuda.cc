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
    try {
      Dims shape;
      Status s = node_.output_shape(X.Shape(), &shape);
      if (!s.ok()) return node_.error(s.message());
      T* y = Y.Allocate(shape);
      const Ort::KernelContext ctx(context);
      s = cuda::nchw_to_nhwc(X.DataRaw(), y, shape[0], shape[3], shape[1], shape[2], sizeof(T),
                             static_cast<cudaStream_t>(ctx.GetGPUComputeStream()));
      if (!s.ok()) return node_.error(s.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return node_.error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  LayoutNode node_;
};

}  // namespace

void add_layout_cuda_ops(OpList* ops) { add_layout_ops<NchwToNhwcCudaKernel>(ops, "CUDAExecutionProvider"); }

}  // namespace epifuse::ort
