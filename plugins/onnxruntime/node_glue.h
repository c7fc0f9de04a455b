// Node glue shared by the CPU and CUDA kernels of the ONNX Runtime library: attribute reading,
// node naming and the early shape check at session creation. No math here (plugins/core).
#pragma once
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>

#include "conv_problem.h"
#include "float_types.h"
#include "parallel.h"
#include "status.h"

namespace epifuse::ort {

using epifuse::Dims;
using epifuse::DType;
using epifuse::Status;
using Ort::Custom::Tensor;
template <class T> constexpr DType kDType = DType::kFloat;
template <> constexpr DType kDType<Ort::Float16_t> = DType::kFloat16;
template <> constexpr DType kDType<Ort::BFloat16_t> = DType::kBFloat16;
// The core's element type for ORT's: the same bits (the 16-bit types are a uint16_t each).
template <class T> struct CoreType { using type = T; };
template <> struct CoreType<Ort::Float16_t> { using type = epifuse::float16_t; };
template <> struct CoreType<Ort::BFloat16_t> { using type = epifuse::bfloat16_t; };

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

inline epifuse::RawAttributes read_attributes(const Ort::ConstKernelInfo& info) {
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
  a.allow_tf32 = optional_attribute("allow_tf32", [&] { return info.GetAttribute<int64_t>("allow_tf32"); });
  // plugin_namespace / plugin_version are for TensorRT's parser; nothing to check here.
  return a;
}

// Shape of input i as the graph declares it (-1 for symbolic dims), if it declares one.
inline std::optional<Dims> declared_shape(const Ort::ConstKernelInfo& info, size_t i) {
  try {
    const Ort::TypeInfo type = info.GetInputTypeInfo(i);
    if (type.GetONNXType() != ONNX_TYPE_TENSOR) return std::nullopt;
    return type.GetTensorTypeAndShapeInfo().GetShape();
  } catch (const Ort::Exception&) {
    return std::nullopt;  // only an early check: Compute validates the real shapes
  }
}

// An input written as "" is an absent optional input to ONNX Runtime, which then hands the kernel no
// tensor for it: a required input named "" must fail at session creation, never reach Compute.
inline Status require_inputs(const Ort::ConstKernelInfo& info, std::initializer_list<const char*> names) {
  size_t i = 0;
  for (const char* name : names) {
    if (i >= info.GetInputCount() || info.GetInputName(i).empty())
      return Status::Error(std::string("input ") + std::to_string(i) + " (" + name + ") is missing or named \"\"");
    ++i;
  }
  return Status::Ok();
}

// ONNX Runtime's lite ops hand Compute every output they declare, whether or not the node has it: one the node
// lacks (or names "") would crash the run, so it must fail session creation instead.
inline Status require_outputs(const Ort::ConstKernelInfo& info, std::initializer_list<const char*> names) {
  size_t i = 0;
  for (const char* name : names) {
    if (i >= info.GetOutputCount() || info.GetOutputName(i).empty())
      return Status::Error(std::string("output ") + std::to_string(i) + " (" + name + ") is missing or named \"\"");
    ++i;
  }
  return Status::Ok();
}

// Whether input i is a constant initializer (the same data on every run), so a kernel may keep a prepared
// copy of it; false where ORT cannot say.
inline bool constant_input(const Ort::ConstKernelInfo& info, size_t i) {
  int constant = 0;
  try {
    info.GetTensorConstantInput(i, &constant);
  } catch (const Ort::Exception&) {
    constant = 0;
  }
  return constant != 0;
}

// Whether optional input i is there: present and not named "" (ORT gives such an input no tensor).
inline bool has_input(const Ort::ConstKernelInfo& info, size_t i) {
  return info.GetInputCount() > i && !info.GetInputName(i).empty();
}

// The core's ParallelFor on ORT's intra-op thread pool, so a session's intra_op_num_threads holds.
// Valid while `ctx` is.
inline epifuse::ParallelFor ort_threads(const Ort::KernelContext& ctx) {
  return [&ctx](int64_t n, const std::function<void(int64_t)>& body) {
    ctx.ParallelFor([](void* fn, size_t i) { (*static_cast<const std::function<void(int64_t)>*>(fn))(i); },
                    static_cast<size_t>(n), 0, const_cast<std::function<void(int64_t)>*>(&body));
  };
}

inline std::string describe_node(const Ort::ConstKernelInfo& info, const char* op_type = "FusedConv") {
  std::string name = info.GetNodeName();
  if (name.empty()) name = "(unnamed, output '" + info.GetOutputName(0) + "')";
  return std::string("epifuse::") + op_type + " node '" + name + "'";
}

// A kernel's node (describe_node's text), named in every error its kernel throws or returns.
struct NamedNode {
  std::string node;

  // At kernel creation: a failed `s` throws, which ORT turns into a failed session creation.
  void require(const Status& s) const {
    if (!s.ok()) throw Ort::Exception(node + ": " + s.message(), ORT_INVALID_GRAPH);
  }
  // At run time: the status a Compute returns.
  Ort::Status error(const std::string& message, OrtErrorCode code = ORT_INVALID_ARGUMENT) const {
    return Ort::Status((node + ": " + message).c_str(), code);
  }
};

// Parses and validates the node's attributes at kernel creation; a failure throws, which ORT
// turns into a failed session creation naming the node.
template <class T>
struct NodeAttributes : NamedNode {
  epifuse::ConvAttributes attr;
  bool has_z = false;  // Z given (an input named "" is no Z)
  size_t z_input = 3;  // Z's input index: 3, or 4 after FusedConvScaled's S

  explicit NodeAttributes(const OrtKernelInfo* raw_info, const char* op_type = "FusedConv",
                          std::initializer_list<const char*> required = {"X", "W", "B"})
      : z_input(required.size()) {
    const Ort::ConstKernelInfo info{raw_info};
    node = describe_node(info, op_type);
    Status s = Status::Ok();
    try {
      s = require_inputs(info, required);
      has_z = has_input(info, z_input);
      if (s.ok() && info.GetInputCount() > z_input && !has_z)  // the contract omits an absent Z; "" is not that
        s = Status::Error("input " + std::to_string(z_input) + " (Z) is named \"\": omit it when there is no residual");
      if (s.ok()) s = epifuse::parse_attributes(read_attributes(info), &attr);
    } catch (const Ort::Exception& e) {
      s = Status::Error(e.what());
    }
    if (s.ok()) s = check_declared_shapes(info);
    require(s);
  }

  // Z as the kernel may read it: null where the node has none.
  const Tensor<T>* residual(std::optional<const Tensor<T>*> Z) const { return has_z ? Z.value_or(nullptr) : nullptr; }

  // The problem of one run, from the real input shapes.
  Status bind(const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B, const Tensor<T>* z,
              epifuse::ConvProblem* p) const {
    return epifuse::bind_shapes(attr, kDType<T>, X.Shape(), W.Shape(), &B.Shape(), z != nullptr,
                                z ? &z->Shape() : nullptr, p);
  }

 private:
  // Catches bad groups, channel counts and output sizes at session creation when the graph
  // declares the shapes; symbolic dims are checked at run time.
  Status check_declared_shapes(const Ort::ConstKernelInfo& info) const {
    EPIFUSE_RETURN_IF_ERROR(epifuse::check_residual_input(attr.residual, has_z));
    const auto x = declared_shape(info, 0), w = declared_shape(info, 1), b = declared_shape(info, 2);
    const auto z = has_z ? declared_shape(info, z_input) : std::nullopt;
    if (!x || x->size() != 4 || !w || w->size() != 4) return Status::Ok();
    epifuse::ConvProblem unused;
    return epifuse::bind_shapes(attr, kDType<T>, *x, *w, b && b->size() == 1 ? &*b : nullptr, has_z,
                                z && z->size() == 4 ? &*z : nullptr, &unused);
  }
};

}  // namespace epifuse::ort
