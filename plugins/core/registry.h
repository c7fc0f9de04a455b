// The one list of FusedConv kernels and the problems each can run. The optimizer asks it
// (through the C ABI) before fusing, so a fused node always has a kernel on its target.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "conv_problem.h"
#include "heuristics.h"

namespace epifuse {

struct KernelDescriptor {
  const char* name;
  std::vector<std::string> targets;  // "ort-cpu", "ort-cuda", "tensorrt"
  // True when the kernel runs `p` (already validated); otherwise `why` says what it lacks.
  bool (*can_implement)(const ConvProblem& p, std::string* why);
  // Compute capabilities (major*10+minor) the kernel's code runs on; 0/0 for CPU kernels.
  int min_sm = 0, max_sm = 0;
  // Optional: true when, for `p` on device `d`, this kernel should come before the ones of its family
  // listed ahead of it (a measured shape rule of heuristics.cc for the untuned first choice; tuning and
  // TensorRT time every kernel anyway).
  bool (*preferred)(const ConvProblem& p, const DeviceInfo& d) = nullptr;
  // Its family's place in the registry (set by kernel_registry()): shape rules reorder within a family.
  int family = 0;
};

// Helpers of the can_implement rules (rules_*.cc) and the shape rules (heuristics.cc).
// A dimension that is not symbolic (-1).
inline bool known(int64_t v) { return v >= 0; }
// The product of non-negative factors, saturated at INT64_MAX: size checks that cannot overflow.
inline int64_t saturating_product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors) {
    if (f != 0 && r > std::numeric_limits<int64_t>::max() / f) return std::numeric_limits<int64_t>::max();
    r *= f;
  }
  return r;
}

// Sets the why-not reason and returns false, so a rule reads `return reject(why, "...")`.
inline bool reject(std::string* why, std::string reason) {
  *why = std::move(reason);
  return false;
}

// Every kernel in its default order; the heuristic choice is the first that can run a problem, after
// find_kernels has let each family's shape rules (heuristics.h) reorder that family.
const std::vector<KernelDescriptor>& kernel_registry();
const std::vector<std::string>& known_targets();
// The targets every CUDA kernel serves (ONNX Runtime's CUDA EP and TensorRT).
const std::vector<std::string>& cuda_targets();

// The CUDA kernel families' descriptors (rules in rules_*.cc, code in plugins/kernels/).
std::vector<KernelDescriptor> sm90_kernel_rules();
std::vector<KernelDescriptor> sm80_kernel_rules();
std::vector<KernelDescriptor> direct_kernel_rules();
std::vector<KernelDescriptor> gemv_kernel_rules();
std::vector<KernelDescriptor> stem_kernel_rules();
std::vector<KernelDescriptor> padded_kernel_rules();
std::vector<KernelDescriptor> im2col_kernel_rules();
// The channel-padding kernels: their names (registry order), the kernel each wraps, and the
// problem it runs.
constexpr int kPaddedKernelCount = 6;
const char* padded_kernel_name(int i);  // null outside [0, kPaddedKernelCount)
const char* padded_inner_kernel(const char* name);
ConvProblem channel_padded(const ConvProblem& p);
// The im2col + GEMM kernels, in one place for the rules and the CUDA code so both see the same
// GEMM: the 1x1 kernel each wraps (null for another name); the images per chunk (as many as keep
// the chunk's matrix within ~16 MiB, at least 1, at most N; -1 when N, P or Q is unknown); and the
// GEMM problem of `images` images: X = their im2col matrix [images*P*Q, Kg] (Kg = R*S*C rounded
// up to 8), W = the filter as a [K, Kg] matrix, same dtype, activation and residual.
constexpr int kIm2colKernelCount = 6;
const char* im2col_kernel_name(int i);  // registry order; null outside [0, kIm2colKernelCount)
const char* im2col_inner_kernel(const char* name);
int64_t im2col_chunk_images(const ConvProblem& p);
ConvProblem im2col_gemm_problem(const ConvProblem& p, int64_t images);

// The stem kernels (plugins/kernels/stem_fused_conv.cu: tensor cores, 16-bit; stem_ffma_fused_conv.cu:
// fp32) compute output tiles of kStemTileRows x kStemTileCols pixels from an input patch staged in shared
// memory with the channels padded to kStemChannels; their rules (rules_direct.cc) bound that patch by
// the same geometry. The fp32 kernel's launch checks its rule on the concrete problem.
constexpr int kStemTileRows = 8, kStemTileCols = 16, kStemChannels = 4;
bool stem_ffma_can_implement(const ConvProblem& p, std::string* why);

// Kernels for `target` that can run `p` on device `d` (compute capability d.sm, or any when 0), best
// first: registry order, reordered within each family by the shape rules (heuristics.h). When none,
// `why` says why (an invalid problem, an unknown target, or each candidate's reason).
std::vector<const KernelDescriptor*> find_kernels(const std::string& target, const ConvProblem& p,
                                                  std::string* why, const DeviceInfo& d);
// The same on a device of compute capability `sm` (0: any) whose SM count is not known.
inline std::vector<const KernelDescriptor*> find_kernels(const std::string& target, const ConvProblem& p,
                                                         std::string* why, int sm = 0) {
  return find_kernels(target, p, why, DeviceInfo{sm, 0});
}

}  // namespace epifuse
