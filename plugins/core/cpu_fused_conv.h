// The CPU FusedConv every adapter runs: Winograd F(2x2, 3x3) (winograd_fused_conv.h) or oneDNN,
// whichever runs the problem faster on this machine, where both can; oneDNN where it has an optimized
// implementation; the reference kernel (reference_fused_conv.h) elsewhere.
// EPIFUSE_CPU_KERNEL=reference|onednn|winograd in the environment picks one kernel for every problem
// it can run (oneDNN or the reference kernel for the rest).
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "onednn_fused_conv.h"
#include "reference_fused_conv.h"
#include "winograd_fused_conv.h"

namespace epifuse {

enum class CpuKernel { kAuto, kReference, kOnednn, kWinograd };

// The kernel EPIFUSE_CPU_KERNEL names, else kAuto.
CpuKernel cpu_kernel_from_environment();

class CpuFusedConv {
 public:
  explicit CpuFusedConv(CpuKernel kernel = cpu_kernel_from_environment()) : kernel_(kernel) {}

  // As reference_fused_conv. `w_constant`: the filters are the same data on every call (an
  // initializer), so their reordered or transformed copy is kept.
  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for);

  // What runs `p` (every dimension known): "winograd F(2x2,3x3) avx512" (or avx2), "onednn <implementation>"
  // or "reference". Where both Winograd and oneDNN can, this times them as the first run would.
  Status kernel_name(const ConvProblem& p, std::string* name);

 private:
  // Whether the Winograd kernel runs `p`: forced, or timed against oneDNN once per shape.
  Status use_winograd(const ConvProblem& p, const ParallelFor& parallel_for, bool* yes);

  CpuKernel kernel_;
  OnednnConv onednn_;
  WinogradConv winograd_;
  std::mutex mutex_;
  std::map<std::vector<int64_t>, bool> winograd_chosen_;
};

}  // namespace epifuse
