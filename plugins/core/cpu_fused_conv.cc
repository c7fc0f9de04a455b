#include "cpu_fused_conv.h"

#include <cstdlib>
#include <cstring>

namespace epifuse {

CpuFusedConv::CpuFusedConv() {
  const char* choice = std::getenv("EPIFUSE_CPU_KERNEL");
  reference_only_ = choice != nullptr && std::strcmp(choice, "reference") == 0;
}

Status CpuFusedConv::run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                         const void* z, void* y, const ParallelFor& parallel_for) {
  if (!reference_only_) {
    bool empty = false;
    EPIFUSE_RETURN_IF_ERROR(check_cpu_problem(p, x, w, b, z, y, &empty));
    if (empty) return Status::Ok();
    bool refused = true;
    EPIFUSE_RETURN_IF_ERROR(onednn_.run(p, x, w, w_constant, b, z, y, parallel_for, &refused));
    if (!refused) return Status::Ok();
  }
  return reference_fused_conv(p, x, w, b, z, y, parallel_for);
}

std::string CpuFusedConv::kernel_name(const ConvProblem& p) {
  if (reference_only_ || p.N <= 0) return "reference";
  const std::string impl = onednn_.implementation(p);
  return impl.empty() ? "reference" : "onednn " + impl;
}

}  // namespace epifuse
