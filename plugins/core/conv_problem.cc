#include "conv_problem.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace epifuse {
std::string dims_text(const Dims& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

namespace {

Status check_length(const char* name, const std::vector<int64_t>& v, size_t n) {
  if (v.size() == n) return Status::Ok();
  return Status::Error(std::string("attribute '") + name + "' needs " + std::to_string(n) +
                       " values, got " + dims_text(v));
}

}  // namespace

const std::vector<ActivationSpec>& activation_table() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  static const std::vector<ActivationSpec> table = {
      {ActivationKind::kIdentity, "identity", 0, {0.f, 0.f}},
      {ActivationKind::kRelu, "relu", 0, {0.f, 0.f}},
      {ActivationKind::kLeakyRelu, "leaky_relu", 1, {0.01f, 0.f}},
      {ActivationKind::kClip, "clip", 2, {-inf, inf}},
      {ActivationKind::kSigmoid, "sigmoid", 0, {0.f, 0.f}},
      {ActivationKind::kTanh, "tanh", 0, {0.f, 0.f}},
      {ActivationKind::kSilu, "silu", 0, {0.f, 0.f}},
      {ActivationKind::kHardSigmoid, "hardsigmoid", 2, {0.2f, 0.5f}},
      {ActivationKind::kHardSwish, "hardswish", 0, {0.f, 0.f}},
      {ActivationKind::kGelu, "gelu", 0, {0.f, 0.f}},
      {ActivationKind::kGeluTanh, "gelu_tanh", 0, {0.f, 0.f}},
      {ActivationKind::kMish, "mish", 0, {0.f, 0.f}},
      {ActivationKind::kElu, "elu", 1, {1.f, 0.f}},
      {ActivationKind::kSoftplus, "softplus", 0, {0.f, 0.f}},
  };
  return table;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

const char* residual_name(Residual r) {
  switch (r) {
    case Residual::kNone: return "none";
    case Residual::kPre: return "pre";
    case Residual::kPost: return "post";
  }
  return "unknown";
}

int64_t ConvProblem::P() const {
  return output_size(H, attr.pad_top, attr.pad_bottom, attr.dil_h, R, attr.stride_h);
}
int64_t ConvProblem::Q() const {
  return output_size(W, attr.pad_left, attr.pad_right, attr.dil_w, S, attr.stride_w);
}

int64_t output_size(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t dilation,
                    int64_t kernel, int64_t stride) {
  if (in < 0 || kernel < 0 || stride < 1) return -1;
  const int64_t span = in + pad_begin + pad_end - dilation * (kernel - 1) - 1;
  // Floor division: a negative span means the filter does not fit even once.
  return (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
}

Status parse_activation(const std::string& name, const float* params, int64_t n_params,
                        Activation* out) {
  for (const ActivationSpec& spec : activation_table()) {
    if (name != spec.name) continue;
    if (n_params != 0 && n_params != spec.n_params) {
      return Status::Error("activation '" + name + "' takes " + std::to_string(spec.n_params) +
                           " activation_params, got " + std::to_string(n_params));
    }
    out->kind = spec.kind;
    for (int i = 0; i < 2; ++i) out->params[i] = spec.defaults[i];
    for (int64_t i = 0; i < n_params; ++i) out->params[i] = params[i];
    return Status::Ok();
  }
  std::string known;
  for (const ActivationSpec& spec : activation_table()) known += std::string(known.empty() ? "" : ", ") + spec.name;
  return Status::Error("unknown activation '" + name + "' (expected one of: " + known + ")");
}

Status parse_residual(const std::string& name, Residual* out) {
  for (Residual r : {Residual::kNone, Residual::kPre, Residual::kPost}) {
    if (name == residual_name(r)) {
      *out = r;
      return Status::Ok();
    }
  }
  return Status::Error("unknown residual '" + name + "' (expected none, pre or post)");
}

Status parse_dtype(int32_t onnx_type, DType* out) {
  for (DType t : {DType::kFloat, DType::kFloat16, DType::kBFloat16}) {
    if (onnx_type == static_cast<int32_t>(t)) {
      *out = t;
      return Status::Ok();
    }
  }
  return Status::Error("unsupported dtype " + std::to_string(onnx_type) +
                       " (expected float 1, float16 10 or bfloat16 16)");
}

Status parse_attributes(const RawAttributes& raw, ConvAttributes* out) {
  ConvAttributes a;
  if (raw.strides) {
    EPIFUSE_RETURN_IF_ERROR(check_length("strides", *raw.strides, 2));
    a.stride_h = (*raw.strides)[0];
    a.stride_w = (*raw.strides)[1];
  }
  if (raw.dilations) {
    EPIFUSE_RETURN_IF_ERROR(check_length("dilations", *raw.dilations, 2));
    a.dil_h = (*raw.dilations)[0];
    a.dil_w = (*raw.dilations)[1];
  }
  if (raw.pads) {
    EPIFUSE_RETURN_IF_ERROR(check_length("pads", *raw.pads, 4));
    a.pad_top = (*raw.pads)[0];
    a.pad_left = (*raw.pads)[1];
    a.pad_bottom = (*raw.pads)[2];
    a.pad_right = (*raw.pads)[3];
  }
  if (raw.group) a.group = *raw.group;
  const std::vector<float> no_params;
  const std::vector<float>& params = raw.activation_params ? *raw.activation_params : no_params;
  EPIFUSE_RETURN_IF_ERROR(parse_activation(raw.activation.value_or("identity"), params.data(),
                                           static_cast<int64_t>(params.size()), &a.activation));
  if (raw.residual) EPIFUSE_RETURN_IF_ERROR(parse_residual(*raw.residual, &a.residual));
  if (raw.allow_tf32) {
    if (*raw.allow_tf32 != 0 && *raw.allow_tf32 != 1)
      return Status::Error("allow_tf32 must be 0 or 1, got " + std::to_string(*raw.allow_tf32));
    a.allow_tf32 = *raw.allow_tf32 == 1;
  }
  EPIFUSE_RETURN_IF_ERROR(validate_attributes(a));
  *out = a;
  return Status::Ok();
}

// Attributes past int32 make no real conv and would overflow the output-size arithmetic
// (H + pads - dilation * (R - 1)): they are refused, not wrapped.
constexpr int64_t kMaxAttribute = std::numeric_limits<int32_t>::max();

Status validate_attributes(const ConvAttributes& a) {
  if (a.stride_h < 1 || a.stride_w < 1 || a.stride_h > kMaxAttribute || a.stride_w > kMaxAttribute)
    return Status::Error("strides must be in [1, 2^31 - 1], got " + dims_text({a.stride_h, a.stride_w}));
  if (a.dil_h < 1 || a.dil_w < 1 || a.dil_h > kMaxAttribute || a.dil_w > kMaxAttribute)
    return Status::Error("dilations must be in [1, 2^31 - 1], got " + dims_text({a.dil_h, a.dil_w}));
  for (int64_t pad : {a.pad_top, a.pad_left, a.pad_bottom, a.pad_right})
    if (pad < 0 || pad > kMaxAttribute)
      return Status::Error("pads must be in [0, 2^31 - 1], got " +
                           dims_text({a.pad_top, a.pad_left, a.pad_bottom, a.pad_right}));
  if (a.group < 1 || a.group > kMaxAttribute)
    return Status::Error("group must be in [1, 2^31 - 1], got " + std::to_string(a.group));
  return Status::Ok();
}

Status check_residual_input(Residual r, bool has_z) {
  if ((r != Residual::kNone) == has_z) return Status::Ok();
  if (has_z) return Status::Error("input Z is present but residual is 'none' (expected pre or post)");
  return Status::Error(std::string("residual '") + residual_name(r) + "' needs input Z, which is absent");
}

Status validate(const ConvProblem& p) {
  DType checked;
  EPIFUSE_RETURN_IF_ERROR(parse_dtype(static_cast<int32_t>(p.dtype), &checked));
  EPIFUSE_RETURN_IF_ERROR(validate_attributes(p.attr));
  const struct { const char* name; int64_t value; int64_t min; } dims[] = {
      {"N", p.N, 0}, {"H", p.H, 1}, {"W", p.W, 1}, {"C", p.C, 1},
      {"K", p.K, 1}, {"R", p.R, 1}, {"S", p.S, 1}};
  for (const auto& d : dims) {
    if (d.value != -1 && (d.value < d.min || d.value > kMaxAttribute))
      return Status::Error(std::string(d.name) + " must be in [" + std::to_string(d.min) +
                           ", 2^31 - 1] (or -1 when unknown), got " + std::to_string(d.value));
  }
  const int64_t g = p.attr.group;
  if (p.C != -1 && p.C % g != 0)
    return Status::Error("group " + std::to_string(g) + " does not divide C = " + std::to_string(p.C));
  if (p.K != -1 && p.K % g != 0)
    return Status::Error("group " + std::to_string(g) + " does not divide K = " + std::to_string(p.K));
  if (p.H != -1 && p.R != -1 && p.P() < 1)
    return Status::Error("output height would be " + std::to_string(p.P()) + " for H = " +
                         std::to_string(p.H) + ", R = " + std::to_string(p.R) + " (must be >= 1)");
  if (p.W != -1 && p.S != -1 && p.Q() < 1)
    return Status::Error("output width would be " + std::to_string(p.Q()) + " for W = " +
                         std::to_string(p.W) + ", S = " + std::to_string(p.S) + " (must be >= 1)");
  return Status::Ok();
}

Status bind_shapes(const ConvAttributes& a, DType dtype, const Dims& x, const Dims& w,
                   const Dims* b, bool has_z, const Dims* z, ConvProblem* out) {
  if (x.size() != 4) return Status::Error("input X must be 4-D [N, H, W, C], got shape " + dims_text(x));
  if (w.size() != 4) return Status::Error("input W must be 4-D [K, R, S, C/group], got shape " + dims_text(w));
  EPIFUSE_RETURN_IF_ERROR(check_residual_input(a.residual, has_z));
  ConvProblem p;
  p.dtype = dtype;
  p.attr = a;
  p.N = x[0], p.H = x[1], p.W = x[2], p.C = x[3];
  p.K = w[0], p.R = w[1], p.S = w[2];
  EPIFUSE_RETURN_IF_ERROR(validate(p));
  if (p.C != -1 && w[3] != -1 && w[3] * a.group != p.C)
    return Status::Error("W shape " + dims_text(w) + " does not match C = " + std::to_string(p.C) +
                         " with group " + std::to_string(a.group) + " (expected last dim C/group = " +
                         std::to_string(p.C / a.group) + ")");
  if (b && !(b->size() == 1 && ((*b)[0] == -1 || p.K == -1 || (*b)[0] == p.K)))
    return Status::Error("input B must have shape [K] = [" + std::to_string(p.K) + "], got " + dims_text(*b));
  if (z) {
    const Dims expect = {p.N, p.H == -1 || p.R == -1 ? -1 : p.P(), p.W == -1 || p.S == -1 ? -1 : p.Q(), p.K};
    bool match = z->size() == 4;
    for (size_t i = 0; match && i < 4; ++i) match = (*z)[i] == -1 || expect[i] == -1 || (*z)[i] == expect[i];
    if (!match) return Status::Error("input Z must have shape [N, P, Q, K] = " + dims_text(expect) + ", got " + dims_text(*z));
  }
  *out = p;
  return Status::Ok();
}

}  // namespace epifuse
