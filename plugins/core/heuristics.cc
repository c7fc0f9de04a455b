// The untuned order (heuristics.h): the SM90 kernels' shape rules and the ranking that applies them.
#include "heuristics.h"

#include <algorithm>

#include "depthwise_geometry.h"
#include "registry.h"

// The SM90 rules, from the H200 anchor and model-layer tables (docs/bench-kernels.md; fp16). For
// convs the 1x1 GEMMs do not take (3x3s, strided 1x1s): the persistent ping-pong 128x64 conv (first in
// the registry's conv list), on every anchor 3x3 within 6% of the best kernel and mostly the best
// (r50.s1.3x3 24.6 µs vs 31.9 two-CTA, y8s.160.3x3 44.4 vs 65.9), except C, K <= 32, where the 32-deep
// k-step kernels go first, and where 128x64 tiles fill less than 0.7 of a wave (batch 1): the 64-row
// tiles, when the node's activation is in their epilogue. For 1x1s the GEMMs keep the problem while the
// 128x128 tiles fill 0.7 of a wave; below, the 64-row or the one-CTA conv. Unknown M (symbolic batch):
// the registry order.

namespace epifuse {
namespace {

// "A wave": as many tiles as the device has SMs; 0.7 of one counts as filled.
int64_t wave_tiles(const DeviceInfo& d) { return d.sms() * 7 / 10; }

bool gemm_problem(const ConvProblem& p) {
  const ConvAttributes& a = p.attr;
  return p.R == 1 && p.S == 1 && a.stride_h == 1 && a.stride_w == 1 && !a.pad_top && !a.pad_left &&
         !a.pad_bottom && !a.pad_right;
}
// Output tiles of `pixel_tile` pixels (M = N*P*Q) x `tile_n` channels, in either GEMM orientation;
// -1 when unknown.
int64_t tiles(const ConvProblem& p, int64_t tile_n, int64_t pixel_tile = 128) {
  const int64_t P = p.P(), Q = p.Q();
  if (!known(p.N) || !known(P) || !known(Q) || !known(p.K)) return -1;
  return (saturating_product({p.N, P, Q}) + pixel_tile - 1) / pixel_tile * ((p.K + tile_n - 1) / tile_n);
}
// C <= 32 and K <= 32: see prefer_conv_128x32.
bool narrow_input(const ConvProblem& p) { return known(p.C) && known(p.K) && p.C <= 32 && p.K <= 32; }

}  // namespace

// C <= 32 and K <= 32: the other convs' 64-deep k-step is half zero fill and their 64-wide N tile half
// empty (YOLOv8s 160x160 32->32 3x3: 125 us vs 224 at batch 32, 6.4 vs 11.7 at batch 1). With K = 64
// the two-CTA 128x64 kept the lead (320x320 32->64 3x3s2 at batch 32: 230 vs 258 us; tied at batch 1).
bool prefer_conv_128x32(const ConvProblem& p, const DeviceInfo&) { return !gemm_problem(p) && narrow_input(p); }
// 64-row tiles while 128x64 tiles fill less than 0.7 of a wave (batch 1: ResNet-50's layers from 56x56
// on, 14-50 tiles: 24 of its 28 problems, 3x3 56x56x64 4.4 µs vs 5.7 on 128x32), except C, K <= 32.
bool prefer_conv_64x64(const ConvProblem& p, const DeviceInfo& d) {
  const int64_t t = tiles(p, 64);
  return !narrow_input(p) && t >= 0 && t < wave_tiles(d);
}
// 256x128 GEMM tiles where they fill a wave (r50.s1.1x1up 27.8 µs vs 32.4 on 128x128, r50.s4.1x1up's
// 112 tiles 11.8 vs 12.9); r50.s3.1x1dn with 50 lost (15.8 vs 9.9).
bool prefer_gemm_256x128(const ConvProblem& p, const DeviceInfo& d) {
  return gemm_problem(p) && tiles(p, 128, 256) >= wave_tiles(d);
}
// 128-channel x 96-pixel tiles (the channels-as-rows GEMM) where they make one nearly full wave, fuller
// than the 128-pixel tiles' single partial one: r50.s3.1x1dn's 6272 pixels x 256 channels are 132 such
// tiles, 7.9 µs vs 9.4 on 98 tiles of 128x128; on r50.s1.1x1up (2092 tiles) they lost, 31.4 vs 24.0.
bool prefer_gemm_96px(const ConvProblem& p, const DeviceInfo& d) {
  const int64_t t96 = tiles(p, 128, 96);
  return gemm_problem(p) && t96 >= wave_tiles(d) && t96 <= d.sms() && tiles(p, 128) < t96;
}
// 128-channel x 224-pixel tiles where they make one wave of at least 0.7 (cuBLAS's tiling for
// r50.s4.1x1up, 1568 pixels x 2048 channels = 112 tiles: 9.5 µs vs 10.4-10.8 on 128x128 / 256x128).
// Listed before the 256x128 GEMM, whose rule also takes that layer. No problem meets both this and
// the 96-pixel rule (224-pixel tiles are fewer than 0.43 of the 96-pixel ones).
bool prefer_gemm_224px(const ConvProblem& p, const DeviceInfo& d) {
  const int64_t t224 = tiles(p, 128, 224);
  return gemm_problem(p) && t224 >= wave_tiles(d) && t224 <= d.sms();
}
bool prefer_conv_1cta(const ConvProblem& p, const DeviceInfo& d) {
  const int64_t wide = tiles(p, 128);  // -1 when M is unknown
  return gemm_problem(p) && wide >= 0 && wide < wave_tiles(d);
}

// The depthwise tile kernel stages a TP x 28-column output tile's input patch. Rows narrower than 21
// columns leave most of that tile idle; with a 3x3 or 5x5 filter the strip kernel is then faster where
// the wide tiles fill the GPU (H200, batch 32: 7x7x1152 5x5 13.2 vs 23.6 µs, 14x14x480 3x3 11.1 vs 13.9,
// 14x14x672 5x5 26.5 vs 27.3), while a 7x7 filter reuses a staged pixel enough to win even there
// (14x14x384: 26.6 vs 35.5), and so does a global 7x7 pool as a depthwise conv only while the batch is
// small (960 channels: batch 1 3.6 vs 7.0 on the small tiles; batch 32 24.5 vs 7.3). Where the grid is
// small the tile kernel runs its small tiles, which the strip kernel does not beat.
bool prefer_depthwise_strip(const ConvProblem& p, const DeviceInfo& d) {
  const int64_t P = p.P(), Q = p.Q();
  if (!known(p.N) || !known(P) || !known(Q) || depthwise::tile_few_blocks(p.N, P, Q, p.C, d.sms())) return false;
  return P * Q <= 4 || (Q < 21 && p.R < 7);
}

void rank_kernels(std::vector<const KernelDescriptor*>* kernels, const ConvProblem& p, const DeviceInfo& d) {
  std::stable_sort(kernels->begin(), kernels->end(), [&](const KernelDescriptor* a, const KernelDescriptor* b) {
    if (a->family != b->family) return a->family < b->family;
    return (a->preferred && a->preferred(p, d)) && !(b->preferred && b->preferred(p, d));
  });
}

}  // namespace epifuse
