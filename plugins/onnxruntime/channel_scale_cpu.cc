// epifuse::ChannelScale on the CPUExecutionProvider: Y [N, H, W, C] = X [N, H, W, C] * S [N or 1, 1, 1, C],
// float or bfloat16. The optimizer writes it for ort-cpu in place of the squeeze-excite Mul of a channels-last region
// (optimizer/passes/channel_scale.py), whose last-axis broadcast ORT's Mul runs a row at a time. The
// core's kernel (plugins/core/channel_scale.h) on ORT's intra-op threads.
#include <string>

#include "channel_scale.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kChannelScale = "ChannelScale";

template <class T>
struct ChannelScaleCpuKernel : NamedNode {
  ChannelScaleCpuKernel(const OrtApi*, const OrtKernelInfo* info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(info), kChannelScale)} {
    require(require_inputs(Ort::ConstKernelInfo(info), {"X", "S"}));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& S, Tensor<T>& Y) {
    using Core = typename CoreType<T>::type;
    try {
      const Dims& x = X.Shape();
      const Dims& s = S.Shape();
      if (x.size() != 4) return error("X must be 4-D [N, H, W, C], got rank " + std::to_string(x.size()));
      if (s.size() != 4 || s[1] != 1 || s[2] != 1 || s[3] != x[3] || (s[0] != 1 && s[0] != x[0]))
        return error("S must be [N or 1, 1, 1, C] for X " + dims_text(x) + ", got " + dims_text(s));
      T* y = Y.Allocate(x);
      const Ort::KernelContext ctx(context);
      const Status status = channel_scale_cpu(reinterpret_cast<const Core*>(X.Data()), reinterpret_cast<const Core*>(S.Data()),
                                              reinterpret_cast<Core*>(y), x[0], x[1] * x[2], x[3],
                                              s[0] != 1 || x[0] == 1, ort_threads(ctx));
      if (!status.ok()) return error(status.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }
};

}  // namespace

void add_channel_scale_cpu_ops(OpList* ops) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<ChannelScaleCpuKernel<float>>(kChannelScale, "CPUExecutionProvider"));
  may_write_over_input_0(ops->back().get());  // y[i] is written after x[i] is read
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<ChannelScaleCpuKernel<Ort::BFloat16_t>>(kChannelScale, "CPUExecutionProvider"));
  may_write_over_input_0(ops->back().get());
}

}  // namespace epifuse::ort
