// Activation functors of the op contract, evaluated in fp32, on the host and in CUDA kernels.
// CPU kernels are templated on the functor (through visit_activation) so the per-element
// epilogue has no dispatch; CUDA epilogues use act::Runtime, whose switch is uniform per launch.
#pragma once
#include <algorithm>
#include <cmath>

#include "conv_problem.h"

#if defined(__CUDACC__)
#define EPIFUSE_HD __host__ __device__ __forceinline__
#else
#define EPIFUSE_HD inline
#endif

namespace epifuse {
namespace act {

// ln(1 + e^x) without overflow for large x or precision loss for very negative x.
EPIFUSE_HD float softplus(float x) { return std::max(x, 0.f) + std::log1p(std::exp(-std::fabs(x))); }
// On the GPU with the MUFU exp2 and an approximate division (~2 ulp in fp32, as sm90_common.cuh's):
// the accurate expf and IEEE division cost ~30 instructions per element, which made SiLU the largest
// part of the stem kernel's work. For x < -87 the divisor passes 2^126, where __fdividef returns 0:
// the correct limit.
EPIFUSE_HD float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.f, 1.f + __expf(-x));
#else
  return 1.f / (1.f + std::exp(-x));
#endif
}

#if defined(__CUDACC__)
// For kernels whose outputs are 16-bit: sigmoid = (1 + tanh(x/2)) / 2 with tanh.approx, one MUFU
// instruction where exp + reciprocal take two. The MUFU pipe (16 results/clock/SM) bounded SiLU on
// memory-bound layers: 2 x 52M outputs of a YOLOv8s batch-32 layer take ~27 us of it, as long as the
// layer's DRAM floor. tanh.approx's relative error is 2^-11, so sigmoid is within 2^-12; fp32
// kernels keep sigmoid() above.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));  // not volatile: the compiler may schedule it
  return y;
}
__device__ __forceinline__ float sigmoid_16bit(float x) { return fmaf(0.5f, tanh_approx(0.5f * x), 0.5f); }
struct Silu16bit { __device__ __forceinline__ float operator()(float x) const { return x * sigmoid_16bit(x); } };
#endif

struct Identity { EPIFUSE_HD float operator()(float x) const { return x; } };
// `x < 0 ? 0 : x`, not `x > 0 ? x : 0`: NaN propagates, as in ONNX Runtime's Relu
struct Relu { EPIFUSE_HD float operator()(float x) const { return x < 0.f ? 0.f : x; } };
struct LeakyRelu {
  float alpha;
  EPIFUSE_HD float operator()(float x) const { return x >= 0.f ? x : alpha * x; }
};
struct Clip {
  float lo, hi;
  EPIFUSE_HD float operator()(float x) const { return std::min(std::max(x, lo), hi); }
};
struct Sigmoid { EPIFUSE_HD float operator()(float x) const { return sigmoid(x); } };
struct Tanh { EPIFUSE_HD float operator()(float x) const { return std::tanh(x); } };
struct Silu { EPIFUSE_HD float operator()(float x) const { return x * sigmoid(x); } };
struct HardSigmoid {
  float alpha, beta;
  EPIFUSE_HD float operator()(float x) const { return std::max(0.f, std::min(1.f, alpha * x + beta)); }
};
struct HardSwish {
  EPIFUSE_HD float operator()(float x) const { return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f)); }
};
struct Gelu {
  EPIFUSE_HD float operator()(float x) const { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  EPIFUSE_HD float operator()(float x) const {
    return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
};
struct Mish { EPIFUSE_HD float operator()(float x) const { return x * std::tanh(softplus(x)); } };
struct Elu {
  float alpha;
  EPIFUSE_HD float operator()(float x) const { return x > 0.f ? x : alpha * std::expm1(x); }
};
struct Softplus { EPIFUSE_HD float operator()(float x) const { return softplus(x); } };

// Any activation chosen at run time; one switch per element, the same branch in every thread.
struct Runtime {
  ActivationKind kind;
  float p0, p1;
  EPIFUSE_HD float operator()(float x) const {
    switch (kind) {
      case ActivationKind::kIdentity: return x;
      case ActivationKind::kRelu: return Relu{}(x);
      case ActivationKind::kLeakyRelu: return LeakyRelu{p0}(x);
      case ActivationKind::kClip: return Clip{p0, p1}(x);
      case ActivationKind::kSigmoid: return Sigmoid{}(x);
      case ActivationKind::kTanh: return Tanh{}(x);
      case ActivationKind::kSilu: return Silu{}(x);
      case ActivationKind::kHardSigmoid: return HardSigmoid{p0, p1}(x);
      case ActivationKind::kHardSwish: return HardSwish{}(x);
      case ActivationKind::kGelu: return Gelu{}(x);
      case ActivationKind::kGeluTanh: return GeluTanh{}(x);
      case ActivationKind::kMish: return Mish{}(x);
      case ActivationKind::kElu: return Elu{p0}(x);
      case ActivationKind::kSoftplus: return Softplus{}(x);
    }
    return x;
  }
};

inline Runtime runtime(const Activation& a) { return Runtime{a.kind, a.params[0], a.params[1]}; }

}  // namespace act

// Calls f(functor) with the functor matching `a`.
template <class F>
void visit_activation(const Activation& a, F&& f) {
  const float p0 = a.params[0], p1 = a.params[1];
  switch (a.kind) {
    case ActivationKind::kIdentity: return f(act::Identity{});
    case ActivationKind::kRelu: return f(act::Relu{});
    case ActivationKind::kLeakyRelu: return f(act::LeakyRelu{p0});
    case ActivationKind::kClip: return f(act::Clip{p0, p1});
    case ActivationKind::kSigmoid: return f(act::Sigmoid{});
    case ActivationKind::kTanh: return f(act::Tanh{});
    case ActivationKind::kSilu: return f(act::Silu{});
    case ActivationKind::kHardSigmoid: return f(act::HardSigmoid{p0, p1});
    case ActivationKind::kHardSwish: return f(act::HardSwish{});
    case ActivationKind::kGelu: return f(act::Gelu{});
    case ActivationKind::kGeluTanh: return f(act::GeluTanh{});
    case ActivationKind::kMish: return f(act::Mish{});
    case ActivationKind::kElu: return f(act::Elu{p0});
    case ActivationKind::kSoftplus: return f(act::Softplus{});
  }
}

}  // namespace epifuse
