// epifuse::ChannelConcat and ChannelSlice on the CPUExecutionProvider, float or bfloat16. ChannelConcat:
// Y [N, H, W, C_1 + ... + C_n] = X_1 [N, H, W, C_1], ..., X_n (n >= 2, one element type) joined along the
// last axis. ChannelSlice: Y [N, H, W, end - start] = X [N, H, W, C] channels [start, min(end, C)). The
// optimizer writes them for ort-cpu in place of a channels-last region's Concat, Split and Slice along
// the channels (optimizer/passes/channel_copy.py), which ORT copies a pixel's few channels at a time.
// The core's kernels (plugins/core/channel_copy.h) on ORT's intra-op threads.
//
// ChannelConcat's inputs are variadic: the lite API's TensorArray reads no bfloat16 (onnxruntime 1.21's header), so
// the kernel takes the context alone and the op's input and output descriptions are set on the
// OrtCustomOp after its creation, as may_write_over_input_0 sets GetMayInplace.
#include <algorithm>
#include <string>
#include <vector>

#include "channel_copy.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kChannelConcat = "ChannelConcat";
constexpr const char* kChannelSlice = "ChannelSlice";

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
        if (d.size() != 4) return error("input " + std::to_string(k) + " must be 4-D [N, H, W, C], got " + dims_text(d));
        if (k == 0) {
          out = d;
          out[3] = 0;
        } else if (d[0] != out[0] || d[1] != out[1] || d[2] != out[2]) {
          return error("input " + std::to_string(k) + " " + dims_text(d) + " differs from input 0 in N, H or W " +
                       dims_text({out[0], out[1], out[2]}));
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
struct ChannelSliceCpuKernel : NamedNode {
  ChannelSliceCpuKernel(const OrtApi*, const OrtKernelInfo* info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(info), kChannelSlice)} {
    const Ort::ConstKernelInfo i(info);
    require(require_inputs(i, {"X"}));
    auto attribute = [&](const char* name) {
      const auto value = optional_attribute(name, [&] { return i.GetAttribute<int64_t>(name); });
      if (!value) require(Status::Error(std::string("attribute '") + name + "' is missing"));
      return *value;
    };
    start_ = attribute("start");
    end_ = attribute("end");
    if (start_ < 0 || end_ <= start_)
      require(Status::Error("channels [" + std::to_string(start_) + ", " + std::to_string(end_) +
                            ") are not a range of at least one from 0 up"));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, Tensor<T>& Y) {
    try {
      const Dims& x = X.Shape();
      if (x.size() != 4) return error("X must be 4-D [N, H, W, C], got " + dims_text(x));
      const int64_t end = std::min(end_, x[3]);
      if (end <= start_)
        return error("channels [" + std::to_string(start_) + ", " + std::to_string(end_) + ") of X " +
                     dims_text(x) + " are empty");
      T* y = Y.Allocate({x[0], x[1], x[2], end - start_});
      const Ort::KernelContext ctx(context);
      const Status status = channel_slice_cpu(X.DataRaw(), x[3], start_, end - start_, y, x[0] * x[1] * x[2],
                                              sizeof(T), ort_threads(ctx));
      if (!status.ok()) return error(status.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  int64_t start_ = 0, end_ = 0;
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

void add_channel_copy_cpu_ops(OpList* ops) {
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<ChannelConcatCpuKernel<float>>(kChannelConcat, "CPUExecutionProvider"));
  describe_io<float>(ops->back().get());
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<ChannelConcatCpuKernel<Ort::BFloat16_t>>(
      kChannelConcat, "CPUExecutionProvider"));
  describe_io<Ort::BFloat16_t>(ops->back().get());
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<ChannelSliceCpuKernel<float>>(kChannelSlice, "CPUExecutionProvider"));
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<ChannelSliceCpuKernel<Ort::BFloat16_t>>(kChannelSlice, "CPUExecutionProvider"));
}

}  // namespace epifuse::ort
