// The depthwise kernels' launch geometry (plugins/kernels/depthwise_fused_conv.cu) in one place for
// the CUDA code, their rules (rules_direct.cc: what each kernel can run) and the shape rules
// (heuristics.cc: which goes first), so the three cannot disagree. Plain C++: the core builds without CUDA.
#pragma once
#include <cstdint>
#include <string>

#include "conv_problem.h"

namespace epifuse {

// What each depthwise kernel can run (rules_direct.cc); the launches check the concrete problem with
// them too, so a dimension unknown when the kernel was chosen cannot overflow its index math.
bool depthwise_global_can_implement(const ConvProblem& p, std::string* why);
bool depthwise_tile_can_implement(const ConvProblem& p, std::string* why);
bool depthwise_strip_can_implement(const ConvProblem& p, std::string* why);
bool depthwise_vec_can_implement(const ConvProblem& p, std::string* why);
bool depthwise_scalar_can_implement(const ConvProblem& p, std::string* why);

namespace depthwise {

// ---- cuda_depthwise_global: the filter covers the whole unpadded map (a global pool written as a depthwise
// conv: one output pixel per image). A block owns kGlobalChannels channels (2 per thread) and a range of the
// map's pixels, whose taps it stages in shared memory once as [tap][channel], and reduces that range for a
// group of images, kGlobalLanes lanes of threads splitting the pixels. A map of more than kGlobalSplitPixels
// pixels (the most a block stages) is split into ranges over several blocks, into more of them (down to
// kGlobalMinSplitPixels each) while the grid is short of kGlobalTargetBlocks: at batch 1 a squeeze-excite pool
// of 112x112x32 runs as 392 blocks of 32 pixels, not 49 of 256 (10.6 µs on an H200). The ranges leave fp32
// partial sums in the workspace, [image][channel][range], and a second kernel adds each output's (a warp
// each) and applies the epilogue. Images are grouped so the grid stays near kGlobalTargetBlocks (one wave on
// an H200: 132 SMs x 6 blocks, as shared memory allows).
constexpr int kGlobalChannels = 32, kGlobalLanes = 16, kGlobalSplitPixels = 256, kGlobalMinSplitPixels = 32,
              kGlobalTargetBlocks = 792;

struct GlobalPlan {
  int64_t slices, splits, split_pixels, images_per_block, image_groups;
};
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr GlobalPlan global_plan(int64_t N, int64_t C, int64_t pixels) {
  const int64_t n = N < 1 ? 1 : N, slices = ceil_div(C, kGlobalChannels);
  int64_t splits = 1;
  if (pixels > kGlobalSplitPixels) {
    const int64_t fewest = ceil_div(pixels, kGlobalSplitPixels), most = ceil_div(pixels, kGlobalMinSplitPixels);
    const int64_t wanted = ceil_div(kGlobalTargetBlocks, slices * n);
    splits = wanted < fewest ? fewest : (wanted > most ? most : wanted);
  }
  const int64_t split_pixels = ceil_div(pixels, splits);
  splits = pixels > 0 ? ceil_div(pixels, split_pixels) : 1;  // no empty range
  const int64_t groups = ceil_div(kGlobalTargetBlocks, slices * splits);
  const int64_t images = ceil_div(n, groups < n ? groups : n);
  return {slices, splits, split_pixels, images, ceil_div(n, images)};
}
// The partial sums of a split map: N x C x splits floats, none where one block covers the map.
constexpr int64_t global_workspace_bytes(int64_t N, int64_t C, int64_t pixels) {
  const GlobalPlan plan = global_plan(N, C, pixels);
  return plan.splits > 1 ? plan.splits * N * C * int64_t(sizeof(float)) : 0;
}

// ---- cuda_depthwise_vec: VEC = 16 bytes of channels per thread, one output pixel; the taps of a slice of
// up to kVecGroups channel groups staged in shared memory as [tap][channel], at most kVecMaxTapFloats.
constexpr int kVecThreads = 256, kVecGroups = 32, kVecMaxTapFloats = 12288;  // 48 KB of floats
constexpr int vec_width(int elem_bytes) { return 16 / elem_bytes; }
// Channels of one slice (a block's shared taps cover them): C rounded up to whole vectors, at most 32 of them.
constexpr int64_t vec_slice(int64_t C, int elem_bytes) {
  const int64_t v = vec_width(elem_bytes), groups = (C + v - 1) / v;
  return (groups < kVecGroups ? groups : kVecGroups) * v;
}

// ---- cuda_depthwise_strip: a thread owns VEC adjacent channels and a strip of TQ output columns of one
// output row. The taps of a thread (R*S*VEC floats) stay in registers, so VEC shrinks as S grows; past
// 64 of them (7x7) they move to shared memory: in registers they held the 7x7 kernel at 195 registers,
// 8 warps per SM, too few to hide its load latency (ConvNeXt's dw7x7 121.7 -> 85.2 us on the H200).
constexpr int kStripThreads = 128;  // block size cap: registers (taps) limit the warps per SM anyway
constexpr int strip_vec(int s) { return s <= 3 ? 4 : 2; }
constexpr bool shared_taps(int r, int s, int vec) { return r * s * vec > 64; }
constexpr int strip_cols(int stride_w, int s, int elem_bytes) {
  return stride_w == 1 && !(s == 7 && elem_bytes == 4) ? 8 : 4;  // fp32 7x7: 8 would spill
}
constexpr int strip_window(int s, int stride_w, int cols) { return (cols - 1) * stride_w + s; }

// ---- cuda_depthwise_tile: TQ output columns x RP output rows x 2 channels per thread; a block is CB
// channels x STRIPS strips of TQ columns x TP rows, its input patch staged in shared memory. With CB = 16
// (fp16/bf16: 32-byte pixels) and TQ = 7 the strips of a warp start 7 pixels = 56 words apart, so its
// shared-memory reads fall in 32 distinct banks.
template <int TQ_, int RP_, int TP_, int CB_, int STRIPS_, int MIN_BLOCKS_>
struct TileConfig {
  static constexpr int TQ = TQ_, RP = RP_, TP = TP_, CB = CB_, STRIPS = STRIPS_, kMinBlocks = MIN_BLOCKS_;
  static constexpr int QT = TQ * STRIPS, kThreads = CB / 2 * STRIPS * (TP / RP);
  static_assert(CB % 2 == 0 && TP % RP == 0, "two channels per thread, whole row groups");
};
// 8x28 outputs x 16 channels, 128 threads: the best of the configurations timed on the H200 for
// batch 32 (dw7x7 40.4 us, 5x5 19.8, 3x3 24.8-26.6) ...
using TileWide = TileConfig<7, 2, 8, 16, 4, 6>;
// ... and 4x28 with one row per thread, for grids too small to fill the GPU with the wide tile.
using TileSmall = TileConfig<7, 1, 4, 16, 4, 8>;
static_assert(TileWide::CB == TileSmall::CB, "one channel slicing for both (tile_slices)");

// Blocks of the tile kernel's configuration `Cfg` for N images of P x Q outputs (one channel slice).
template <class Cfg>
constexpr int64_t tile_blocks(int64_t N, int64_t P, int64_t Q) {
  return N * ((P + Cfg::TP - 1) / Cfg::TP) * ((Q + Cfg::QT - 1) / Cfg::QT);
}
constexpr int64_t tile_slices(int64_t C) { return (C + TileWide::CB - 1) / TileWide::CB; }
// Batch 1 and small images: the wide tiles would leave SMs idle (ConvNeXt dw7x7 at batch 1: 84 blocks),
// so the kernel runs the small ones.
constexpr bool tile_few_blocks(int64_t N, int64_t P, int64_t Q, int64_t C, int64_t sms) {
  return tile_blocks<TileWide>(N, P, Q) * tile_slices(C) < 2 * sms;
}

}  // namespace depthwise
}  // namespace epifuse
