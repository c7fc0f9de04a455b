// The FusedConv problem as the op contract defines it (shared/docs/fusedconv-op.md, v1):
// attributes, their parsing and validation, and the shape rule. Shared by every adapter so that
// all of them accept and reject exactly the same nodes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "status.h"

namespace epifuse {

enum class DType : int32_t { kFloat = 1, kFloat16 = 10, kBFloat16 = 16 };  // ONNX element types
enum class Residual : int32_t { kNone = 0, kPre = 1, kPost = 2 };

enum class ActivationKind {
  kIdentity, kRelu, kLeakyRelu, kClip, kSigmoid, kTanh, kSilu,
  kHardSigmoid, kHardSwish, kGelu, kGeluTanh, kMish, kElu, kSoftplus,
};

struct ActivationSpec {
  ActivationKind kind;
  const char* name;
  int n_params;
  float defaults[2];
};

// The contract's activation table, in its order.
const std::vector<ActivationSpec>& activation_table();

struct Activation {
  ActivationKind kind = ActivationKind::kIdentity;
  float params[2] = {0.f, 0.f};
};

struct ConvAttributes {
  int64_t stride_h = 1, stride_w = 1;
  int64_t dil_h = 1, dil_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t group = 1;
  Activation activation;
  Residual residual = Residual::kNone;
  // float only: the CUDA kernels may compute in TF32 on the tensor cores (10-bit mantissa operands,
  // fp32 accumulation), as cuDNN, ONNX Runtime and PyTorch do by default; off, they keep fp32-level
  // accuracy (3xTF32 or FFMA). The CPU kernels compute in fp32 either way.
  bool allow_tf32 = false;
};

// Node attributes as read from a graph; an absent attribute takes the contract default.
struct RawAttributes {
  std::optional<std::vector<int64_t>> strides, pads, dilations;
  std::optional<int64_t> group;
  std::optional<std::string> activation, residual;
  std::optional<std::vector<float>> activation_params;
  std::optional<int64_t> allow_tf32;
};

// Dimensions use -1 for "unknown" (symbolic N/H/W, or shapes not known at load time); checks
// that need an unknown dimension are skipped.
struct ConvProblem {
  DType dtype = DType::kFloat;
  int64_t N = -1, H = -1, W = -1, C = -1;
  int64_t K = -1, R = -1, S = -1;
  ConvAttributes attr;

  int64_t P() const;
  int64_t Q() const;
};

using Dims = std::vector<int64_t>;

// "[1, 3, 224, 224]": a shape or a list of attribute values in an error message.
std::string dims_text(const Dims& v);

const char* dtype_name(DType t);
const char* residual_name(Residual r);

// Activation from its contract name; empty `params` means the contract defaults.
Status parse_activation(const std::string& name, const float* params, int64_t n_params,
                        Activation* out);
Status parse_residual(const std::string& name, Residual* out);
Status parse_dtype(int32_t onnx_type, DType* out);
Status parse_attributes(const RawAttributes& raw, ConvAttributes* out);

Status validate_attributes(const ConvAttributes& a);
// Residual mode must be `none` exactly when the optional input Z is absent.
Status check_residual_input(Residual r, bool has_z);
Status validate(const ConvProblem& p);

// The contract's shape rule; -1 when `in` is unknown, and possibly < 1 for a bad problem.
int64_t output_size(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t dilation,
                    int64_t kernel, int64_t stride);

// Builds the problem from tensor shapes (X [N,H,W,C], W [K,R,S,C/group], B [K], Z [N,P,Q,K])
// and checks them against the contract. `b`/`z` may be null when their shapes are not known;
// `has_z` says whether input Z exists at all.
Status bind_shapes(const ConvAttributes& a, DType dtype, const Dims& x, const Dims& w,
                   const Dims* b, bool has_z, const Dims* z, ConvProblem* out);

}  // namespace epifuse
