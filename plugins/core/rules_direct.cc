// Rules of the CUDA kernels written here without CUTLASS (plugins/kernels: direct_fused_conv.cu,
// depthwise_fused_conv.cu, gemv_fused_conv.cu, stem_fused_conv.cu).
#include <algorithm>
#include <cstdint>

#include "depthwise_geometry.h"
#include "registry.h"

namespace epifuse {
namespace {

constexpr int kMinSm = 80, kMaxSm = 1209;  // built for sm_80 and newer

bool float_dtype(const ConvProblem& p, std::string* why) {
  if (p.dtype == DType::kFloat || p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) return true;
  *why = std::string("no support for dtype ") + dtype_name(p.dtype);
  return false;
}

// Depthwise (group == C, K a multiple of C): each output channel reads one input channel, so the
// work is memory-bound and direct NHWC kernels with vector loads along C are the right shape. Five
// kernels (depthwise_fused_conv.cu), from the most reuse to none; the limits below are their launch
// geometry's (depthwise_geometry.h) and their 32-bit index math's. Dimensions not known yet (a
// symbolic batch) pass here and are checked with the concrete problem before each launch.
constexpr int64_t kMax32 = INT32_MAX;

bool depthwise_problem(const ConvProblem& p, std::string* why) {
  if (!float_dtype(p, why)) return false;
  if (p.C >= 0 && p.attr.group != p.C) return reject(why, "not depthwise (group != C)");
  return true;
}

int element_bytes(DType t) { return t == DType::kFloat ? 4 : 2; }

// The vector, strip and tile kernels, on a depthwise problem: one output channel per input channel, the
// channels of a pixel in whole vectors of `vec` elements.
bool one_channel_each(const ConvProblem& p, int vec, std::string* why) {
  if (p.K != p.C) return reject(why, "channel multiplier " + std::to_string(p.K / std::max<int64_t>(p.C, 1)) + " (needs 1)");
  if (p.C % vec != 0) return reject(why, "C = " + std::to_string(p.C) + " is not a multiple of " + std::to_string(vec));
  return true;
}

// The strip and tile kernels are instantiated for square 3x3, 5x5 and 7x7 filters.
bool square_357(const ConvProblem& p, std::string* why) {
  if (p.R != p.S || (p.R != 3 && p.R != 5 && p.R != 7))
    return reject(why, std::to_string(p.R) + "x" + std::to_string(p.S) + " filter (needs 3x3, 5x5 or 7x7)");
  return true;
}

}  // namespace

bool depthwise_scalar_can_implement(const ConvProblem& p, std::string* why) { return depthwise_problem(p, why); }

bool depthwise_vec_can_implement(const ConvProblem& p, std::string* why) {
  using namespace depthwise;
  if (!depthwise_problem(p, why) || !one_channel_each(p, vec_width(element_bytes(p.dtype)), why)) return false;
  const int64_t slice = vec_slice(p.C, element_bytes(p.dtype));
  if ((p.C + slice - 1) / slice > 65535) return reject(why, "C = " + std::to_string(p.C) + ": more than 65535 channel slices");
  const int64_t taps = saturating_product({p.R, p.S, slice});
  if (taps > kVecMaxTapFloats)
    return reject(why, "R*S*channels of a slice = " + std::to_string(taps) + " tap floats > " +
                           std::to_string(kVecMaxTapFloats) + " (shared memory)");
  return true;
}

bool depthwise_strip_can_implement(const ConvProblem& p, std::string* why) {
  using namespace depthwise;
  const ConvAttributes& a = p.attr;
  if (!depthwise_problem(p, why) || !square_357(p, why) || !one_channel_each(p, strip_vec(int(p.S)), why)) return false;
  if (a.dil_w != 1) return reject(why, "dilation along W " + std::to_string(a.dil_w) + " (needs 1)");
  if (a.stride_w != 1 && a.stride_w != 2) return reject(why, "stride along W " + std::to_string(a.stride_w) + " (needs 1 or 2)");
  if ((p.C / strip_vec(int(p.S)) + kStripThreads - 1) / kStripThreads > 65535)
    return reject(why, "C = " + std::to_string(p.C) + ": more than 65535 channel slices");
  if (!known(p.N) || !known(p.H) || !known(p.W)) return true;
  const int cols = strip_cols(int(a.stride_w), int(p.S), element_bytes(p.dtype));
  const int64_t strips = (p.Q() + cols - 1) / cols;
  // A window may start pad_left before a row and end past it; outputs are indexed within an image.
  const int64_t reach = saturating_product({p.H, p.W}) + p.Q() * a.stride_w + a.pad_left + strip_window(int(p.S), int(a.stride_w), cols);
  if (saturating_product({reach, p.C}) > kMax32 || saturating_product({p.P(), p.Q(), p.K}) > kMax32 ||
      saturating_product({2, p.N, p.P(), strips}) > kMax32)
    return reject(why, "an image or the (image, strip, row) items exceed 32-bit indexing");
  return true;
}

// One output pixel per image, from the whole map (a global pool as a depthwise conv; pool_as_conv makes
// them from pools of at most 64 pixels, which the tile and strip kernels run as fast).
bool depthwise_global_can_implement(const ConvProblem& p, std::string* why) {
  const ConvAttributes& a = p.attr;
  if (!depthwise_problem(p, why) || !one_channel_each(p, 2, why)) return false;
  if (a.pad_top || a.pad_left || a.pad_bottom || a.pad_right) return reject(why, "padded (needs no padding)");
  if (a.dil_h != 1 || a.dil_w != 1) return reject(why, "dilated (needs dilation 1)");
  if (!known(p.H) || !known(p.W)) return reject(why, "height or width unknown (the filter must cover the map)");
  if (p.R != p.H || p.S != p.W)
    return reject(why, std::to_string(p.R) + "x" + std::to_string(p.S) + " filter on a " + std::to_string(p.H) + "x" +
                           std::to_string(p.W) + " map (needs the whole map)");
  if ((p.C + depthwise::kGlobalChannels - 1) / depthwise::kGlobalChannels > 65535)
    return reject(why, "C = " + std::to_string(p.C) + ": more than 65535 channel slices");
  if (saturating_product({p.R, p.S}) > int64_t(65535) * depthwise::kGlobalSplitPixels)
    return reject(why, "a map of more than " + std::to_string(65535 * depthwise::kGlobalSplitPixels) +
                           " pixels (65535 ranges of " + std::to_string(depthwise::kGlobalSplitPixels) + ")");
  if (saturating_product({p.R, p.S}) > kMax32 || (known(p.N) && p.N > kMax32))
    return reject(why, "the map or the batch exceeds 32-bit indexing");
  return true;
}

bool depthwise_tile_can_implement(const ConvProblem& p, std::string* why) {
  using namespace depthwise;
  const ConvAttributes& a = p.attr;
  if (!depthwise_problem(p, why) || !square_357(p, why) || !one_channel_each(p, 16 / element_bytes(p.dtype), why))
    return false;
  if (a.stride_h != 1 || a.stride_w != 1) return reject(why, "strided (needs stride 1)");
  if (a.dil_h != 1 || a.dil_w != 1) return reject(why, "dilated (needs dilation 1)");
  if (tile_slices(p.C) > 65535) return reject(why, "C = " + std::to_string(p.C) + ": more than 65535 channel slices");
  if (!known(p.N) || !known(p.H) || !known(p.W)) return true;
  const int64_t small_tiles = saturating_product({p.N, (p.P() + TileSmall::TP - 1) / TileSmall::TP,
                                                  (p.Q() + TileSmall::QT - 1) / TileSmall::QT});  // tile_blocks, saturated
  if (saturating_product({p.H, p.W, p.C}) > kMax32 || small_tiles > kMax32)
    return reject(why, "an image or the tile grid exceeds 32-bit indexing");
  return true;
}

namespace {

// A 1x1 conv over at most kGemvMaxPixels output pixels (N*H*W; an unknown N is allowed when H*W fits,
// and the concrete problem is checked again at launch), stride 1, no padding, group 1: the
// warp-per-output-channel kernel of gemv_fused_conv.cu. Past a few dozen rows the tensor-core GEMMs win,
// and so they do sooner where C and K are large: each warp (one output channel) reads all of its rows of
// X, so X crosses the cache M*C*K/4 bytes' worth (H200, batch-32 classifiers: 2048 -> 1000 channels 30.0
// µs against 7.7 on a tensor-core tile, 1280 -> 1000 21.2 vs 5.9; at batch 1 GEMV leads). A bound on
// the multiply-adds between those (65M, 41M) and the squeeze-excite convs at batch 32 (at most 7.4M).
constexpr int64_t kGemvMaxPixels = 32, kGemvMaxMacs = int64_t(1) << 24;

bool gemv_can_implement(const ConvProblem& p, std::string* why) {
  if (!float_dtype(p, why)) return false;
  const ConvAttributes& a = p.attr;
  if (a.group != 1) return reject(why, "group " + std::to_string(a.group) + " (needs 1)");
  if (p.R != 1 || p.S != 1) return reject(why, "not a 1x1 filter");
  if (a.stride_h != 1 || a.stride_w != 1) return reject(why, "stride is not 1");
  if (a.pad_top || a.pad_left || a.pad_bottom || a.pad_right) return reject(why, "padded");
  if (p.H < 0 || p.W < 0) return reject(why, "H and W must be known");
  const int64_t pixels = saturating_product({std::max<int64_t>(p.N, 1), p.H, p.W});
  if (pixels > kGemvMaxPixels)
    return reject(why, std::to_string(pixels) + " pixels (N*H*W) > " + std::to_string(kGemvMaxPixels));
  if (known(p.C) && known(p.K) && saturating_product({pixels, p.C, p.K}) > kGemvMaxMacs)
    return reject(why, "N*H*W*C*K = " + std::to_string(saturating_product({pixels, p.C, p.K})) + " multiply-adds > " +
                           std::to_string(kGemvMaxMacs) + " (each warp rereads X: the GEMM tiles win)");
  return true;
}

// The stem kernel: fp16/bf16 on mma.sync, group 1, C <= 4 (RGB, RGBA, grayscale; padded to 4 in
// shared memory), at most 64 filter taps (its filter block, [64][64 x 4 + 8] elements, stays in shared
// memory for the whole block) and a patch of at most 32768 elements (64 KB). H, W and N may be unknown:
// the patch depends only on the filter, strides and dilations; the launch checks the concrete extents.
constexpr int64_t kStemMaxTaps = 64, kStemMaxPatch = 32768;

// Elements of the patch one output tile reads ((tile - 1) * stride + (R - 1) * dilation + 1 per axis,
// times kStemChannels), saturated; -1 when R or S is unknown.
int64_t stem_patch_elements(const ConvProblem& p) {
  if (p.R < 0 || p.S < 0) return -1;
  const ConvAttributes& a = p.attr;
  auto extent = [](int64_t tile, int64_t stride, int64_t dilation, int64_t taps) {
    const int64_t span = saturating_product({tile - 1, stride}), reach = saturating_product({taps - 1, dilation});
    return span > INT64_MAX / 2 || reach > INT64_MAX / 2 ? INT64_MAX : span + reach + 1;
  };
  return saturating_product({extent(kStemTileRows, a.stride_h, a.dil_h, std::max<int64_t>(p.R, 1)),
                             extent(kStemTileCols, a.stride_w, a.dil_w, std::max<int64_t>(p.S, 1)), kStemChannels});
}

// What both stem kernels need beside their dtype: group 1, C <= kStemChannels, at most kStemMaxTaps
// taps and a patch of at most `max_patch` elements.
bool stem_shape_fits(const ConvProblem& p, int64_t max_patch, std::string* why) {
  if (p.attr.group != 1) return reject(why, "group " + std::to_string(p.attr.group) + " (needs 1)");
  if (p.C < 0 || p.R < 0 || p.S < 0) return reject(why, "C, R and S must be known");
  if (p.C > kStemChannels) return reject(why, "C = " + std::to_string(p.C) + " > " + std::to_string(kStemChannels));
  const int64_t taps = saturating_product({p.R, p.S});
  if (taps > kStemMaxTaps)
    return reject(why, "R*S = " + std::to_string(taps) + " filter taps > " + std::to_string(kStemMaxTaps));
  const int64_t patch = stem_patch_elements(p);
  if (patch > max_patch)
    return reject(why, "input patch of " + std::to_string(patch) + " elements > " + std::to_string(max_patch) +
                           " (strides and dilations too large for shared memory)");
  return true;
}

bool stem_can_implement(const ConvProblem& p, std::string* why) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return reject(why, std::string("dtype ") + dtype_name(p.dtype) + " (needs float16 or bfloat16)");
  return stem_shape_fits(p, kStemMaxPatch, why);
}

// The fp32 stem kernel (FFMA): its filter block ([64][4][16] floats at most) is 16 KB of shared memory
// and its patch (float4 pixels) at most kStemFfmaMaxPatch elements, 31.5 KB, so filter, patch and bias
// fit the 48 KB a block gets without opting in to more.
constexpr int64_t kStemFfmaMaxPatch = 8064;

}  // namespace

bool stem_ffma_can_implement(const ConvProblem& p, std::string* why) {
  if (p.dtype != DType::kFloat) return reject(why, std::string("dtype ") + dtype_name(p.dtype) + " (needs float32)");
  return stem_shape_fits(p, kStemFfmaMaxPatch, why);
}

namespace {

// One thread per output element: no alignment or group constraints; the fallback for all.
bool direct_can_implement(const ConvProblem& p, std::string* why) { return float_dtype(p, why); }

}  // namespace

std::vector<KernelDescriptor> gemv_kernel_rules() {
  return {{"cuda_gemv_1x1", cuda_targets(), gemv_can_implement, kMinSm, kMaxSm}};
}

std::vector<KernelDescriptor> stem_kernel_rules() {
  return {{"cuda_stem_mma", cuda_targets(), stem_can_implement, kMinSm, kMaxSm},
          {"cuda_stem_ffma", cuda_targets(), stem_ffma_can_implement, kMinSm, kMaxSm}};
}

std::vector<KernelDescriptor> direct_kernel_rules() {
  // The depthwise kernels, the most reuse first (heuristics.cc's shape rule moves the strip kernel ahead
  // of the tile kernel where the tile would idle), then the direct kernel for everything else. The global
  // kernel comes after the tile and strip kernels, which also run global pools on 3x3, 5x5 and 7x7 maps
  // and do so as fast or faster (H200, 7x7x960: batch 32 7.4 µs strip vs 7.5, batch 1 3.6 tile vs 4.1);
  // on larger maps only it and the vector and scalar kernels remain (28x28x120 at batch 32: 29.2 µs vs
  // 151.9 scalar).
  return {{"cuda_depthwise_tile", cuda_targets(), depthwise_tile_can_implement, kMinSm, kMaxSm},
          {"cuda_depthwise_strip", cuda_targets(), depthwise_strip_can_implement, kMinSm, kMaxSm,
           prefer_depthwise_strip},
          {"cuda_depthwise_global", cuda_targets(), depthwise_global_can_implement, kMinSm, kMaxSm},
          {"cuda_depthwise_vec", cuda_targets(), depthwise_vec_can_implement, kMinSm, kMaxSm},
          {"cuda_depthwise_scalar", cuda_targets(), depthwise_scalar_can_implement, kMinSm, kMaxSm},
          {"cuda_direct", cuda_targets(), direct_can_implement, kMinSm, kMaxSm}};
}

}  // namespace epifuse
