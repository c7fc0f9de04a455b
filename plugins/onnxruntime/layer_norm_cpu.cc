// epifuse::LayerNorm on the CPUExecutionProvider: LayerNormalization over the last axis of a float X,
// Y = (X - mean) / sqrt(var + epsilon) * Scale (+ B), Scale and B of the last axis' length. The optimizer
// writes it for ort-cpu in place of such a LayerNormalization (optimizer/passes/layer_norm.py), which ORT
// runs at ~36 cycles a vector. The core's kernel (plugins/core/layer_norm.h) on ORT's intra-op threads.
#include <optional>
#include <string>

#include "layer_norm.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kLayerNorm = "LayerNorm";

struct LayerNormCpuKernel : NamedNode {
  LayerNormCpuKernel(const OrtApi*, const OrtKernelInfo* raw_info) {
    const Ort::ConstKernelInfo info(raw_info);
    node = describe_node(info, kLayerNorm);
    require(require_inputs(info, {"X", "Scale"}));
    has_bias_ = has_input(info, 2);
    epsilon_ = optional_attribute("epsilon", [&] { return info.GetAttribute<float>("epsilon"); }).value_or(1e-5f);
    if (!(epsilon_ >= 0.f)) require(Status::Error("epsilon must be >= 0, got " + std::to_string(epsilon_)));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& X, const Tensor<float>& Scale,
                      std::optional<const Tensor<float>*> B, Tensor<float>& Y) {
    try {
      const Dims& x = X.Shape();
      if (x.empty()) return error("X must have at least one axis, got a scalar");
      const int64_t C = x.back();
      const Tensor<float>* bias = has_bias_ ? B.value_or(nullptr) : nullptr;
      if (Scale.NumberOfElement() != C)
        return error("Scale must hold the last axis' " + std::to_string(C) + " values, got " +
                     std::to_string(Scale.NumberOfElement()));
      if (bias && bias->NumberOfElement() != C)
        return error("B must hold the last axis' " + std::to_string(C) + " values, got " +
                     std::to_string(bias->NumberOfElement()));
      float* y = Y.Allocate(x);
      const int64_t rows = C ? X.NumberOfElement() / C : 0;
      const Ort::KernelContext ctx(context);
      const Status status = layer_norm_cpu(X.Data(), Scale.Data(), bias ? bias->Data() : nullptr, y, rows, C,
                                           epsilon_, ort_threads(ctx));
      if (!status.ok()) return error(status.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  bool has_bias_ = false;
  float epsilon_ = 1e-5f;
};

}  // namespace

void add_layer_norm_cpu_ops(OpList* ops) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<LayerNormCpuKernel>(kLayerNorm, "CPUExecutionProvider"));
  may_write_over_input_0(ops->back().get());  // y[i] is written after x[i] is read
}

}  // namespace epifuse::ort
