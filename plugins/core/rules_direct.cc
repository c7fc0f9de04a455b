// Rules of the CUDA kernels written here without CUTLASS (plugins/kernels: direct_fused_conv.cu,
// depthwise_fused_conv.cu, gemv_fused_conv.cu).
#include <algorithm>

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

// A 1x1 conv over at most kGemvMaxPixels output pixels (N*H*W; an unknown N is allowed when H*W fits,
// and the concrete problem is checked again at launch), stride 1, no padding, group 1: the
// warp-per-output-channel kernel of gemv_fused_conv.cu. Past a few dozen rows the tensor-core GEMMs win.
constexpr int64_t kGemvMaxPixels = 32;

bool gemv_can_implement(const ConvProblem& p, std::string* why) {
  if (!float_dtype(p, why)) return false;
  const ConvAttributes& a = p.attr;
  if (a.group != 1) return reject(why, "group " + std::to_string(a.group) + " (needs 1)");
  if (p.R != 1 || p.S != 1) return reject(why, "not a 1x1 filter");
  if (a.stride_h != 1 || a.stride_w != 1) return reject(why, "stride is not 1");
  if (a.pad_top || a.pad_left || a.pad_bottom || a.pad_right) return reject(why, "padded");
  if (p.H < 0 || p.W < 0) return reject(why, "H and W must be known");
  const int64_t pixels = saturating_product({std::max<int64_t>(p.N, 1), p.H, p.W});
  if (pixels > kGemvMaxPixels)
    return reject(why, std::to_string(pixels) + " pixels (N*H*W) > " + std::to_string(kGemvMaxPixels));
  return true;
}

// One thread per output element: no alignment or group constraints; the fallback for all.
bool direct_can_implement(const ConvProblem& p, std::string* why) { return float_dtype(p, why); }

// Preferred wherever it runs, so the SM90 kernels' preferred rules do not move ahead of it.
bool always(const ConvProblem&) { return true; }

}  // namespace

std::vector<KernelDescriptor> gemv_kernel_rules() {
  return {{"cuda_gemv_1x1", kCudaTargets, gemv_can_implement, kMinSm, kMaxSm, always}};
}

std::vector<KernelDescriptor> direct_kernel_rules() {
  return {{"cuda_depthwise", kCudaTargets, depthwise_can_implement, kMinSm, kMaxSm},
          {"cuda_direct", kCudaTargets, direct_can_implement, kMinSm, kMaxSm}};
}

}  // namespace epifuse
