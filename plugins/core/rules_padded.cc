// Rules of the channel-padding kernels (plugins/kernels/padded_channels.cu): a problem whose C is
// not a multiple of 8 (an RGB stem, C = 3) runs on a tensor-core kernel after X and W are padded
// with zero channels to the next multiple of 8, so the rule is the inner kernel's rule on the
// padded problem. Zero channels add nothing to the sum, so the result is exact.
#include <utility>

#include "registry.h"

namespace epifuse {
namespace {

const std::vector<std::string> kCudaTargets = {"ort-cuda", "tensorrt"};

ConvProblem padded(const ConvProblem& p) {
  ConvProblem q = p;
  q.C = (p.C + 7) / 8 * 8;
  return q;
}

bool padded_can_implement(const char* inner_name, const ConvProblem& p, std::string* why) {
  if (p.C < 0 || p.C % 8 == 0) {
    *why = "C is a multiple of 8 (no padding needed)";
    return false;
  }
  if (p.attr.group != 1) {
    *why = "group != 1";
    return false;
  }
  for (const KernelDescriptor& k : kernel_registry())
    if (std::string(k.name) == inner_name) {
      std::string inner_why;
      if (k.can_implement(padded(p), &inner_why)) return true;
      *why = std::string("padded to C = ") + std::to_string(padded(p).C) + ": " + inner_why;
      return false;
    }
  *why = std::string("inner kernel ") + inner_name + " is not registered";
  return false;
}

struct Entry {
  const char* name;
  const char* inner;
  int min_sm, max_sm;  // the inner kernel's
};

// The one list of the family (plugins/kernels/padded_channels.cu takes the names by index).
constexpr Entry kEntries[] = {
    {"pad8_sm80_f16_fixed8_128x64x32_3st", "sm80_f16_fixed8_128x64x32_3st", 80, 1209},
    {"pad8_sm80_bf16_fixed8_128x64x32_3st", "sm80_bf16_fixed8_128x64x32_3st", 80, 1209},
    {"pad8_sm90_f16_conv_128x64x64_c2x1", "sm90_f16_conv_128x64x64_c2x1", 90, 90},
    {"pad8_sm90_bf16_conv_128x64x64_c2x1", "sm90_bf16_conv_128x64x64_c2x1", 90, 90},
    {"pad8_sm80_f16_64x64x64_4st", "sm80_f16_64x64x64_4st", 80, 1209},
    {"pad8_sm80_bf16_64x64x64_4st", "sm80_bf16_64x64x64_4st", 80, 1209},
};
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kPaddedKernelCount, "registry.h's count");

template <int I>
bool rule(const ConvProblem& p, std::string* why) {
  return padded_can_implement(kEntries[I].inner, p, why);
}

template <int... I>
std::vector<KernelDescriptor> descriptors(std::integer_sequence<int, I...>) {
  return {KernelDescriptor{kEntries[I].name, kCudaTargets, rule<I>, kEntries[I].min_sm, kEntries[I].max_sm}...};
}

}  // namespace

std::vector<KernelDescriptor> padded_kernel_rules() {
  return descriptors(std::make_integer_sequence<int, kPaddedKernelCount>{});
}

const char* padded_kernel_name(int i) { return i >= 0 && i < kPaddedKernelCount ? kEntries[i].name : nullptr; }

const char* padded_inner_kernel(const char* name) {
  if (!name) return nullptr;
  for (const Entry& e : kEntries)
    if (std::string(e.name) == name) return e.inner;
  return nullptr;
}

ConvProblem channel_padded(const ConvProblem& p) { return padded(p); }

}  // namespace epifuse
