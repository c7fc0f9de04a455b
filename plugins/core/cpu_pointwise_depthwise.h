// The CPU kernel of epifuse::FusedPointwiseDepthwise: a 1x1 conv and the depthwise conv that reads its output
// (an inverted-residual block's expand and depthwise convs), one node, run one of two ways:
//  - in bands: each thread takes runs of output rows and computes them a band at a time, the 1x1 conv's rows
//    that band reads (pointwise_fused_conv.h) into a window of its own, then the depthwise conv of the window
//    (depthwise_fused_conv.h). The expanded tensor (MobileNetV2's 16 -> 96 at 112x112: 4.8 MB) is never
//    written whole: each window stays in its core's L2 while the depthwise conv reads it, and no thread waits
//    on another between the two convs. In whole models on Zen 5 (bench/cpu_pairs.py): MobileNetV2 1.06x and
//    MobileNetV3-Large 1.01-1.03x the same models with each pair as two FusedConvs on two threads, 0.98-0.99x
//    and 1.02x on one. Hot in a loop, alone, a pair often reads slower than the two nodes (0.88-1.03x,
//    bench/cpu_layout.py --only pointwise-depthwise): there the expanded tensor stays in cache between runs.
//  - separate, where the bands cannot run (no AVX2, more than PointwiseConv::kMaxChannels input channels, a
//    dilated or widely padded depthwise filter): the 1x1 conv over the whole map into a buffer, then the
//    depthwise conv over that buffer, each a CpuFusedConv, as the two FusedConv nodes would run.
// EPIFUSE_POINTWISE_DEPTHWISE=separate in the environment forces the second way (for comparisons and tests).
#pragma once
#include <functional>

#include "cpu_fused_conv.h"
#include "depthwise_fused_conv.h"
#include "pointwise_fused_conv.h"

namespace epifuse {

// Memory for one call: `floats` 64-byte aligned floats, valid until the call returns (ORT's arena in the
// adapter, whose blocks the nodes before just freed are still in cache).
using ScratchAllocator = std::function<float*(int64_t floats)>;

class CpuPointwiseDepthwise {
 public:
  CpuPointwiseDepthwise();

  // y = depthwise(pointwise(x)): `pointwise` a 1x1 conv, stride 1, unpadded, one group, no residual;
  // `depthwise` a conv of its output (N, H, W the same, C its K, group C = K), no residual; fp32.
  // `*_constant`: those filters are the same data on every call (initializers). Where `mean` is not null, the
  // mean of y over its rows and columns into it ([N][K]; epifuse::FusedPointwiseDepthwiseMean, the pair whose
  // depthwise conv feeds a squeeze-excite pool): summed in the depthwise kernel's registers band by band,
  // the bands' sums added in a fixed order (the same result on any number of threads).
  Status run(const ConvProblem& pointwise, const ConvProblem& depthwise, const void* x, const void* w1,
             bool w1_constant, const void* b1, const void* w2, bool w2_constant, const void* b2, void* y,
             const ParallelFor& parallel_for, const ScratchAllocator& scratch, float* mean = nullptr);

  // Whether the two problems are a pair this op runs (the shapes above), else why not.
  static Status check_pair(const ConvProblem& pointwise, const ConvProblem& depthwise);

 private:
  bool bands_can_run(const ConvProblem& pointwise, const ConvProblem& depthwise) const;
  Status run_separate(const ConvProblem& pw, const ConvProblem& dw, const void* x, const void* w1, bool w1_constant,
                      const void* b1, const void* w2, bool w2_constant, const void* b2, void* y,
                      const ParallelFor& parallel_for, const ScratchAllocator& scratch, float* mean);
  Status run_bands(const ConvProblem& pw, const ConvProblem& dw, const void* x, const void* w1, bool w1_constant,
                   const void* b1, const void* w2, bool w2_constant, const void* b2, void* y,
                   const ParallelFor& parallel_for, float* mean);

  bool separate_ = false;  // EPIFUSE_POINTWISE_DEPTHWISE=separate
  CpuFusedConv pointwise_conv_, depthwise_conv_;  // the separate way
  PointwiseConv pointwise_;                        // the bands
  DepthwiseConv depthwise_;
};

// The CPU kernel of epifuse::FusedDepthwisePointwise: a depthwise conv and the 1x1 conv that reads its output
// (MobileNetV1's separable convs; the first block of MobileNetV2, V3 and MNASNet; ShuffleNetV2's and
// PP-LCNet's blocks), one node, the 1x1 conv with its residual where it has one. In bands the same way: each
// band's depthwise output rows into the thread's window, then the 1x1 conv of the window's rows, its residual
// rows read beside them. No halo is computed twice (the 1x1 conv reads no neighbouring rows); the depthwise
// conv's input rows above and below a band are read again from X. The separate way, and
// EPIFUSE_POINTWISE_DEPTHWISE=separate, as above.
class CpuDepthwisePointwise {
 public:
  CpuDepthwisePointwise();

  // y = pointwise(depthwise(x)) (+ z, as `pointwise`'s residual says): `depthwise` group = C = K, no residual;
  // `pointwise` a 1x1 conv of its output, stride 1, unpadded, one group; fp32.
  Status run(const ConvProblem& depthwise, const ConvProblem& pointwise, const void* x, const void* w1,
             bool w1_constant, const void* b1, const void* w2, bool w2_constant, const void* b2, const void* z,
             void* y, const ParallelFor& parallel_for, const ScratchAllocator& scratch);

  static Status check_pair(const ConvProblem& depthwise, const ConvProblem& pointwise);

 private:
  bool bands_can_run(const ConvProblem& depthwise, const ConvProblem& pointwise) const;
  Status run_bands(const ConvProblem& dw, const ConvProblem& pw, const void* x, const void* w1, bool w1_constant,
                   const void* b1, const void* w2, bool w2_constant, const void* b2, const void* z, void* y,
                   const ParallelFor& parallel_for);

  bool separate_ = false;
  CpuFusedConv depthwise_conv_, pointwise_conv_;
  DepthwiseConv depthwise_;
  PointwiseConv pointwise_;
};

}  // namespace epifuse
