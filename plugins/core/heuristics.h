// The untuned kernel order: which of the kernels that can run a problem goes first when nothing was
// timed. The rules_*.cc files say only what a kernel can run; the registry lists each family best
// first from measurements; the shape rules here move a kernel ahead of the others of its family for
// the problems it wins, judged on the device that runs it (its SM count: how many tiles make a wave).
#pragma once
#include <cstdint>
#include <vector>

#include "conv_problem.h"

namespace epifuse {

struct KernelDescriptor;

// What the shape rules know of the device. sm_count 0: not known (at optimize time, without a GPU):
// the H200's 132, the SM90 kernels' most common device (sm_90a code runs only on H100/H200, 114-132).
struct DeviceInfo {
  int sm = 0;
  int sm_count = 0;
  int64_t sms() const { return sm_count > 0 ? sm_count : 132; }
};

// Shape rules of the SM90 kernels (kernels.def's `prefer` column); the measurements behind each are in
// heuristics.cc.
bool prefer_conv_128x32(const ConvProblem& p, const DeviceInfo& d);
bool prefer_conv_64x64(const ConvProblem& p, const DeviceInfo& d);
bool prefer_conv_1cta(const ConvProblem& p, const DeviceInfo& d);
bool prefer_gemm_256x128(const ConvProblem& p, const DeviceInfo& d);
bool prefer_gemm_96px(const ConvProblem& p, const DeviceInfo& d);
bool prefer_gemm_224px(const ConvProblem& p, const DeviceInfo& d);
// Shape rule of the depthwise kernels (rules_direct.cc): the strip kernel before the tile kernel.
bool prefer_depthwise_strip(const ConvProblem& p, const DeviceInfo& d);

// Reorders `kernels` (registry order) so that, within each family, those whose shape rule holds for `p`
// on `d` come first; families keep their registry order, so no rule moves a kernel past another family.
void rank_kernels(std::vector<const KernelDescriptor*>* kernels, const ConvProblem& p, const DeviceInfo& d);

}  // namespace epifuse
