// The FusedConv epilogue every kernel applies to an fp32 accumulator:
//   pre:  y = act(acc + bias + z)      post: y = act(acc + bias) + z      none: y = act(acc + bias)
#pragma once
#include "activation.h"
#include "conv_problem.h"

namespace epifuse::cuda {

struct Epilogue {
  act::Runtime activation;
  Residual residual;

  static Epilogue of(const ConvProblem& p) { return {act::runtime(p.attr.activation), p.attr.residual}; }

  __device__ __forceinline__ float operator()(float acc, float bias, float z) const {
    float v = acc + bias;
    if (residual == Residual::kPre) v += z;
    v = activation(v);
    if (residual == Residual::kPost) v += z;
    return v;
  }
};

}  // namespace epifuse::cuda
