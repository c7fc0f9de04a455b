// Rules of the channel-padding kernels (plugins/kernels/padded_channels.cu): a problem whose C is
// not a multiple of 8 (an RGB stem, C = 3) runs on a tensor-core kernel after X and W are padded
// with zero channels to the next multiple of 8, so the rule is the inner kernel's rule on the
// padded problem. Zero channels add nothing to the sum, so the result is exact.
#include "registry.h"
#include "wrapper_family.h"

namespace epifuse {
namespace {

ConvProblem padded(const ConvProblem& p) {
  ConvProblem q = p;
  q.C = (p.C + 7) / 8 * 8;
  return q;
}

bool padded_can_implement(const char* inner_name, const ConvProblem& p, std::string* why) {
  if (p.C < 0 || p.C % 8 == 0) return reject(why, "C is a multiple of 8 (no padding needed)");
  if (p.attr.group != 1) return reject(why, "group != 1");
  return inner_kernel_can_implement(inner_name, padded(p), "padded to C = " + std::to_string(padded(p).C), why);
}

// The one list of the family (plugins/kernels/padded_channels.cu takes the names by index).
constexpr WrapperEntry kEntries[] = {
    {"pad8_sm80_f16_fixed8_128x64x32_3st", "sm80_f16_fixed8_128x64x32_3st", 80, 1209},
    {"pad8_sm80_bf16_fixed8_128x64x32_3st", "sm80_bf16_fixed8_128x64x32_3st", 80, 1209},
    {"pad8_sm90_f16_conv_128x64x64_c2x1", "sm90_f16_conv_128x64x64_c2x1", 90, 90},
    {"pad8_sm90_bf16_conv_128x64x64_c2x1", "sm90_bf16_conv_128x64x64_c2x1", 90, 90},
    {"pad8_sm80_f16_64x64x64_4st", "sm80_f16_64x64x64_4st", 80, 1209},
    {"pad8_sm80_bf16_64x64x64_4st", "sm80_bf16_64x64x64_4st", 80, 1209},
};
using Family = WrapperFamily<kEntries, padded_can_implement>;
static_assert(Family::kCount == kPaddedKernelCount, "registry.h's count");

}  // namespace

std::vector<KernelDescriptor> padded_kernel_rules() { return Family::descriptors(); }
const char* padded_kernel_name(int i) { return Family::name(i); }
const char* padded_inner_kernel(const char* name) { return Family::inner(name); }

ConvProblem channel_padded(const ConvProblem& p) { return padded(p); }

}  // namespace epifuse
