// The 1x1 conv of epifuse::FusedPointwiseDepthwise's bands (cpu_pointwise_depthwise.h): a 1x1 conv over a
// few rows of a map with few input channels (an inverted-residual block's expand: MobileNetV2's 16 -> 96 at
// 112x112, 24 -> 144 at 56x56), fp32 on AVX-512 or AVX2. NHWC makes it one GEMM, [pixels][C] x [C][K], run
// as register tiles of a few pixels by up to five output-channel vectors (simd_math.h's gemm_shape), each
// input channel broadcast against the filters' vectors, bias, residual and activation applied to the tile in
// registers, one switch on the activation a tile. A band's few rows are a small GEMM, where oneDNN's fixed
// cost a call (about 1.5 us) would be much of the work. Hot in a loop over whole maps it ran 0.95-1.1x
// oneDNN's brgemm convs on Zen 5 (16 -> 64 at 112x112: 79 against 80 us on two threads).
#pragma once
#include "direct_conv.h"

namespace epifuse {

// Its prepared filters: constant filters in panels of the register tile's output-channel vectors, each
// [C][its vectors] (padded to whole vectors), one after another.
class PointwiseConv final : public DirectConv {
 public:
  // At most this many input channels: a panel of filters ([C][up to 5 vectors], 40 KB at 128) stays in L1
  // while the tiles of a band run over it; wider convs would need a blocking over C.
  static constexpr int64_t kMaxChannels = 128;

  // 1x1, stride 1, no padding, one group, C <= kMaxChannels, any number of pixels (a band of a 4-wide map
  // has 4); fp32 on a CPU with AVX-512F, or AVX2 and FMA.
  bool supports(const ConvProblem& p) const override;

  // "pointwise direct avx512" or "... avx2".
  std::string name() const override;

  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for) override;
};

}  // namespace epifuse
