// Which kernel runs a problem on this device, for hosts without a tactic timer (ONNX Runtime):
// a tuning cache on disk (device + problem -> kernel, like cuDNN's benchmark mode), filled by
// timing every valid kernel once when tuning is on (EPIFUSE_TUNE=1), else the registry's
// heuristic first choice. TensorRT times the same kernels itself as tactics.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "conv_problem.h"
#include "kernel_api.h"

namespace epifuse::cuda {

struct Selection {
  const KernelImpl* kernel = nullptr;
  std::string source;  // "cache", "tuned" or "heuristic"
};

// The problem as a cache key (every field a kernel's speed or validity depends on).
std::string problem_key(const ConvProblem& p);

// Chooses the kernel for `p` on the current device. When tuning, candidates are timed on
// `stream` with the given tensors (the output is overwritten; the caller launches after), which
// needs a stream that is not being captured into a CUDA graph: while capturing, the cache or the
// heuristic decides. `workspace` must hold the largest candidate's workspace when tuning.
Status select_kernel(const char* target, const ConvProblem& p, const Tensors& t, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream, Selection* out);

// Largest workspace any kernel valid for `p` on this device needs (what to reserve for tuning).
Status max_workspace(const char* target, const ConvProblem& p, size_t* bytes);

}  // namespace epifuse::cuda
