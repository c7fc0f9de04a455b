// Rules of the channel-padding kernels (plugins/kernels/padded_channels.cu): a problem whose C is
// not a multiple of 8 (an RGB stem, C = 3) runs on a tensor-core kernel after X and W are padded
// with zero channels to the next multiple of 8, so the rule is the inner kernel's rule on the
// padded problem. Zero channels add nothing to the sum, so the result is exact.
#include "registry.h"

namespace epifuse {
namespace {

const std::vector<std::string> kCudaTargets = {"ort-cuda", "tensorrt"};

ConvProblem padded(const ConvProblem& p) {
  ConvProblem q = p;
  q.C = (p.C + 7) / 8 * 8;
  return q;
}

template <const char* kInner>
bool padded_can_implement(const ConvProblem& p, std::string* why) {
  if (p.C < 0 || p.C % 8 == 0) {
    *why = "C is a multiple of 8 (no padding needed)";
    return false;
  }
  if (p.attr.group != 1) {
    *why = "group != 1";
    return false;
  }
  for (const KernelDescriptor& k : kernel_registry())
    if (std::string(k.name) == kInner) {
      std::string inner_why;
      if (k.can_implement(padded(p), &inner_why)) return true;
      *why = std::string("padded to C = ") + std::to_string(padded(p).C) + ": " + inner_why;
      return false;
    }
  *why = std::string("inner kernel ") + kInner + " is not registered";
  return false;
}

constexpr char kSm90F16[] = "sm90_f16_conv_128x64x64_c2x1";
constexpr char kSm90Bf16[] = "sm90_bf16_conv_128x64x64_c2x1";
constexpr char kSm80F16[] = "sm80_f16_64x64x64_4st";
constexpr char kSm80Bf16[] = "sm80_bf16_64x64x64_4st";
constexpr char kFixed8F16[] = "sm80_f16_fixed8_128x64x32_3st";
constexpr char kFixed8Bf16[] = "sm80_bf16_fixed8_128x64x32_3st";

}  // namespace

std::vector<KernelDescriptor> padded_kernel_rules() {
  return {{"pad8_sm80_f16_fixed8_128x64x32_3st", kCudaTargets, padded_can_implement<kFixed8F16>, 80, 1209},
          {"pad8_sm80_bf16_fixed8_128x64x32_3st", kCudaTargets, padded_can_implement<kFixed8Bf16>, 80, 1209},
          {"pad8_sm90_f16_conv_128x64x64_c2x1", kCudaTargets, padded_can_implement<kSm90F16>, 90, 90},
          {"pad8_sm90_bf16_conv_128x64x64_c2x1", kCudaTargets, padded_can_implement<kSm90Bf16>, 90, 90},
          {"pad8_sm80_f16_64x64x64_4st", kCudaTargets, padded_can_implement<kSm80F16>, 80, 1209},
          {"pad8_sm80_bf16_64x64x64_4st", kCudaTargets, padded_can_implement<kSm80Bf16>, 80, 1209}};
}

const char* padded_inner_kernel(const char* name) {
  static const std::pair<const char*, const char*> inner[] = {
      {"pad8_sm80_f16_fixed8_128x64x32_3st", kFixed8F16}, {"pad8_sm80_bf16_fixed8_128x64x32_3st", kFixed8Bf16},
      {"pad8_sm90_f16_conv_128x64x64_c2x1", kSm90F16}, {"pad8_sm90_bf16_conv_128x64x64_c2x1", kSm90Bf16},
      {"pad8_sm80_f16_64x64x64_4st", kSm80F16}, {"pad8_sm80_bf16_64x64x64_4st", kSm80Bf16}};
  for (const auto& [outer, in] : inner)
    if (std::string(outer) == name) return in;
  return nullptr;
}

ConvProblem channel_padded(const ConvProblem& p) { return padded(p); }

}  // namespace epifuse
