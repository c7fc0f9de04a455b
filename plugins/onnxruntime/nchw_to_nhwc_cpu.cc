// The CPUExecutionProvider kernel of epifuse::NchwToNhwc (nchw_to_nhwc_op.h): the core's row
// interleave (plugins/core/nchw_to_nhwc.h) on ORT's intra-op threads. The optimizer writes the op for
// ort-cpu too, where it is several times faster than ORT's Transpose; ort-cuda models verify on it.
#include "nchw_to_nhwc.h"
#include "nchw_to_nhwc_op.h"

namespace epifuse::ort {
namespace {

template <class T>
struct NchwToNhwcCpuKernel {
  NchwToNhwcCpuKernel(const OrtApi*, const OrtKernelInfo* info) : node_(info) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, Tensor<T>& Y) {
    return node_.run(X, Y, [context](const T* x, T* y, int64_t N, int64_t C, int64_t H, int64_t W) {
      const Ort::KernelContext ctx(context);
      return epifuse::nchw_to_nhwc_cpu(x, y, N, C, H, W, sizeof(T), ort_threads(ctx));
    });
  }

 private:
  LayoutNode node_;
};

}  // namespace

void add_layout_cpu_ops(OpList* ops) { add_layout_ops<NchwToNhwcCpuKernel>(ops, "CPUExecutionProvider"); }

}  // namespace epifuse::ort
