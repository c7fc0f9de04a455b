#include "plugin_fields.h"

#include <cstring>
#include <limits>

namespace epifuse {
namespace {

constexpr const char* kStrides = "strides";
constexpr const char* kPads = "pads";
constexpr const char* kDilations = "dilations";
constexpr const char* kGroup = "group";
constexpr const char* kActivation = "activation";
constexpr const char* kActivationParams = "activation_params";
constexpr const char* kResidual = "residual";
constexpr const char* kAllowTf32 = "allow_tf32";

const char* type_name(FieldType t) {
  switch (t) {
    case FieldType::kFloat16: return "FLOAT16";
    case FieldType::kFloat32: return "FLOAT32";
    case FieldType::kFloat64: return "FLOAT64";
    case FieldType::kInt8: return "INT8";
    case FieldType::kInt16: return "INT16";
    case FieldType::kInt32: return "INT32";
    case FieldType::kChar: return "CHAR";
    case FieldType::kDims: return "DIMS";
    case FieldType::kUnknown: return "UNKNOWN";
    case FieldType::kBFloat16: return "BF16";
    case FieldType::kInt64: return "INT64";
  }
  return "unsupported type";
}

Status field_error(const Field& f, const std::string& what) {
  return Status::Error(std::string("field '") + f.name + "' (" + type_name(f.type) + " x " +
                       std::to_string(f.length) + "): " + what);
}

Status check_data(const Field& f) {
  if (f.length < 0) return field_error(f, "negative length");
  if (f.length > 0 && !f.data) return field_error(f, "data is null");
  return Status::Ok();
}

Status read_ints(const Field& f, std::vector<int64_t>* out) {
  EPIFUSE_RETURN_IF_ERROR(check_data(f));
  out->clear();
  for (int32_t i = 0; i < f.length; ++i) {
    if (f.type == FieldType::kInt32) {
      out->push_back(static_cast<const int32_t*>(f.data)[i]);
    } else if (f.type == FieldType::kInt64) {
      out->push_back(static_cast<const int64_t*>(f.data)[i]);
    } else {
      return field_error(f, "expected INT32 or INT64 values");
    }
  }
  return Status::Ok();
}

Status read_floats(const Field& f, std::vector<float>* out) {
  EPIFUSE_RETURN_IF_ERROR(check_data(f));
  out->clear();
  for (int32_t i = 0; i < f.length; ++i) {
    if (f.type == FieldType::kFloat32) {
      out->push_back(static_cast<const float*>(f.data)[i]);
    } else if (f.type == FieldType::kFloat64) {
      out->push_back(static_cast<float>(static_cast<const double*>(f.data)[i]));
    } else {
      return field_error(f, "expected FLOAT32 or FLOAT64 values");
    }
  }
  return Status::Ok();
}

// A kChar field holds the string's bytes, with or without the parser's terminating NUL.
Status read_string(const Field& f, std::string* out) {
  EPIFUSE_RETURN_IF_ERROR(check_data(f));
  if (f.type != FieldType::kChar) return field_error(f, "expected a CHAR string");
  const char* s = static_cast<const char*>(f.data);
  size_t n = 0;
  while (n < static_cast<size_t>(f.length) && s[n] != '\0') ++n;
  out->assign(s, n);
  return Status::Ok();
}

Status to_int32(const char* name, int64_t v, int32_t* out) {
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    return Status::Error(std::string("attribute '") + name + "' value " + std::to_string(v) +
                         " does not fit a 32-bit plugin field");
  *out = static_cast<int32_t>(v);
  return Status::Ok();
}

std::string join(std::initializer_list<int64_t> v, const char* sep) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : sep) + std::to_string(x);
  return s;
}

}  // namespace

const std::vector<FieldSpec>& plugin_field_specs() {
  static const std::vector<FieldSpec> specs = {
      {kStrides, FieldType::kInt32, 2},      {kPads, FieldType::kInt32, 4},
      {kDilations, FieldType::kInt32, 2},    {kGroup, FieldType::kInt32, 1},
      {kActivation, FieldType::kChar, 0},    {kActivationParams, FieldType::kFloat32, 0},
      {kResidual, FieldType::kChar, 0},      {kAllowTf32, FieldType::kInt32, 1},
  };
  return specs;
}

const char* activation_name(ActivationKind kind) {
  for (const ActivationSpec& spec : activation_table())
    if (spec.kind == kind) return spec.name;
  return "unknown";
}

Status attributes_from_fields(const Field* fields, int32_t n, ConvAttributes* out) {
  if (n < 0 || (n > 0 && !fields)) return Status::Error("the field collection is null or has a negative count");
  RawAttributes raw;
  std::vector<std::string> seen;
  for (int32_t i = 0; i < n; ++i) {
    const Field& f = fields[i];
    if (!f.name) return Status::Error("field " + std::to_string(i) + " has no name");
    const std::string name = f.name;
    for (const std::string& s : seen)
      if (s == name) return Status::Error("field '" + name + "' is given twice");
    seen.push_back(name);
    std::vector<int64_t> ints;
    if (name == kStrides || name == kPads || name == kDilations) {
      EPIFUSE_RETURN_IF_ERROR(read_ints(f, &ints));
      (name == kStrides ? raw.strides : name == kPads ? raw.pads : raw.dilations) = ints;
    } else if (name == kGroup || name == kAllowTf32) {
      EPIFUSE_RETURN_IF_ERROR(read_ints(f, &ints));
      if (ints.size() != 1) return field_error(f, "expected one value");
      (name == kGroup ? raw.group : raw.allow_tf32) = ints[0];
    } else if (name == kActivation || name == kResidual) {
      std::string s;
      EPIFUSE_RETURN_IF_ERROR(read_string(f, &s));
      (name == kActivation ? raw.activation : raw.residual) = s;
    } else if (name == kActivationParams) {
      std::vector<float> params;
      EPIFUSE_RETURN_IF_ERROR(read_floats(f, &params));
      raw.activation_params = params;
    } else {
      std::string known;
      for (const FieldSpec& s : plugin_field_specs()) known += std::string(known.empty() ? "" : ", ") + s.name;
      return Status::Error("unknown field '" + name + "' (expected " + known + ")");
    }
  }
  return parse_attributes(raw, out);
}

Status SerializedFields::assign(const ConvAttributes& a) {
  EPIFUSE_RETURN_IF_ERROR(validate_attributes(a));
  const struct { const char* name; int64_t value; int32_t* slot; } ints[] = {
      {kStrides, a.stride_h, &strides_[0]}, {kStrides, a.stride_w, &strides_[1]},
      {kPads, a.pad_top, &pads_[0]},        {kPads, a.pad_left, &pads_[1]},
      {kPads, a.pad_bottom, &pads_[2]},     {kPads, a.pad_right, &pads_[3]},
      {kDilations, a.dil_h, &dilations_[0]}, {kDilations, a.dil_w, &dilations_[1]},
      {kGroup, a.group, &group_},           {kAllowTf32, a.allow_tf32, &allow_tf32_},
  };
  for (const auto& i : ints) EPIFUSE_RETURN_IF_ERROR(to_int32(i.name, i.value, i.slot));
  int n_params = 0;
  for (const ActivationSpec& spec : activation_table())
    if (spec.kind == a.activation.kind) n_params = spec.n_params;
  for (int i = 0; i < 2; ++i) params_[i] = a.activation.params[i];
  activation_ = activation_name(a.activation.kind);
  residual_ = residual_name(a.residual);

  fields_.clear();
  fields_.push_back({kStrides, strides_, FieldType::kInt32, 2});
  fields_.push_back({kPads, pads_, FieldType::kInt32, 4});
  fields_.push_back({kDilations, dilations_, FieldType::kInt32, 2});
  fields_.push_back({kGroup, &group_, FieldType::kInt32, 1});
  fields_.push_back({kActivation, activation_.c_str(), FieldType::kChar, static_cast<int32_t>(activation_.size() + 1)});
  // Resolved values, defaults included, so a later change of a default cannot change an engine.
  if (n_params > 0) fields_.push_back({kActivationParams, params_, FieldType::kFloat32, n_params});
  fields_.push_back({kResidual, residual_.c_str(), FieldType::kChar, static_cast<int32_t>(residual_.size() + 1)});
  fields_.push_back({kAllowTf32, &allow_tf32_, FieldType::kInt32, 1});
  return Status::Ok();
}

int32_t tactic_id(const char* kernel_name) {
  // FNV-1a, folded to a positive int32; 0 is TensorRT's "default tactic" and never returned.
  uint32_t h = 2166136261u;
  for (const char* c = kernel_name; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 16777619u;
  const int32_t id = static_cast<int32_t>(h & 0x7fffffffu);
  return id == 0 ? 1 : id;
}

const KernelDescriptor* kernel_for_tactic(int32_t tactic) {
  for (const KernelDescriptor& k : kernel_registry()) {
    bool tensorrt = false;
    for (const std::string& t : k.targets) tensorrt = tensorrt || t == "tensorrt";
    if (tensorrt && tactic_id(k.name) == tactic) return &k;
  }
  return nullptr;
}

std::vector<const KernelDescriptor*> profile_kernels(const std::vector<ConvProblem>& corners, const DeviceInfo& device,
                                                     const std::function<bool(const char*)>& available,
                                                     std::string* why) {
  std::vector<const KernelDescriptor*> kept;
  if (corners.empty()) {
    *why = "no problems given for the profile";
    return kept;
  }
  std::vector<const KernelDescriptor*> first = find_kernels("tensorrt", corners[0], why, device);
  std::string dropped;
  for (const KernelDescriptor* k : first) {
    std::string reason;
    bool ok = !available || available(k->name);
    if (!ok) reason = "not compiled into this library";
    for (size_t i = 1; ok && i < corners.size(); ++i) {
      std::string r;
      ok = validate(corners[i]).ok() && k->can_implement(corners[i], &r);
      if (!ok) reason = "not for every shape of the profile (" + r + ")";
    }
    if (ok) {
      kept.push_back(k);
    } else {
      dropped += std::string(dropped.empty() ? "" : "; ") + k->name + ": " + reason;
    }
  }
  if (kept.empty() && !first.empty()) *why = "no kernel runs the whole profile: " + dropped;
  return kept;
}

std::string timing_cache_id(const ConvAttributes& a) {
  return "FusedConv/1:g" + std::to_string(a.group) + ":s" + join({a.stride_h, a.stride_w}, "x") + ":d" +
         join({a.dil_h, a.dil_w}, "x") + ":p" + join({a.pad_top, a.pad_left, a.pad_bottom, a.pad_right}, ",") +
         ":" + activation_name(a.activation.kind) + ":" + residual_name(a.residual) + (a.allow_tf32 ? ":tf32" : "");
}

}  // namespace epifuse
