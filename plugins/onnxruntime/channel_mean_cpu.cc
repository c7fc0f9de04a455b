// epifuse::ChannelMean on the CPUExecutionProvider: Y [N, 1, 1, C] = the mean of X [N, H, W, C] (float, bfloat16)
// over H and W. The optimizer writes it for ort-cpu in place of the global average pool of a
// channels-last region (optimizer/passes/channel_mean.py), which ORT would run as a ReduceMean over the
// middle axes. The core's kernel (plugins/core/channel_mean.h) on ORT's intra-op threads.
#include <string>

#include "channel_mean.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kChannelMean = "ChannelMean";

template <class T>
struct ChannelMeanCpuKernel : NamedNode {
  ChannelMeanCpuKernel(const OrtApi*, const OrtKernelInfo* info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(info), kChannelMean)} {
    require(require_inputs(Ort::ConstKernelInfo(info), {"X"}));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, Tensor<T>& Y) {
    using Core = typename CoreType<T>::type;
    try {
      const Dims& x = X.Shape();
      if (x.size() != 4) return error("X must be 4-D [N, H, W, C], got rank " + std::to_string(x.size()));
      T* y = Y.Allocate({x[0], 1, 1, x[3]});
      const Ort::KernelContext ctx(context);
      const Status status = channel_mean_cpu(reinterpret_cast<const Core*>(X.Data()), reinterpret_cast<Core*>(y), x[0],
                                             x[1] * x[2], x[3], ort_threads(ctx));
      if (!status.ok()) return error(status.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }
};

}  // namespace

void add_channel_mean_cpu_ops(OpList* ops) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<ChannelMeanCpuKernel<float>>(kChannelMean, "CPUExecutionProvider"));
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<ChannelMeanCpuKernel<Ort::BFloat16_t>>(kChannelMean, "CPUExecutionProvider"));
}

}  // namespace epifuse::ort
