// CPU FusedConv on oneDNN's convolution primitive, with the bias, the activation and the residual
// as post-ops applied while the output tile is in registers. Built where oneDNN was found
// (EPIFUSE_HAVE_ONEDNN); elsewhere every problem is refused and the reference kernel runs.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "conv_problem.h"
#include "parallel.h"
#include "status.h"

namespace epifuse {

// One per node: primitives are cached per input shape and the filters reordered once into the
// layout the primitive reads (when they are constant). Safe to run from several threads at once.
class OnednnConv {
 public:
  OnednnConv();
  ~OnednnConv();
  OnednnConv(const OnednnConv&) = delete;
  OnednnConv& operator=(const OnednnConv&) = delete;

  // Runs the problem on oneDNN and sets *refused = false, or sets *refused = true and writes
  // nothing when oneDNN has no optimized implementation for it (e.g. fp16 on a CPU without
  // native fp16): then the caller runs the reference kernel. `w_constant` says the filter data
  // never changes between calls, so its reordered copy can be kept.
  // `w_scale` ([C] of p's type, with constant filters): the conv of x times it, each input channel's
  // filter taps scaled in the layout the filters were reordered into once (a squeeze-excite gate), not
  // in the plain filters with a reorder on every call.
  // `mean` (fp32, one image): also y's mean over its rows and columns, [K] floats, each piece summing its
  // output while it is still in its core's cache; `*mean_done` says whether it did (else the caller's pass).
  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for, bool* refused,
             const void* w_scale = nullptr, float* mean = nullptr, bool* mean_done = nullptr);

  // Drops the reordered copy of constant filters (a later run makes it again).
  void release_filters();

  // The implementation oneDNN chose for `p` ("jit:avx2", "brg:avx512_core", ...), or "" when it
  // refuses the problem.
  std::string implementation(const ConvProblem& p);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// "oneDNN 3.2.0 (gomp)" where built with oneDNN, else "".
std::string onednn_version();

}  // namespace epifuse
