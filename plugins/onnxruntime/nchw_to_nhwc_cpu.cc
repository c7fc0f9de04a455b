// The CPUExecutionProvider kernel of epifuse::NchwToNhwc (nchw_to_nhwc_op.h): a plain copy loop,
// there so that ort-cuda models also run (and verify) on the CPU.
#include <cstring>

#include "nchw_to_nhwc_op.h"

namespace epifuse::ort {
namespace {

template <class T>
struct NchwToNhwcCpuKernel {
  NchwToNhwcCpuKernel(const OrtApi*, const OrtKernelInfo* info) : node_(info) {}

  Ort::Status Compute(const Tensor<T>& X, Tensor<T>& Y) {
    try {
      Dims shape;
      const Status s = node_.output_shape(X.Shape(), &shape);
      if (!s.ok()) return node_.error(s.message());
      const int64_t N = shape[0], H = shape[1], W = shape[2], C = shape[3], hw = H * W;
      T* y = Y.Allocate(shape);
      const T* x = X.Data();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < hw; ++p)
          for (int64_t c = 0; c < C; ++c) y[(n * hw + p) * C + c] = x[(n * C + c) * hw + p];
    } catch (const std::exception& e) {
      return node_.error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  LayoutNode node_;
};

}  // namespace

void add_layout_cpu_ops(OpList* ops) { add_layout_ops<NchwToNhwcCpuKernel>(ops, "CPUExecutionProvider"); }

}  // namespace epifuse::ort
