// The CPUExecutionProvider kernel of epifuse::NchwToNhwc (nchw_to_nhwc_op.h): a plain copy loop,
// there so that ort-cuda models also run (and verify) on the CPU.
#include "nchw_to_nhwc_op.h"

namespace epifuse::ort {
namespace {

template <class T>
struct NchwToNhwcCpuKernel {
  NchwToNhwcCpuKernel(const OrtApi*, const OrtKernelInfo* info) : node_(info) {}

  Ort::Status Compute(const Tensor<T>& X, Tensor<T>& Y) {
    return node_.run(X, Y, [](const T* x, T* y, int64_t N, int64_t C, int64_t H, int64_t W) {
      const int64_t hw = H * W;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < hw; ++p)
          for (int64_t c = 0; c < C; ++c) y[(n * hw + p) * C + c] = x[(n * C + c) * hw + p];
      return Status::Ok();
    });
  }

 private:
  LayoutNode node_;
};

}  // namespace

void add_layout_cpu_ops(OpList* ops) { add_layout_ops<NchwToNhwcCpuKernel>(ops, "CPUExecutionProvider"); }

}  // namespace epifuse::ort
