#include "registry.h"
#include "wrapper_family.h"

#include <algorithm>

namespace epifuse {
namespace {

bool any_dtype(DType t, std::string* why) {
  if (t == DType::kFloat || t == DType::kFloat16 || t == DType::kBFloat16) return true;
  *why = std::string("no support for dtype ") + dtype_name(t);
  return false;
}

// The portable CPU kernel runs every valid problem.
bool cpu_eigen_can_implement(const ConvProblem& p, std::string* why) { return any_dtype(p.dtype, why); }

}  // namespace

const std::vector<KernelDescriptor>& kernel_registry() {
  static const std::vector<KernelDescriptor> registry = [] {
    std::vector<KernelDescriptor> all = {{"cpu_eigen", {"ort-cpu"}, cpu_eigen_can_implement, 0, 0}};
    // gemv first: it only takes 1x1 convs over a few pixels, where a tensor-core tile is mostly padding.
    // The stem kernel before im2col, and im2col before padding: for few-channel stems a GEMM over
    // R*S*C beats a conv on padded channels, and building its rows in shared memory beats writing them.
    int index = 0;
    for (auto family : {gemv_kernel_rules, stem_kernel_rules, sm90_kernel_rules, im2col_kernel_rules, padded_kernel_rules,
                        sm80_kernel_rules, direct_kernel_rules}) {
      ++index;
      for (KernelDescriptor& k : family()) {
        k.family = index;
        all.push_back(k);
      }
    }
    return all;
  }();
  return registry;
}

const std::vector<std::string>& known_targets() {
  static const std::vector<std::string> targets = {"ort-cpu", "ort-cuda", "tensorrt"};
  return targets;
}

const std::vector<std::string>& cuda_targets() {
  static const std::vector<std::string> targets = {"ort-cuda", "tensorrt"};
  return targets;
}

bool inner_kernel_can_implement(const char* inner_name, const ConvProblem& q, const std::string& context,
                                std::string* why) {
  for (const KernelDescriptor& k : kernel_registry())
    if (std::string(k.name) == inner_name) {
      std::string inner_why;
      if (k.can_implement(q, &inner_why)) return true;
      return reject(why, context + ": " + inner_why);
    }
  return reject(why, std::string("inner kernel ") + inner_name + " is not registered");
}

std::vector<const KernelDescriptor*> find_kernels(const std::string& target, const ConvProblem& p,
                                                  std::string* why, const DeviceInfo& d) {
  const int sm = d.sm;
  std::vector<const KernelDescriptor*> found;
  const auto& targets = known_targets();
  if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
    *why = "unknown target '" + target + "' (expected ort-cpu, ort-cuda or tensorrt)";
    return found;
  }
  const Status valid = validate(p);
  if (!valid.ok()) {
    *why = valid.message();
    return found;
  }
  std::string reasons;
  for (const KernelDescriptor& k : kernel_registry()) {
    if (std::find(k.targets.begin(), k.targets.end(), target) == k.targets.end()) continue;
    if (sm != 0 && (sm < k.min_sm || sm > k.max_sm)) continue;
    std::string reason;
    if (k.can_implement(p, &reason)) {
      found.push_back(&k);
    } else {
      reasons += std::string(reasons.empty() ? "" : "; ") + k.name + ": " + reason;
    }
  }
  if (found.empty()) *why = "no kernel for target '" + target + "': " + (reasons.empty() ? "none registered" : reasons);
  rank_kernels(&found, p, d);
  return found;
}

}  // namespace epifuse
