// The CPU FusedConv every adapter runs: oneDNN where it has an optimized implementation for the
// problem on this CPU, the reference kernel (reference_fused_conv.h) elsewhere.
// EPIFUSE_CPU_KERNEL=reference in the environment runs the reference kernel everywhere.
#pragma once
#include <string>

#include "onednn_fused_conv.h"
#include "reference_fused_conv.h"

namespace epifuse {

class CpuFusedConv {
 public:
  CpuFusedConv();  // reads EPIFUSE_CPU_KERNEL

  // As reference_fused_conv. `w_constant`: the filters are the same data on every call (an
  // initializer), so their reordered copy is kept.
  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for);

  // What runs `p`: "onednn <implementation>" or "reference".
  std::string kernel_name(const ConvProblem& p);

 private:
  bool reference_only_;
  OnednnConv onednn_;
};

}  // namespace epifuse
