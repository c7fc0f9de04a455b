// The one list of FusedConv kernels and the problems each can run. The optimizer asks it
// (through the C ABI) before fusing, so a fused node always has a kernel on its target.
#pragma once
#include <string>
#include <vector>

#include "conv_problem.h"

namespace epifuse {

struct KernelDescriptor {
  const char* name;
  std::vector<std::string> targets;  // "ort-cpu", "ort-cuda", "tensorrt"
  // True when the kernel runs `p` (already validated); otherwise `why` says what it lacks.
  bool (*can_implement)(const ConvProblem& p, std::string* why);
};

const std::vector<KernelDescriptor>& kernel_registry();
const std::vector<std::string>& known_targets();

// Kernels for `target` that can run `p`. When none, `why` says why (an invalid problem, an
// unknown target, or each candidate's reason).
std::vector<const KernelDescriptor*> find_kernels(const std::string& target, const ConvProblem& p,
                                                  std::string* why);

}  // namespace epifuse
