// The CPU FusedConv every adapter runs: a direct kernel of its own — Winograd F(2x2, 3x3)
// (winograd_fused_conv.h) for 3x3 stride-1 convs, the depthwise kernel (depthwise_fused_conv.h) for
// depthwise ones, the gemv kernel (gemv_fused_conv.h) for 1x1 convs on a few pixels — or oneDNN,
// whichever runs the problem faster on this machine, where both can (timed at the first run of each
// shape in a process, unless the tuning cache (tuning_cache.h) holds the choice; kept there where
// EPIFUSE_TUNE=1; depthwise convs with AVX-512 take the direct kernel untimed); oneDNN where it has an
// optimized implementation; the reference kernel (reference_fused_conv.h) elsewhere.
// EPIFUSE_CPU_KERNEL=reference|onednn|winograd|depthwise|gemv in the environment picks one kernel for
// every problem it can run (oneDNN or the reference kernel for the rest).
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "channel_scale.h"
#include "onednn_fused_conv.h"
#include "reference_fused_conv.h"
#include "depthwise_fused_conv.h"
#include "gemv_fused_conv.h"
#include "winograd_fused_conv.h"

namespace epifuse {

enum class CpuKernel { kAuto, kReference, kOnednn, kWinograd, kDepthwise, kGemv };

// The kernel EPIFUSE_CPU_KERNEL names, else kAuto.
CpuKernel cpu_kernel_from_environment();

class CpuFusedConv {
 public:
  explicit CpuFusedConv(CpuKernel kernel = cpu_kernel_from_environment()) : kernel_(kernel) {}

  // As reference_fused_conv. `w_constant`: the filters are the same data on every call (an
  // initializer), so their reordered or transformed copy is kept. Where `mean` is not null, also the
  // mean of y over its rows and columns into it ([N][K], float or bfloat16 as p): summed in the
  // depthwise kernel's registers where that kernel runs p, else a pass over y.
  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for, void* mean = nullptr);

  // The conv of x * x_scale (epifuse::FusedConvScaled: a squeeze-excite gate and the conv that reads the gated
  // tensor), float or bfloat16: x_scale [N][C], or [1][C] for every image where !scales_per_image. Where the
  // filters hold no more elements than an image of x, they are scaled instead, image by image, and the gated
  // tensor is never written: by oneDNN's threads in the layout it reordered constant filters into, else
  // plain; where they hold more, x * x_scale goes into a buffer of the calling thread, then the conv.
  Status run_scaled(const ConvProblem& p, const void* x, const void* x_scale, bool scales_per_image, const void* w,
                    bool w_constant, const void* b, const void* z, void* y, const ParallelFor& parallel_for);

  // What runs `p` (every dimension known): "winograd F(2x2,3x3) avx512" (or avx2), "depthwise direct avx512"
  // (or avx2), "onednn <implementation>" or "reference". Where a direct kernel and oneDNN both can, this
  // times them as the first run would.
  Status kernel_name(const ConvProblem& p, std::string* name);

 private:
  // The direct kernel that can run `p` (at most one does), else null.
  DirectConv* direct_for(const ConvProblem& p);
  // The direct kernel that runs `p`: forced, depthwise with AVX-512 by rule, or timed against oneDNN once
  // per shape; null for oneDNN. `pooled`: the conv also sums its output's channel means.
  Status choose(const ConvProblem& p, const ParallelFor& parallel_for, bool pooled, DirectConv** chosen);

  CpuKernel kernel_;
  OnednnConv onednn_;
  WinogradConv winograd_;
  DepthwiseConv depthwise_;
  GemvConv gemv_;
  std::mutex mutex_;
  std::map<std::vector<int64_t>, bool> direct_chosen_;  // by shape: whether the direct kernel won
};

}  // namespace epifuse
