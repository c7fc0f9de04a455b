// Kernel families that run a registered inner kernel on a transformed problem: im2col + GEMM
// (rules_im2col.cc) and channel padding (rules_padded.cc). Each keeps one table of (name, inner
// kernel, SMs); this turns it into registry descriptors and the lookups plugins/kernels uses, so the
// CUDA side takes names by index and the mapping is written once.
#pragma once
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "registry.h"

namespace epifuse {

struct WrapperEntry {
  const char* name;
  const char* inner;
  int min_sm, max_sm;  // the inner kernel's
};

// kRule(inner, p, why): the family's rule for `p`, given an entry's inner kernel name.
template <const auto& kEntries, bool (*kRule)(const char* inner, const ConvProblem& p, std::string* why)>
struct WrapperFamily {
  static constexpr int kCount = static_cast<int>(std::size(kEntries));

  static std::vector<KernelDescriptor> descriptors() {
    return descriptors(std::make_integer_sequence<int, kCount>{});
  }
  static const char* name(int i) { return i >= 0 && i < kCount ? kEntries[i].name : nullptr; }
  static const char* inner(const char* name) {
    if (!name) return nullptr;
    for (const WrapperEntry& e : kEntries)
      if (std::string(e.name) == name) return e.inner;
    return nullptr;
  }

 private:
  template <int I>
  static bool rule(const ConvProblem& p, std::string* why) {
    return kRule(kEntries[I].inner, p, why);
  }
  template <int... I>
  static std::vector<KernelDescriptor> descriptors(std::integer_sequence<int, I...>) {
    return {KernelDescriptor{kEntries[I].name, cuda_targets(), rule<I>, kEntries[I].min_sm,
                             kEntries[I].max_sm}...};
  }
};

// True when registered kernel `inner_name` runs `q`; otherwise `why` is "<context>: <its reason>", or
// says the inner kernel is not registered.
bool inner_kernel_can_implement(const char* inner_name, const ConvProblem& q, const std::string& context,
                                std::string* why);

}  // namespace epifuse
