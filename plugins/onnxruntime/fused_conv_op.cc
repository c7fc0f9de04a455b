// ONNX Runtime custom-op library for epifuse::FusedConv (CPUExecutionProvider; float, float16,
// bfloat16). API glue only: attribute parsing, validation and the kernel live in plugins/core.
// Built against the oldest supported ORT headers with ORT_API_MANUAL_INIT and without linking
// libonnxruntime: the host process supplies the API table through RegisterCustomOps.
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "conv_problem.h"
#include "cpu_fused_conv.h"
#include "status.h"

namespace {

using epifuse::Dims;
using epifuse::DType;
using epifuse::Status;
using Ort::Custom::Tensor;

template <class T> constexpr DType kDType = DType::kFloat;
template <> constexpr DType kDType<Ort::Float16_t> = DType::kFloat16;
template <> constexpr DType kDType<Ort::BFloat16_t> = DType::kBFloat16;

// ORT reports a missing attribute and a mistyped one with the same error code; only the message
// tells them apart. Missing takes the contract default; mistyped must fail, never fall back.
template <class Get>
auto optional_attribute(const char* name, Get get) -> std::optional<decltype(get())> {
  try {
    return get();
  } catch (const Ort::Exception& e) {
    const std::string message = e.what();
    if (message.find("No attribute with") != std::string::npos) return std::nullopt;
    throw Ort::Exception("attribute '" + std::string(name) + "': " + message, e.GetOrtErrorCode());
  }
}

epifuse::RawAttributes read_attributes(const Ort::ConstKernelInfo& info) {
  auto ints = [&](const char* name) {
    return optional_attribute(name, [&] { return info.GetAttributes<int64_t>(name); });
  };
  auto str = [&](const char* name) {
    return optional_attribute(name, [&] { return info.GetAttribute<std::string>(name); });
  };
  epifuse::RawAttributes a;
  a.strides = ints("strides");
  a.pads = ints("pads");
  a.dilations = ints("dilations");
  a.group = optional_attribute("group", [&] { return info.GetAttribute<int64_t>("group"); });
  a.activation = str("activation");
  a.activation_params =
      optional_attribute("activation_params", [&] { return info.GetAttributes<float>("activation_params"); });
  a.residual = str("residual");
  // plugin_namespace / plugin_version are for TensorRT's parser; nothing to check here.
  return a;
}

// Shape of input i as the graph declares it (-1 for symbolic dims), if it declares one.
std::optional<Dims> declared_shape(const Ort::ConstKernelInfo& info, size_t i) {
  try {
    const Ort::TypeInfo type = info.GetInputTypeInfo(i);
    if (type.GetONNXType() != ONNX_TYPE_TENSOR) return std::nullopt;
    return type.GetTensorTypeAndShapeInfo().GetShape();
  } catch (const Ort::Exception&) {
    return std::nullopt;  // only an early check: Compute validates the real shapes
  }
}

std::string describe_node(const Ort::ConstKernelInfo& info) {
  std::string name = info.GetNodeName();
  if (name.empty()) name = "(unnamed, output '" + info.GetOutputName(0) + "')";
  return "epifuse::FusedConv node '" + name + "'";
}

template <class T>
struct FusedConvKernel {
  FusedConvKernel(const OrtApi*, const OrtKernelInfo* raw_info) {
    const Ort::ConstKernelInfo info{raw_info};
    node_ = describe_node(info);
    Status s = Status::Ok();
    try {
      s = epifuse::parse_attributes(read_attributes(info), &attr_);
    } catch (const Ort::Exception& e) {
      s = Status::Error(e.what());
    }
    if (s.ok()) s = check_declared_shapes(info);
    // ORT turns an exception from kernel creation into a failed session creation.
    if (!s.ok()) throw Ort::Exception(node_ + ": " + s.message(), ORT_INVALID_GRAPH);
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W,
                      const Tensor<T>& B, std::optional<const Tensor<T>*> Z, Tensor<T>& Y) {
    try {
      const Tensor<T>* z = Z.value_or(nullptr);
      epifuse::ConvProblem p;
      Status s = epifuse::bind_shapes(attr_, kDType<T>, X.Shape(), W.Shape(), &B.Shape(),
                                      z != nullptr, z ? &z->Shape() : nullptr, &p);
      if (s.ok()) {
        T* y = Y.Allocate({p.N, p.P(), p.Q(), p.K});
        const Ort::KernelContext ctx(context);
        const epifuse::ParallelFor on_ort_threads = [&ctx](int64_t n, const std::function<void(int64_t)>& body) {
          ctx.ParallelFor([](void* fn, size_t i) { (*static_cast<const std::function<void(int64_t)>*>(fn))(i); },
                          static_cast<size_t>(n), 0, const_cast<std::function<void(int64_t)>*>(&body));
        };
        s = epifuse::cpu_fused_conv(p, X.DataRaw(), W.DataRaw(), B.DataRaw(), z ? z->DataRaw() : nullptr,
                                    y, on_ort_threads);
      }
      if (!s.ok()) return Ort::Status((node_ + ": " + s.message()).c_str(), ORT_INVALID_ARGUMENT);
    } catch (const std::exception& e) {
      return Ort::Status((node_ + ": " + e.what()).c_str(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  // Catches bad groups, channel counts and output sizes at session creation when the graph
  // declares the shapes; symbolic dims are checked in Compute.
  Status check_declared_shapes(const Ort::ConstKernelInfo& info) const {
    const bool has_z = info.GetInputCount() > 3;
    EPIFUSE_RETURN_IF_ERROR(epifuse::check_residual_input(attr_.residual, has_z));
    const auto x = declared_shape(info, 0), w = declared_shape(info, 1), b = declared_shape(info, 2);
    const auto z = has_z ? declared_shape(info, 3) : std::nullopt;
    if (!x || x->size() != 4 || !w || w->size() != 4) return Status::Ok();
    epifuse::ConvProblem unused;
    return epifuse::bind_shapes(attr_, kDType<T>, *x, *w, b && b->size() == 1 ? &*b : nullptr, has_z,
                                z && z->size() == 4 ? &*z : nullptr, &unused);
  }

  std::string node_;
  epifuse::ConvAttributes attr_;
};

}  // namespace

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
      constexpr const char* kCpu = "CPUExecutionProvider";
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<FusedConvKernel<float>>("FusedConv", kCpu));
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<FusedConvKernel<Ort::Float16_t>>("FusedConv", kCpu));
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<FusedConvKernel<Ort::BFloat16_t>>("FusedConv", kCpu));
      for (const auto& op : ops) domain->Add(op.get());
    });
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const std::exception& e) {
    return Ort::Status(e.what(), ORT_FAIL).release();
  }
  return nullptr;
}
