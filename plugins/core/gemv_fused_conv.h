// CPU FusedConv for 1x1 convolutions on a few pixels (a squeeze-excite block's two convs on its pooled
// [N, 1, 1, C] vector, a 1x1 classifier head), fp32 on AVX-512 or AVX2, bf16 (data and filters, fp32 sums)
// on AVX-512 with BW: a matrix-vector product per pixel against the filters rearranged once into panels of
// [C][8 vectors of K], a panel's output channels accumulating in registers, bias, residual and activation
// applied there. What it saves is
// oneDNN's fixed cost a call (its execution context, argument map and allocations, about 1.5 us a node
// on Zen 4) on convs whose arithmetic takes less than that; CpuFusedConv times it against oneDNN per
// shape.
#pragma once
#include "direct_conv.h"

namespace epifuse {

// Its prepared filters: constant filters in panels of up to 8 output-channel vectors, each [C][its
// vectors] (padded to whole vectors), one after another.
class GemvConv final : public DirectConv {
 public:
  // At most this many output pixels (N * P * Q): each pixel reads the whole filter matrix.
  static constexpr int64_t kMaxPixels = 4;

  // 1x1, stride 1, no padding, one group, N * H * W <= kMaxPixels; fp32 on a CPU with AVX-512F or AVX2
  // and FMA, bf16 with AVX-512F, BW and VL.
  bool supports(const ConvProblem& p) const override;

  // "gemv direct avx512" or "... avx2".
  std::string name() const override;

  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for) override;
};

}  // namespace epifuse
