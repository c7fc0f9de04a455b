// Rules of the CUDA kernels written here without CUTLASS (plugins/kernels/direct_*.cu).
#include "registry.h"

namespace epifuse {
namespace {

const std::vector<std::string> kCudaTargets = {"ort-cuda", "tensorrt"};
constexpr int kMinSm = 80, kMaxSm = 1209;  // built for sm_80 and newer

bool float_dtype(const ConvProblem& p, std::string* why) {
  if (p.dtype == DType::kFloat || p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) return true;
  *why = std::string("no support for dtype ") + dtype_name(p.dtype);
  return false;
}

// Depthwise (group == C, K a multiple of C): each output channel reads one input channel, so the
// work is memory-bound and a direct NHWC kernel with vector loads along C is the right shape.
bool depthwise_can_implement(const ConvProblem& p, std::string* why) {
  if (!float_dtype(p, why)) return false;
  if (p.C >= 0 && p.attr.group != p.C) {
    *why = "not depthwise (group != C)";
    return false;
  }
  return true;
}

// One thread per output element: no alignment or group constraints; the fallback for all.
bool direct_can_implement(const ConvProblem& p, std::string* why) { return float_dtype(p, why); }

}  // namespace

std::vector<KernelDescriptor> direct_kernel_rules() {
  return {{"cuda_depthwise", kCudaTargets, depthwise_can_implement, kMinSm, kMaxSm},
          {"cuda_direct", kCudaTargets, direct_can_implement, kMinSm, kMaxSm}};
}

}  // namespace epifuse
