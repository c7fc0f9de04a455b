// ONNX Runtime custom-op library for epifuse::FusedConv: the CPUExecutionProvider kernel (float,
// float16, bfloat16; FusedConvMean, FusedConv with its output's channel mean; FusedConvScaled, FusedConv
// of its input times a channel scale) and, in CUDA builds, the CUDAExecutionProvider kernel
// (fused_conv_cuda.cc).
// API glue only: attribute parsing, validation and the kernels live in plugins/core and
// plugins/kernels. Built against the oldest supported ORT headers with ORT_API_MANUAL_INIT and
// without linking libonnxruntime: the host process supplies the API table through
// RegisterCustomOps.
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_fused_conv.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

template <class T>
struct FusedConvCpuKernel {
  FusedConvCpuKernel(const OrtApi*, const OrtKernelInfo* info, const char* op_type = "FusedConv",
                     std::initializer_list<const char*> inputs = {"X", "W", "B"})
      : node_(info, op_type, inputs), w_constant_(constant_input(Ort::ConstKernelInfo(info), 1)) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B,
                      std::optional<const Tensor<T>*> Z, Tensor<T>& Y) {
    return compute(context, X, W, B, Z, Y, nullptr);
  }

 protected:
  // Y, and where `M` the mean of Y over its rows and columns ([N, 1, 1, K]).
  Ort::Status compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B,
                      std::optional<const Tensor<T>*> Z, Tensor<T>& Y, Tensor<T>* M) {
    try {
      const Tensor<T>* z = node_.residual(Z);
      epifuse::ConvProblem p;
      Status s = node_.bind(X, W, B, z, &p);
      if (s.ok()) {
        T* y = Y.Allocate({p.N, p.P(), p.Q(), p.K});
        T* m = M ? M->Allocate({p.N, 1, 1, p.K}) : nullptr;
        const Ort::KernelContext ctx(context);
        s = cpu_.run(p, X.DataRaw(), W.DataRaw(), w_constant_, B.DataRaw(), z ? z->DataRaw() : nullptr, y,
                     ort_threads(ctx), m);
      }
      if (!s.ok()) return node_.error(s.message());
    } catch (const std::exception& e) {
      return node_.error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

  NodeAttributes<T> node_;
  bool w_constant_ = false;  // W is an initializer: its reordered copy is made once
  epifuse::CpuFusedConv cpu_;
};

constexpr const char* kFusedConvMean = "FusedConvMean";

// epifuse::FusedConvMean (CPU, float and bfloat16): FusedConv, and M [N, 1, 1, K], the mean of Y over its rows
// and columns: a depthwise conv and the squeeze-excite pool that reads its output, one node
// (optimizer/passes/conv_mean.py), the pool summed in the depthwise kernel's registers.
template <class T>
struct FusedConvMeanCpuKernel : FusedConvCpuKernel<T> {
  FusedConvMeanCpuKernel(const OrtApi* api, const OrtKernelInfo* info)
      : FusedConvCpuKernel<T>(api, info, kFusedConvMean) {
    this->node_.require(require_outputs(Ort::ConstKernelInfo(info), {"Y", "M"}));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B,
                      std::optional<const Tensor<T>*> Z, Tensor<T>& Y, Tensor<T>& M) {
    return this->compute(context, X, W, B, Z, Y, &M);
  }
};

constexpr const char* kFusedConvScaled = "FusedConvScaled";

// epifuse::FusedConvScaled (CPU, float and bfloat16): FusedConv of X * S, S [N or 1, 1, 1, C] a squeeze-excite
// gate (optimizer/passes/conv_scale.py). Inputs X, W, B, S and the optional Z. Where the filters are the
// smaller tensor they are scaled instead of X, so the gated tensor is never written (CpuFusedConv::run_scaled).
template <class T>
struct FusedConvScaledCpuKernel : FusedConvCpuKernel<T> {
  FusedConvScaledCpuKernel(const OrtApi* api, const OrtKernelInfo* info)
      : FusedConvCpuKernel<T>(api, info, kFusedConvScaled, {"X", "W", "B", "S"}) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B,
                      const Tensor<T>& S, std::optional<const Tensor<T>*> Z, Tensor<T>& Y) {
    const auto& node = this->node_;
    try {
      const Tensor<T>* z = node.residual(Z);
      epifuse::ConvProblem p;
      Status s = node.bind(X, W, B, z, &p);
      const Dims& scale = S.Shape();
      if (s.ok() && (scale.size() != 4 || scale[1] != 1 || scale[2] != 1 || scale[3] != p.C ||
                     (scale[0] != 1 && scale[0] != p.N)))
        return node.error("S must be [N or 1, 1, 1, C] for X " + epifuse::dims_text(X.Shape()) + ", got " +
                          epifuse::dims_text(scale));
      if (s.ok()) {
        T* y = Y.Allocate({p.N, p.P(), p.Q(), p.K});
        const Ort::KernelContext ctx(context);
        s = this->cpu_.run_scaled(p, X.DataRaw(), S.DataRaw(), scale[0] != 1, W.DataRaw(), this->w_constant_,
                                  B.DataRaw(), z ? z->DataRaw() : nullptr, y, ort_threads(ctx));
      }
      if (!s.ok()) return node.error(s.message());
    } catch (const std::exception& e) {
      return node.error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }
};

}  // namespace

void add_cpu_ops(OpList* ops) {
  add_typed_ops<FusedConvCpuKernel>(ops, "CPUExecutionProvider");
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<FusedConvMeanCpuKernel<float>>(kFusedConvMean, "CPUExecutionProvider"));
  ops->emplace_back(
      Ort::Custom::CreateLiteCustomOp<FusedConvMeanCpuKernel<Ort::BFloat16_t>>(kFusedConvMean, "CPUExecutionProvider"));
  using Ort::Custom::CreateLiteCustomOp;
  ops->emplace_back(CreateLiteCustomOp<FusedConvScaledCpuKernel<float>>(kFusedConvScaled, "CPUExecutionProvider"));
  ops->emplace_back(
      CreateLiteCustomOp<FusedConvScaledCpuKernel<Ort::BFloat16_t>>(kFusedConvScaled, "CPUExecutionProvider"));
  add_layout_cpu_ops(ops);
  add_channel_scale_cpu_ops(ops);
  add_channel_mean_cpu_ops(ops);
  add_channel_copy_cpu_ops(ops);
  add_layer_norm_cpu_ops(ops);
  add_pointwise_depthwise_cpu_ops(ops);
}

}  // namespace epifuse::ort

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  // The API version these headers were built with; a newer runtime still serves it, an older
  // one returns null, and then there is no API even to build an error status with.
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) return nullptr;
  Ort::InitApi(api);

  // The domain and its ops must outlive every session that uses them.
  static std::once_flag once;
  static std::unique_ptr<Ort::CustomOpDomain> domain;
  static std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>> ops;
  try {
    std::call_once(once, [] {
      domain = std::make_unique<Ort::CustomOpDomain>("epifuse");
      epifuse::ort::add_cpu_ops(&ops);
      epifuse::ort::add_cuda_ops(&ops);
      for (const auto& op : ops) domain->Add(op.get());
    });
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const std::exception& e) {
    return Ort::Status(e.what(), ORT_FAIL).release();
  }
  return nullptr;
}
