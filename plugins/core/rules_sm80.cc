// Rules of the CUTLASS 2.x sm80 kernels (plugins/kernels/sm80/): implicit-GEMM fprop with
// cp.async/ld.global + mma.sync, built for sm_80 and newer (they also run on sm_90 and later when
// compiled for them). Each rule accepts a subset of what that configuration's
// cutlass::conv::device::ImplicitGemmConvolution::can_implement accepts, and where a CUTLASS
// constraint is not enough for correct int32 address arithmetic, the rule is stricter:
//   - dtype float16 / bfloat16 (fp32 accumulation), or float through 3xTF32 or (allow_tf32) TF32;
//     group == 1 except for the grouped kernels;
//   - channel alignment: C % AlignAB (the iterators' access width) and K % AlignC (the epilogue's);
//   - kOptimized activation iterator: R <= 32 and S <= 32 (mask bits);
//   - X, W and Y each under 2 GiB (CUTLASS uses int32 offsets), grid.y = ceil(K / tile N) <= 65535;
//   - every size CUTLASS stores as int (H, W, pads, strides, dilations, H + pads, W + pads) < 2^31.
// The configurations partition the problems of a 16-bit dtype: aligned channels go to the three
// TensorOp tiles, C < 8 with K % 8 == 0 to the few-channel stem kernel, the rest to the
// unaligned kernel. Within the aligned group the order is the heuristic's preference. fp32 has TF32
// kernels for nodes with allow_tf32 and one 3xTF32 kernel (fp32-level accuracy), all for C % 4 == 0
// and K % 4 == 0; other fp32 problems go to cuda_direct. Grouped problems (1 < group < C) go to the
// grouped kernels where their channels per group fit (below), else to cuda_direct.
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "registry.h"

namespace epifuse {
namespace {

constexpr int kMinSm = 80, kMaxSm = 1209;
constexpr int64_t kTwoGiB = int64_t(1) << 31;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// kSplitK: an aligned tile in parallel split-K mode (fp32 partial sums, then a reducing epilogue);
// kGrouped: CUTLASS's group-mode mainloop (group_conv.cuh).
enum class Kind { kFixed8, kAligned, kSplitK, kFewChannels, kUnaligned, kGrouped };

struct Config {
  const char* name;
  DType dtype;
  Kind kind;
  int tile_n;  // threadblock N (output channels per CTA): grid.y = ceil(K / tile_n)
  int align;   // kAligned: the channel alignment of C and K (128-bit accesses)
  bool tf32;   // computes float in TF32: only for nodes with allow_tf32
};

// kernels.def's lines, in its order: a 16-bit line as its f16 and bf16 twins (128-bit accesses: 8
// elements), an fp32 line as itself (4 elements).
#define EPIFUSE_SM80_KIND_ALIGNED Kind::kAligned
#define EPIFUSE_SM80_KIND_FIXED8 Kind::kFixed8
#define EPIFUSE_SM80_KIND_FEWCH Kind::kFewChannels
#define EPIFUSE_SM80_KIND_UNALIGNED Kind::kUnaligned
#define EPIFUSE_SM80_KIND_SPLITK Kind::kSplitK
#define EPIFUSE_SM80_KIND_GROUPED Kind::kGrouped
#define EPIFUSE_SM80_CONFIGS_F16_BF16(name, kind, tile_n) \
  {"sm80_f16_" #name, DType::kFloat16, kind, tile_n, 8, false},                \
  {"sm80_bf16_" #name, DType::kBFloat16, kind, tile_n, 8, false},
#define EPIFUSE_SM80_CONFIGS_F32_3XTF32(name, kind, tile_n) {"sm80_f32_" #name, DType::kFloat, kind, tile_n, 4, false},
#define EPIFUSE_SM80_CONFIGS_F32_TF32(name, kind, tile_n) {"sm80_tf32_" #name, DType::kFloat, kind, tile_n, 4, true},
#define SM80_CONV(name, kind, dtypes, tile_m, tile_n, tile_k, warp_m, warp_n, warp_k, stages) \
  EPIFUSE_SM80_CONFIGS_##dtypes(name, EPIFUSE_SM80_KIND_##kind, tile_n)
constexpr Config kConfigs[] = {
#include "../kernels/sm80/kernels.def"
};
#undef SM80_CONV
constexpr int kAlign = 8;  // 128-bit accesses of 16-bit elements

// The grouped kernels (GroupedConv in group_conv.cuh): X and W in 64-bit accesses (4 elements: the
// analytic iterators' can_implement, conv2d_fprop_{activation,filter}_tile_access_iterator_analytic.h,
// needs C / group % 4 == 0), Y, Z and B in min(8, tile N / 4) (its kAlignC; device can_implement:
// K % the epilogue's access width).
constexpr int kGroupedAlignAB = 4;
int grouped_align_c(const Config& cfg) { return cfg.tile_n / 4 < kAlign ? cfg.tile_n / 4 : kAlign; }

bool aligned_ok(const ConvProblem& p) { return p.C % kAlign == 0 && p.K % kAlign == 0 && p.R <= 32 && p.S <= 32; }
bool few_channels_ok(const ConvProblem& p) { return p.C < kAlign && p.K % kAlign == 0; }


bool can_implement(const Config& cfg, const ConvProblem& p, std::string* why) {
  if (p.dtype != cfg.dtype)
    return reject(why, std::string("dtype ") + dtype_name(p.dtype) + " (this kernel is " + dtype_name(cfg.dtype) + ")");
  if (cfg.tf32 && !p.attr.allow_tf32) return reject(why, "allow_tf32 is 0 (this kernel computes in TF32)");
  if (p.attr.group != 1 && cfg.kind != Kind::kGrouped)
    return reject(why, "group " + std::to_string(p.attr.group) + " (only group 1)");
  if (p.C < 0 || p.K < 0 || p.R < 0 || p.S < 0) return reject(why, "C, K, R and S must be known");
  const int64_t group = p.attr.group;

  switch (cfg.kind) {
    case Kind::kFixed8:  // CUTLASS kFixedChannels: one access holds every channel of a pixel
      if (p.C != kAlign || p.K % kAlign != 0)
        return reject(why, "C = " + std::to_string(p.C) + ", K = " + std::to_string(p.K) +
                             " (fixed-channel kernel: C == 8, K a multiple of 8)");
      if (p.R > 32 || p.S > 32) return reject(why, "filter larger than 32x32");
      break;
    case Kind::kAligned:
    case Kind::kSplitK:
      if (p.C % cfg.align != 0 || p.K % cfg.align != 0)
        return reject(why, "C = " + std::to_string(p.C) + ", K = " + std::to_string(p.K) + " (both must be multiples of " +
                             std::to_string(cfg.align) + " for 128-bit accesses)");
      if (p.R > 32 || p.S > 32)
        return reject(why, "filter " + std::to_string(p.R) + "x" + std::to_string(p.S) +
                             " (the optimized iterator takes R, S <= 32)");
      break;
    case Kind::kFewChannels:
      if (p.C >= kAlign) return reject(why, "C = " + std::to_string(p.C) + " (few-channel kernel: C < 8)");
      if (p.K % kAlign != 0)
        return reject(why, "K = " + std::to_string(p.K) + " (few-channel kernel: K must be a multiple of 8)");
      break;
    case Kind::kUnaligned:
      if (aligned_ok(p)) return reject(why, "channels aligned: the TensorOp tile kernels run this");
      if (few_channels_ok(p)) return reject(why, "C < 8 and K % 8 == 0: the few-channel kernel runs this");
      break;
    case Kind::kGrouped: {
      // CUTLASS's device can_implement with groups (device/implicit_gemm_convolution.h, "check group
      // conv constraint"): C and K multiples of group (validate() checks it), no split-K (never used),
      // and kMultipleGroup: tile N % (K / group) == 0, or kSingleGroup: (K / group) % tile N == 0
      // (GroupedConv::Check takes whichever mode the problem is in).
      if (group == 1) return reject(why, "group 1 (the grouped kernels take 1 < group < C)");
      if (group >= p.C) return reject(why, "depthwise (group == C): the depthwise kernels run this");
      const int64_t c_per_group = p.C / group, k_per_group = p.K / group;
      if (c_per_group % kGroupedAlignAB != 0)
        return reject(why, "C / group = " + std::to_string(c_per_group) + " (must be a multiple of " +
                             std::to_string(kGroupedAlignAB) + " for 64-bit accesses)");
      if (cfg.tile_n % k_per_group != 0 && k_per_group % cfg.tile_n != 0)
        return reject(why, "K / group = " + std::to_string(k_per_group) +
                             " (must divide or be a multiple of tile N = " + std::to_string(cfg.tile_n) + ")");
      if (p.K % grouped_align_c(cfg) != 0)
        return reject(why, "K = " + std::to_string(p.K) + " (must be a multiple of " +
                             std::to_string(grouped_align_c(cfg)) + ", the epilogue's access width)");
      break;
    }
  }

  // Attributes CUTLASS keeps in int (Conv2dProblemSize) and the int32 index arithmetic
  // p*stride - pad + r*dilation, bounded by H + pad_top + pad_bottom.
  const ConvAttributes& a = p.attr;
  for (int64_t v : {a.stride_h, a.stride_w, a.dil_h, a.dil_w, a.pad_top, a.pad_left, a.pad_bottom, a.pad_right,
                    p.C, p.K, p.R, p.S})
    if (v > kInt32Max) return reject(why, "an attribute or extent does not fit int32");
  if (p.H >= 0 && p.H + a.pad_top + a.pad_bottom > kInt32Max) return reject(why, "H + pads does not fit int32");
  if (p.W >= 0 && p.W + a.pad_left + a.pad_right > kInt32Max) return reject(why, "W + pads does not fit int32");

  // CUTLASS can_implement: each tensor under 2 GiB (int32 offsets), grid.y <= 65535.
  const int64_t kBytes = p.dtype == DType::kFloat ? 4 : 2;
  if (saturating_product({p.K, p.R, p.S, p.C / group, kBytes}) >= kTwoGiB)
    return reject(why, "filter tensor of 2 GiB or more");
  if (p.N >= 0 && p.H >= 0 && p.W >= 0) {
    if (saturating_product({p.N, p.H, p.W, p.C, kBytes}) >= kTwoGiB) return reject(why, "input tensor of 2 GiB or more");
    if (saturating_product({p.N, p.P(), p.Q(), p.K, kBytes}) >= kTwoGiB) return reject(why, "output tensor of 2 GiB or more");
  }
  if ((p.K + cfg.tile_n - 1) / cfg.tile_n > 65535) return reject(why, "K too large for the grid (grid.y > 65535)");
  if (cfg.kind == Kind::kSplitK && p.N >= 0 && p.H >= 0 && p.W >= 0 &&
      saturating_product({p.N, p.P(), p.Q(), p.K, int64_t(sizeof(float))}) >= kTwoGiB)
    return reject(why, "fp32 partial sums of the output would be 2 GiB or more");
  return true;
}

template <int I>
bool rule(const ConvProblem& p, std::string* why) {
  return can_implement(kConfigs[I], p, why);
}

template <int... I>
std::vector<KernelDescriptor> descriptors(std::integer_sequence<int, I...>) {
  return {KernelDescriptor{kConfigs[I].name, cuda_targets(), rule<I>, kMinSm, kMaxSm}...};
}

}  // namespace

std::vector<KernelDescriptor> sm80_kernel_rules() {
  return descriptors(std::make_integer_sequence<int, int(sizeof(kConfigs) / sizeof(kConfigs[0]))>{});
}

}  // namespace epifuse
