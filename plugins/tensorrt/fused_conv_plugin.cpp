#include "fused_conv_plugin.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

namespace epifuse::trt {

using nvinfer1::DataType;
using nvinfer1::DimensionOperation;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

// plugins/core mirrors PluginFieldType so that it builds and is tested without TensorRT.
#define EPIFUSE_SAME_FIELD_TYPE(trt, core) \
  static_assert(static_cast<int32_t>(PluginFieldType::trt) == static_cast<int32_t>(FieldType::core), #trt)
EPIFUSE_SAME_FIELD_TYPE(kFLOAT16, kFloat16);
EPIFUSE_SAME_FIELD_TYPE(kFLOAT32, kFloat32);
EPIFUSE_SAME_FIELD_TYPE(kFLOAT64, kFloat64);
EPIFUSE_SAME_FIELD_TYPE(kINT8, kInt8);
EPIFUSE_SAME_FIELD_TYPE(kINT16, kInt16);
EPIFUSE_SAME_FIELD_TYPE(kINT32, kInt32);
EPIFUSE_SAME_FIELD_TYPE(kCHAR, kChar);
EPIFUSE_SAME_FIELD_TYPE(kDIMS, kDims);
EPIFUSE_SAME_FIELD_TYPE(kUNKNOWN, kUnknown);
EPIFUSE_SAME_FIELD_TYPE(kBF16, kBFloat16);
EPIFUSE_SAME_FIELD_TYPE(kINT64, kInt64);
#undef EPIFUSE_SAME_FIELD_TYPE

namespace {

constexpr int32_t kX = 0, kW = 1, kB = 2, kZ = 3;

bool to_dtype(DataType t, DType* out) {
  switch (t) {
    case DataType::kFLOAT: *out = DType::kFloat; return true;
    case DataType::kHALF: *out = DType::kFloat16; return true;
    case DataType::kBF16: *out = DType::kBFloat16; return true;
    default: return false;
  }
}

Dims to_dims(const nvinfer1::Dims& d) { return Dims(d.d, d.d + d.nbDims); }

// Constant extents of symbolic dimensions, -1 where not (yet) known.
Dims known_dims(const nvinfer1::DimsExprs& e) {
  Dims d;
  for (int32_t i = 0; i < e.nbDims; ++i) d.push_back(e.d[i]->isConstant() ? e.d[i]->getConstantValue() : -1);
  return d;
}

Status check_inputs(const ConvAttributes& a, int32_t nbInputs) {
  if (nbInputs != 3 && nbInputs != 4)
    return Status::Error("expected inputs X, W, B and an optional Z, got " + std::to_string(nbInputs) + " inputs");
  return check_residual_input(a.residual, nbInputs == 4);
}

Status bind_problem(const ConvAttributes& a, DType dtype, const Dims& x, const Dims& w, const Dims& b, const Dims* z,
            ConvProblem* p) {
  return bind_shapes(a, dtype, x, w, &b, z != nullptr, z, p);
}

// The current device as the registry's rules see it; compute capability 0 (any) where there is no
// device, e.g. while TensorRT-RTX builds on a machine without a GPU.
DeviceInfo current_device() {
  DeviceInfo d;
  (void)cuda::current_device_info(&d);  // no device: {0, 0}, the error cleared for TensorRT's next check
  return d;
}

bool compiled(const char* kernel) { return cuda::find_impl(kernel) != nullptr; }

// IExprBuilder as output_extent's expression operations.
struct ExprOps {
  nvinfer1::IExprBuilder& builder;
  using Expr = const nvinfer1::IDimensionExpr*;
  Expr constant(int64_t v) { return builder.constant(v); }
  Expr op(DimensionOperation o, Expr a, Expr b) { return a && b ? builder.operation(o, *a, *b) : nullptr; }
  Expr add(Expr a, Expr b) { return op(DimensionOperation::kSUM, a, b); }
  Expr sub(Expr a, Expr b) { return op(DimensionOperation::kSUB, a, b); }
  Expr mul(Expr a, Expr b) { return op(DimensionOperation::kPROD, a, b); }
  Expr floor_div(Expr a, Expr b) { return op(DimensionOperation::kFLOOR_DIV, a, b); }
};

void log_error(const std::string& text) {
  if (nvinfer1::ILogger* logger = plugin_logger()) {
    logger->log(nvinfer1::ILogger::Severity::kERROR, text.c_str());
  } else {
    std::fprintf(stderr, "[epifuse] %s\n", text.c_str());
  }
}

}  // namespace

// ------------------------------------------------------------------------------------ plugin

FusedConvPlugin::FusedConvPlugin(std::string node_name, const ConvAttributes& attributes)
    : node_name_(std::move(node_name)), attributes_(attributes) {}

// Everything but the field storage, which getFieldsToSerialize rebuilds in each object.
FusedConvPlugin::FusedConvPlugin(const FusedConvPlugin& other)
    : nvinfer1::IPluginV3(other),
      nvinfer1::IPluginV3OneCore(other),
      nvinfer1::IPluginV3OneBuild(other),
      nvinfer1::IPluginV3OneRuntime(other),
      node_name_(other.node_name_),
      attributes_(other.attributes_),
      dtype_(other.dtype_),
      tactics_(other.tactics_),
      workspace_bytes_(other.workspace_bytes_),
      tactic_(other.tactic_),
      problem_(other.problem_),
      kernel_(other.kernel_),
      kernel_workspace_(other.kernel_workspace_),
      has_residual_(other.has_residual_),
      recorder_(other.recorder_) {}

int32_t FusedConvPlugin::fail(const std::string& message, nvinfer1::ErrorCode code) const {
  const std::string text = std::string(kPluginName) + " '" + node_name_ + "': " + message;
  if (recorder_) {
    recorder_->reportError(code, text.c_str());
  } else {
    log_error(text);
  }
  return -1;
}

nvinfer1::IPluginCapability* FusedConvPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept {
  switch (type) {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
  }
  return nullptr;
}

nvinfer1::IPluginV3* FusedConvPlugin::clone() noexcept {
  try {
    return new FusedConvPlugin(*this);
  } catch (const std::exception& e) {
    fail(std::string("clone: ") + e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
    return nullptr;
  }
}

int32_t FusedConvPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs, const DataType* inputTypes,
                                            int32_t nbInputs) const noexcept {
  try {
    const Status s = check_inputs(attributes_, nbInputs);
    if (!s.ok()) return fail(s.message());
    if (nbOutputs != 1) return fail("expected 1 output, got " + std::to_string(nbOutputs));
    DType t;
    if (!to_dtype(inputTypes[kX], &t))
      return fail("input X has TensorRT data type " + std::to_string(static_cast<int32_t>(inputTypes[kX])) +
                  " (expected float32, float16 or bfloat16)");
    static const char* const names[] = {"X", "W", "B", "Z"};
    for (int32_t i = 1; i < nbInputs; ++i) {
      if (inputTypes[i] != inputTypes[kX])
        return fail(std::string("input ") + names[i] + " has another type than X (" + dtype_name(t) +
                    "): every input must have the same type");
    }
    outputTypes[0] = inputTypes[kX];
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
  }
}

int32_t FusedConvPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                         const nvinfer1::DimsExprs*, int32_t, nvinfer1::DimsExprs* outputs,
                                         int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept {
  try {
    Status s = check_inputs(attributes_, nbInputs);
    if (!s.ok()) return fail(s.message());
    if (nbOutputs != 1) return fail("expected 1 output, got " + std::to_string(nbOutputs));
    // Validate what is already known (W and B are constants; N, H, W of X may be symbolic).
    const Dims z = nbInputs == 4 ? known_dims(inputs[kZ]) : Dims();
    ConvProblem p;
    s = bind_problem(attributes_, DType::kFloat, known_dims(inputs[kX]), known_dims(inputs[kW]), known_dims(inputs[kB]),
             nbInputs == 4 ? &z : nullptr, &p);
    if (!s.ok()) return fail(s.message());

    const nvinfer1::DimsExprs& x = inputs[kX];
    const nvinfer1::DimsExprs& w = inputs[kW];
    const ConvAttributes& a = attributes_;
    ExprOps ops{exprBuilder};
    nvinfer1::DimsExprs& y = outputs[0];
    y.nbDims = 4;
    y.d[0] = x.d[0];
    y.d[1] = output_extent(ops, x.d[1], w.d[1], a.pad_top, a.pad_bottom, a.dil_h, a.stride_h);
    y.d[2] = output_extent(ops, x.d[2], w.d[2], a.pad_left, a.pad_right, a.dil_w, a.stride_w);
    y.d[3] = w.d[0];
    if (!y.d[1] || !y.d[2]) return fail("IExprBuilder returned no expression for the output size",
                                        nvinfer1::ErrorCode::kINTERNAL_ERROR);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
  }
}

bool FusedConvPlugin::supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* inOut, int32_t nbInputs,
                                                int32_t nbOutputs) noexcept {
  // Linear NHWC everywhere (the op contract's logical layout), one type for every tensor.
  if (pos < 0 || pos >= nbInputs + nbOutputs) return false;
  const nvinfer1::PluginTensorDesc& d = inOut[pos].desc;
  if (d.format != TensorFormat::kLINEAR) return false;
  DType t;
  return pos == 0 ? to_dtype(d.type, &t) : d.type == inOut[0].desc.type;
}

Status FusedConvPlugin::profile_corners(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                        std::vector<ConvProblem>* corners) const {
  EPIFUSE_RETURN_IF_ERROR(check_inputs(attributes_, nbInputs));
  DType dtype;
  if (!to_dtype(in[kX].desc.type, &dtype)) return Status::Error("input X has an unsupported data type");
  corners->clear();
  for (nvinfer1::Dims DynamicPluginTensorDesc::*which :
       {&DynamicPluginTensorDesc::min, &DynamicPluginTensorDesc::opt, &DynamicPluginTensorDesc::max}) {
    const Dims z = nbInputs == 4 ? to_dims(in[kZ].*which) : Dims();
    ConvProblem p;
    EPIFUSE_RETURN_IF_ERROR(bind_problem(attributes_, dtype, to_dims(in[kX].*which), to_dims(in[kW].*which),
                                 to_dims(in[kB].*which), nbInputs == 4 ? &z : nullptr, &p));
    corners->push_back(p);
  }
  return Status::Ok();
}

int32_t FusedConvPlugin::configurePlugin(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                         const DynamicPluginTensorDesc*, int32_t) noexcept {
  try {
    std::vector<ConvProblem> corners;
    const Status s = profile_corners(in, nbInputs, &corners);
    if (!s.ok()) return fail(s.message());
    dtype_ = corners.front().dtype;
    has_residual_ = nbInputs == 4;
    std::string why;
    tactics_.clear();
    workspace_bytes_ = 0;
    for (const KernelDescriptor* k : profile_kernels(corners, current_device(), compiled, &why)) {
      tactics_.push_back(tactic_id(k->name));
      workspace_bytes_ = std::max(workspace_bytes_, cuda::find_impl(k->name)->workspace_size(corners.back()));
    }
    if (tactics_.empty()) return fail(why);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
  }
}

size_t FusedConvPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                                         const DynamicPluginTensorDesc*, int32_t) const noexcept {
  // Every tactic at the profile's largest shapes: enqueue never allocates.
  try {
    std::vector<ConvProblem> corners;
    if (!profile_corners(inputs, nbInputs, &corners).ok()) return workspace_bytes_;
    size_t bytes = 0;
    for (int32_t t : tactics_) {
      const KernelDescriptor* k = kernel_for_tactic(t);
      const cuda::KernelImpl* impl = k ? cuda::find_impl(k->name) : nullptr;
      if (impl) bytes = std::max(bytes, impl->workspace_size(corners.back()));
    }
    return std::max(bytes, workspace_bytes_);
  } catch (const std::exception&) {
    return workspace_bytes_;
  }
}

int32_t FusedConvPlugin::getValidTactics(int32_t* tactics, int32_t nbTactics) noexcept {
  if (nbTactics != static_cast<int32_t>(tactics_.size()))
    return fail("getValidTactics asked for " + std::to_string(nbTactics) + " tactics, " +
                std::to_string(tactics_.size()) + " are valid");
  std::copy(tactics_.begin(), tactics_.end(), tactics);
  return 0;
}

const char* FusedConvPlugin::getTimingCacheID() noexcept {
  try {
    timing_cache_id_ = timing_cache_id(attributes_);
    return timing_cache_id_.c_str();
  } catch (const std::exception& e) {
    fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
    return nullptr;  // no caching for this layer
  }
}

int32_t FusedConvPlugin::setTactic(int32_t tactic) noexcept {
  if (tactic != 0) {
    const KernelDescriptor* k = kernel_for_tactic(tactic);
    if (!k || !compiled(k->name))
      return fail("tactic " + std::to_string(tactic) + " names no kernel of this library (engine built with "
                  "another epifuse version?)");
  }
  tactic_ = tactic;
  kernel_ = nullptr;  // onShapeChange picks it for the next shapes
  return 0;
}

int32_t FusedConvPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                       const nvinfer1::PluginTensorDesc*, int32_t) noexcept {
  try {
    Status s = check_inputs(attributes_, nbInputs);
    if (!s.ok()) return fail(s.message());
    DType dtype;
    if (!to_dtype(in[kX].type, &dtype)) return fail("input X has an unsupported data type");
    const Dims z = nbInputs == 4 ? to_dims(in[kZ].dims) : Dims();
    s = bind_problem(attributes_, dtype, to_dims(in[kX].dims), to_dims(in[kW].dims), to_dims(in[kB].dims),
             nbInputs == 4 ? &z : nullptr, &problem_);
    if (!s.ok()) return fail(s.message());
    has_residual_ = nbInputs == 4;
    kernel_ = nullptr;
    std::string why;
    if (tactic_ != 0) {
      const KernelDescriptor* k = kernel_for_tactic(tactic_);
      if (!k) return fail("tactic " + std::to_string(tactic_) + " names no kernel");
      if (!k->can_implement(problem_, &why)) return fail(std::string(k->name) + " cannot run these shapes: " + why);
      kernel_ = cuda::find_impl(k->name);
    } else {
      for (const KernelDescriptor* k : find_kernels("tensorrt", problem_, &why, current_device())) {
        if ((kernel_ = cuda::find_impl(k->name))) break;
      }
    }
    if (!kernel_) return fail(why.empty() ? "no kernel of this library runs these shapes" : why);
    kernel_workspace_ = kernel_->workspace_size(problem_);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
  }
}

int32_t FusedConvPlugin::enqueue(const nvinfer1::PluginTensorDesc*, const nvinfer1::PluginTensorDesc*,
                                 const void* const* inputs, void* const* outputs, void* workspace,
                                 cudaStream_t stream) noexcept {
  if (!kernel_) return fail("enqueue before a successful onShapeChange", nvinfer1::ErrorCode::kFAILED_EXECUTION);
  const cuda::Tensors t{inputs[kX], inputs[kW], inputs[kB], has_residual_ ? inputs[kZ] : nullptr, outputs[0]};
  try {
    const Status s = kernel_->launch(problem_, t, workspace, kernel_workspace_, stream);
    return s.ok() ? 0 : fail(s.message(), nvinfer1::ErrorCode::kFAILED_EXECUTION);
  } catch (const std::exception& e) {
    return fail(e.what(), nvinfer1::ErrorCode::kFAILED_EXECUTION);
  }
}

nvinfer1::IPluginV3* FusedConvPlugin::attachToContext(nvinfer1::IPluginResourceContext* context) noexcept {
  auto* copy = static_cast<FusedConvPlugin*>(clone());
  if (copy && context) copy->recorder_ = context->getErrorRecorder();
  return copy;
}

const nvinfer1::PluginFieldCollection* FusedConvPlugin::getFieldsToSerialize() noexcept {
  try {
    const Status s = serialized_.assign(attributes_);
    if (!s.ok()) {
      fail(s.message());
      return nullptr;
    }
    fields_.clear();
    for (const Field& f : serialized_.fields())
      fields_.emplace_back(f.name, f.data, static_cast<PluginFieldType>(f.type), f.length);
    field_collection_.nbFields = static_cast<int32_t>(fields_.size());
    field_collection_.fields = fields_.data();
    return &field_collection_;
  } catch (const std::exception& e) {
    fail(e.what(), nvinfer1::ErrorCode::kINTERNAL_ERROR);
    return nullptr;
  }
}

// ----------------------------------------------------------------------------------- creator

FusedConvCreator::FusedConvCreator() {
  for (const FieldSpec& spec : plugin_field_specs())
    fields_.emplace_back(spec.name, nullptr, static_cast<PluginFieldType>(spec.type), spec.length);
  field_names_.nbFields = static_cast<int32_t>(fields_.size());
  field_names_.fields = fields_.data();
}

nvinfer1::IPluginV3* FusedConvCreator::createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                                    nvinfer1::TensorRTPhase) noexcept {
  const std::string node = name ? name : "";
  try {
    // Build phase: the ONNX node's attributes; runtime phase: getFieldsToSerialize's fields.
    std::vector<Field> fields;
    for (int32_t i = 0; fc && fc->fields && i < fc->nbFields; ++i) {
      const nvinfer1::PluginField& f = fc->fields[i];
      fields.push_back({f.name, f.data, static_cast<FieldType>(f.type), f.length});
    }
    ConvAttributes attributes;
    const Status s = attributes_from_fields(fields.data(), static_cast<int32_t>(fields.size()), &attributes);
    if (!s.ok()) {
      log_error(std::string(kPluginName) + " '" + node + "': " + s.message());
      return nullptr;
    }
    return new FusedConvPlugin(node, attributes);
  } catch (const std::exception& e) {
    log_error(std::string(kPluginName) + " '" + node + "': " + e.what());
    return nullptr;
  }
}

}  // namespace epifuse::trt
