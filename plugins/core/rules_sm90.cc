// Rules of the CUTLASS 3.x SM90 kernels (plugins/kernels/sm90/): exactly the problems their CUTLASS
// can_implement (and the TMA descriptor encoding in initialize(), which CUTLASS does not check in
// release builds) accept, in plain C++ so that the optimizer knows them without CUDA.
//
// Sources of each limit (CUTLASS 4.2):
//  - conv mainloop can_implement (conv/collective/sm90_implicit_gemm_gmma_ss_warpspecialized.hpp):
//    channel-major tensors with 16-byte rows (C % 8 for 16-bit types, C % 4 for fp32), padding in [0, 256] per side,
//    TMA im2col corners in [-128, 127] for 2-D (lower = -pad_begin, upper = pad_end - (R-1)*dil),
//    filter offsets (R-1)*dil in [0, 254], cross-correlation, groups == 1, M = N*P*Q <= INT32_MAX.
//  - epilogue can_implement: D and C (residual) rows 16-byte aligned: K % 8 (fp32: K % 4).
//  - cuTensorMapEncodeIm2col: element (traversal) strides in [1, 8]; global strides < 2^40 bytes.
//  - ConvProblemShape holds extents in int32; the grid's y dimension counts K tiles (<= 65535).
//  - GEMM (1x1) kernels: GemmUniversal's int problem shape (M = N*H*W, N = K, K = C), A/B rows of
//    C elements and C/D rows of K elements 16-byte aligned (C % 8, K % 8; fp32 C % 4, K % 4).
//  - TF32 (float operands, sm90_gmma_builder.inl maps them to tfloat32_t WGMMA): K-major A and B,
//    which NHWC activations and KRSC filters are; computes below fp32 accuracy, so only for nodes
//    with allow_tf32.
// sm_90a code runs only on sm_90 (H100/H200), so min_sm = max_sm = 90.
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "heuristics.h"
#include "registry.h"

namespace epifuse {
namespace {

constexpr int kSm = 90;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kTmaStrideLimit = int64_t(1) << 40;  // bytes

int64_t element_bytes(DType dtype) { return dtype == DType::kFloat ? 4 : 2; }

// What every SM90 kernel needs: its dtype (float only as TF32, for nodes that allow it), group 1,
// 16-byte aligned C and K rows, int32 extents.
bool common_can_implement(const ConvProblem& p, DType dtype, std::string* why) {
  if (p.dtype != dtype)
    return reject(why, std::string("dtype ") + dtype_name(p.dtype) + " (kernel is " + dtype_name(dtype) + ")");
  if (dtype == DType::kFloat && !p.attr.allow_tf32)
    return reject(why, "allow_tf32 is 0 (this kernel computes in TF32)");
  if (p.attr.group != 1) return reject(why, "group " + std::to_string(p.attr.group) + " (needs 1)");
  if (!known(p.C) || !known(p.K) || !known(p.R) || !known(p.S)) return reject(why, "C, K, R and S must be known");
  const int64_t row = 16 / element_bytes(dtype);  // elements per 16 bytes
  if (p.C % row != 0)
    return reject(why, "C = " + std::to_string(p.C) + " not a multiple of " + std::to_string(row) +
                           " (TMA needs 16-byte rows)");
  if (p.K % row != 0)
    return reject(why, "K = " + std::to_string(p.K) + " not a multiple of " + std::to_string(row) +
                           " (TMA store needs 16-byte rows)");
  for (int64_t v : {p.N, p.H, p.W, p.C, p.K, p.R, p.S})
    if (v > kInt32Max) return reject(why, "an extent exceeds INT32_MAX");
  return true;
}

bool gemm1x1_can_implement(const ConvProblem& p, DType dtype, std::string* why) {
  if (!common_can_implement(p, dtype, why)) return false;
  const ConvAttributes& a = p.attr;
  if (p.R != 1 || p.S != 1) return reject(why, "not a 1x1 filter");
  if (a.stride_h != 1 || a.stride_w != 1) return reject(why, "stride != 1");
  if (a.pad_top || a.pad_left || a.pad_bottom || a.pad_right) return reject(why, "padding != 0");
  if (known(p.N) && known(p.H) && known(p.W) && saturating_product({p.N, p.H, p.W}) > kInt32Max)
    return reject(why, "N*H*W exceeds INT32_MAX (GEMM M is int)");
  return true;
}

template <int kTileN>
bool conv_can_implement(const ConvProblem& p, DType dtype, std::string* why) {
  if (!common_can_implement(p, dtype, why)) return false;
  const ConvAttributes& a = p.attr;
  if (a.stride_h > 8 || a.stride_w > 8) return reject(why, "stride > 8 (TMA im2col element strides are 1..8)");
  for (int64_t pad : {a.pad_top, a.pad_left, a.pad_bottom, a.pad_right})
    if (pad < 0 || pad > 256) return reject(why, "padding outside [0, 256] (TMA im2col)");
  if (a.dil_h > kInt32Max || a.dil_w > kInt32Max) return reject(why, "dilation exceeds INT32_MAX");
  if ((known(p.H) && p.H + a.pad_top + a.pad_bottom > kInt32Max) ||
      (known(p.W) && p.W + a.pad_left + a.pad_right > kInt32Max))
    return reject(why, "padded input extent exceeds INT32_MAX");
  // Lower corner = -pad_begin, upper corner = pad_end - (R-1)*dil, each in [-128, 127].
  if (a.pad_top > 128 || a.pad_left > 128) return reject(why, "top/left padding > 128 (TMA im2col lower corner)");
  struct Axis {
    int64_t extent, dil, pad_end;
    const char* name;
  };
  for (const Axis& ax : {Axis{p.R, a.dil_h, a.pad_bottom, "R"}, Axis{p.S, a.dil_w, a.pad_right, "S"}}) {
    const int64_t span = (ax.extent - 1) * ax.dil;
    if (span > 254)
      return reject(why, std::string("(") + ax.name + "-1)*dilation = " + std::to_string(span) +
                           " > 254 (TMA im2col filter offsets)");
    const int64_t upper = ax.pad_end - span;
    if (upper < -128 || upper > 127)
      return reject(why, std::string("TMA im2col upper corner (pad_end - (") + ax.name + "-1)*dilation = " +
                           std::to_string(upper) + ") outside [-128, 127]");
  }
  const int64_t P = p.P(), Q = p.Q();
  if (known(p.N) && known(P) && known(Q) && saturating_product({p.N, P, Q}) > kInt32Max)
    return reject(why, "N*P*Q exceeds INT32_MAX");
  const int64_t bytes = element_bytes(dtype);
  if (known(p.H) && known(p.W) && known(p.C) && saturating_product({p.H, p.W, p.C, bytes}) >= kTmaStrideLimit)
    return reject(why, "H*W*C too large for a TMA stride");
  if (known(P) && known(Q) && known(p.K) && saturating_product({P, Q, p.K, bytes}) >= kTmaStrideLimit)
    return reject(why, "P*Q*K too large for a TMA stride");
  if (saturating_product({p.R, p.S, p.C, bytes}) >= kTmaStrideLimit)
    return reject(why, "R*S*C too large for a TMA stride");
  if ((p.K + kTileN - 1) / kTileN > 65535) return reject(why, "K too large (grid y > 65535)");
  return true;
}

// The _relu and _silu kernels' epilogues carry Identity and one activation (sm90_common.cuh: ActivationSet).
bool identity_or(const ConvProblem& p, ActivationKind act, std::string* why) {
  const ActivationKind k = p.attr.activation.kind;
  if (k == ActivationKind::kIdentity || k == act) return true;
  return reject(why, std::string("activation ") + activation_table()[static_cast<size_t>(k)].name +
                         " not in the epilogue (identity, " + activation_table()[static_cast<size_t>(act)].name + ")");
}

// A kernels.def entry's rule: its epilogue's activations (acts: all, or identity and one), residual
// input and N tile (a conv's grid counts K tiles), then the family's limits.
template <DType kDType, bool kAnyActivation, ActivationKind kAct, bool kResidual>
bool gemm_rule(const ConvProblem& p, std::string* why) {
  if (!kResidual && p.attr.residual != Residual::kNone)
    return reject(why, "residual in a kernel whose epilogue has no residual input");
  return (kAnyActivation || identity_or(p, kAct, why)) && gemm1x1_can_implement(p, kDType, why);
}
template <DType kDType, int kTileN, bool kAnyActivation, ActivationKind kAct>
bool conv_rule(const ConvProblem& p, std::string* why) {
  return (kAnyActivation || identity_or(p, kAct, why)) && conv_can_implement<kTileN>(p, kDType, why);
}

}  // namespace

// Best first (H200, fp16 anchors, CUDA-graph timing): the persistent 1x1 GEMMs for the problems they
// take (cooperative beat ping-pong on every 1x1 anchor; the _relu / _silu kernels, whose epilogues
// carry Identity and one activation, beat the all-activation ones by 5-30%, and their 256x128 tile wins
// where it fills a wave; stream-K and 128x64 ping-pong win some batch-1 / K = 64 layers under
// tuning), then the implicit-GEMM convs: the persistent ping-pong ones
// (conv_pingpong_kernel.hpp: 128x64, 128x128 wins some K >= 256 layers, 128x32 for C, K <= 32), then
// CUTLASS's non-persistent kernel as 128x64 with two CTAs per SM, one CTA (wins some batch-1 layers
// by a few %), 128x128, and 128x32. Tuning picks per problem; without it the shape rules of
// heuristics.cc (kernels.def's `prefer` column) reorder them by problem size and the device's SM count.
// The list itself is kernels.def, whose order this keeps.

// kernels.def's columns as rule parameters.
#define EPIFUSE_SM90_ACTS_ANY true, ActivationKind::kIdentity
#define EPIFUSE_SM90_ACTS_RELU false, ActivationKind::kRelu
#define EPIFUSE_SM90_ACTS_SILU false, ActivationKind::kSilu
#define EPIFUSE_SM90_RESIDUAL_RESIDUAL true
#define EPIFUSE_SM90_RESIDUAL_NO_RESIDUAL false

std::vector<KernelDescriptor> sm90_kernel_rules() {
  std::vector<KernelDescriptor> rules;
// A line's kernels, one per dtype: the 16-bit twins (whichever the build compiled: the manifest test
// compares the build with these) or tf32; RULE is the line's rule template, ARGS its columns after the
// dtype.
#define EPIFUSE_SM90_RULES_F16_BF16(name, RULE, ARGS, prefer)                                       \
  rules.push_back({"sm90_f16_" #name, cuda_targets(), RULE<DType::kFloat16, ARGS>, kSm, kSm, prefer}); \
  rules.push_back({"sm90_bf16_" #name, cuda_targets(), RULE<DType::kBFloat16, ARGS>, kSm, kSm, prefer});
#define EPIFUSE_SM90_RULES_F32_TF32(name, RULE, ARGS, prefer) \
  rules.push_back({"sm90_tf32_" #name, cuda_targets(), RULE<DType::kFloat, ARGS>, kSm, kSm, prefer});
#define EPIFUSE_SM90_ARGS(...) __VA_ARGS__
#define SM90_GEMM(name, tu, dtypes, tile_m, tile_n, tile_k, schedule, scheduler, acts, residual, epi, store_stages, \
                  rows, prefer)                                                                                 \
  EPIFUSE_SM90_RULES_##dtypes(name, gemm_rule,                                                                  \
                              EPIFUSE_SM90_ARGS(EPIFUSE_SM90_ACTS_##acts, EPIFUSE_SM90_RESIDUAL_##residual), prefer)
#define SM90_CONV(name, tu, dtypes, tile_m, tile_n, tile_k, cluster_m, schedule, acts, prefer) \
  EPIFUSE_SM90_RULES_##dtypes(name, conv_rule, EPIFUSE_SM90_ARGS(tile_n, EPIFUSE_SM90_ACTS_##acts), prefer)
#include "../kernels/sm90/kernels.def"
#undef SM90_GEMM
#undef SM90_CONV
#undef EPIFUSE_SM90_ARGS
#undef EPIFUSE_SM90_RULES_F16_BF16
#undef EPIFUSE_SM90_RULES_F32_TF32
  return rules;
}

}  // namespace epifuse
