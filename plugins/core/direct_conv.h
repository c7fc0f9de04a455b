// The CPU kernels of epifuse's own (winograd_fused_conv.h, depthwise_fused_conv.h), which
// CpuFusedConv times against oneDNN per shape: one interface, and what each holds, its vector ISA
// and its prepared copy of constant filters.
#pragma once
#include <string>

#include "conv_problem.h"
#include "cpu_isa.h"
#include "parallel.h"
#include "prepared_filters.h"
#include "status.h"

namespace epifuse {

// One per node, safe to run from several threads at once.
class DirectConv {
 public:
  virtual ~DirectConv() = default;

  // Whether this kernel runs `p` on this CPU (its dtypes, and the kernel's own shapes).
  virtual bool supports(const ConvProblem& p) const = 0;

  // The kernel and its ISA, e.g. "depthwise direct avx512".
  virtual std::string name() const = 0;

  // As reference_fused_conv, for a problem `supports` accepts: the tensors hold p.dtype's elements.
  // `w_constant`: the filters are the same data on every call (an initializer), so their prepared copy is kept.
  virtual Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                     const void* z, void* y, const ParallelFor& parallel_for) = 0;

  // Drops the prepared copy of constant filters (a later run makes it again).
  void release_filters() { filters_.release(); }

  VectorIsa isa() const { return isa_; }

 protected:
  DirectConv() : isa_(best_vector_isa()) {}  // the widest ISA of this CPU (EPIFUSE_CPU_ISA=avx2 caps it at AVX2)

  VectorIsa isa_;
  PreparedFilters filters_;
};

}  // namespace epifuse
