// epifuse::NchwToNhwc: Y [N,H,W,C] = X [N,C,H,W] transposed, T in {float, float16, bfloat16}. The
// optimizer writes it for ort-cuda and ort-cpu in place of the Transpose that takes a few-channel graph input
// into an NHWC region (optimizer/passes/input_layout.py). Node glue shared by its CPU and CUDA kernels.
#pragma once
#include <string>

#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {

constexpr const char* kNchwToNhwc = "NchwToNhwc";

struct LayoutNode : NamedNode {
  explicit LayoutNode(const OrtKernelInfo* info) : NamedNode{describe_node(Ort::ConstKernelInfo(info), kNchwToNhwc)} {
    require(require_inputs(Ort::ConstKernelInfo(info), {"X"}));
  }

  // One run of either kernel: checks X, allocates Y [N, H, W, C] and calls
  // `transpose(x, y, N, C, H, W) -> Status`; every error names the node.
  template <class T, class Transpose>
  Ort::Status run(const Tensor<T>& X, Tensor<T>& Y, Transpose transpose) const {
    try {
      const Dims& x = X.Shape();
      if (x.size() != 4) return error("X must be 4-D [N, C, H, W], got rank " + std::to_string(x.size()));
      T* y = Y.Allocate({x[0], x[2], x[3], x[1]});
      const Status s = transpose(X.Data(), y, x[0], x[1], x[2], x[3]);
      if (!s.ok()) return error(s.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }
};

// Registers Kernel<T> as NchwToNhwc on `provider` for float, float16 and bfloat16.
template <template <class> class Kernel>
void add_layout_ops(OpList* ops, const char* provider) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<float>>(kNchwToNhwc, provider));
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::Float16_t>>(kNchwToNhwc, provider));
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::BFloat16_t>>(kNchwToNhwc, provider));
}

}  // namespace epifuse::ort
