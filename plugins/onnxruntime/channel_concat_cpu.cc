// epifuse::ChannelConcat on the CPUExecutionProvider: Y [N, H, W, C_1 + ... + C_n] = X_1 [N, H, W, C_1], ...,
// X_n (n >= 2, one element type: float or bfloat16) joined along the last axis. The optimizer writes it for
// ort-cpu in place of a channels-last region's Concat (optimizer/passes/channel_concat.py), which ORT's
// Concat copies a pixel's few channels at a time. The core's kernel (plugins/core/channel_concat.h) on
// ORT's intra-op threads.
//
// The inputs are variadic: the lite API's TensorArray reads no bfloat16 (onnxruntime 1.21's header), so
// the kernel takes the context alone and the op's input and output descriptions are set on the
// OrtCustomOp after its creation, as may_write_over_input_0 sets GetMayInplace.
#include <string>
#include <vector>

#include "channel_concat.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kChannelConcat = "ChannelConcat";

std::string shape_text(const Dims& d) {
  std::string text = "[";
  for (size_t i = 0; i < d.size(); ++i) text += (i ? ", " : "") + std::to_string(d[i]);
  return text + "]";
}

template <class T>
struct ChannelConcatCpuKernel : NamedNode {
  ChannelConcatCpuKernel(const OrtApi*, const OrtKernelInfo* info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(info), kChannelConcat)} {
    const Ort::ConstKernelInfo i(info);
    for (size_t k = 0; k < i.GetInputCount(); ++k)
      if (i.GetInputName(k).empty()) require(Status::Error("input " + std::to_string(k) + " is named \"\""));
  }

  Ort::Status Compute(OrtKernelContext* context) {
    try {
      const Ort::KernelContext ctx(context);
      const size_t n = ctx.GetInputCount();
      if (n < 2) return error("needs at least 2 inputs, got " + std::to_string(n));
      std::vector<const void*> x(n);
      std::vector<int64_t> channels(n);
      Dims out;
      for (size_t k = 0; k < n; ++k) {
        const Ort::ConstValue v = ctx.GetInput(k);
        const Dims d = v.GetTensorTypeAndShapeInfo().GetShape();
        if (d.size() != 4) return error("input " + std::to_string(k) + " must be 4-D [N, H, W, C], got " + shape_text(d));
        if (k == 0) {
          out = d;
          out[3] = 0;
        } else if (d[0] != out[0] || d[1] != out[1] || d[2] != out[2]) {
          return error("input " + std::to_string(k) + " " + shape_text(d) + " differs from input 0 in N, H or W " +
                       shape_text({out[0], out[1], out[2]}));
        }
        x[k] = v.GetTensorRawData();
        channels[k] = d[3];
        out[3] += d[3];
      }
      void* y = ctx.GetOutput(0, out).GetTensorMutableRawData();
      const Status status = channel_concat_cpu(x.data(), channels.data(), static_cast<int64_t>(n), y,
                                               out[0] * out[1] * out[2], sizeof(T), ort_threads(ctx));
      if (!status.ok()) return error(status.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }
};

template <class T>
constexpr ONNXTensorElementDataType kOnnxType = Ort::TypeToTensorType<T>::type;

// One variadic input of at least two tensors of T, all of T; one output of T.
template <class T>
void describe_io(Ort::Custom::OrtLiteCustomOp* op) {
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
  op->GetInputType = [](const OrtCustomOp*, size_t) { return kOnnxType<T>; };
  op->GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_VARIADIC; };
  op->GetVariadicInputMinArity = [](const OrtCustomOp*) { return 2; };
  op->GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op->GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
  op->GetOutputType = [](const OrtCustomOp*, size_t) { return kOnnxType<T>; };
  op->GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
}

}  // namespace

void add_channel_concat_cpu_ops(OpList* ops) {
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<ChannelConcatCpuKernel<float>>(kChannelConcat, "CPUExecutionProvider"));
  describe_io<float>(ops->back().get());
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<ChannelConcatCpuKernel<Ort::BFloat16_t>>(
      kChannelConcat, "CPUExecutionProvider"));
  describe_io<Ort::BFloat16_t>(ops->back().get());
}

}  // namespace epifuse::ort
