// Activation functors of the op contract, evaluated in fp32. Kernels are templated on the
// functor (through visit_activation) so the per-element epilogue has no dispatch.
#pragma once
#include <algorithm>
#include <cmath>

#include "conv_problem.h"

namespace epifuse {
namespace act {

// ln(1 + e^x) without overflow for large x or precision loss for very negative x.
inline float softplus(float x) { return std::max(x, 0.f) + std::log1p(std::exp(-std::fabs(x))); }
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

struct Identity { float operator()(float x) const { return x; } };
struct Relu { float operator()(float x) const { return x > 0.f ? x : 0.f; } };
struct LeakyRelu {
  float alpha;
  float operator()(float x) const { return x >= 0.f ? x : alpha * x; }
};
struct Clip {
  float lo, hi;
  float operator()(float x) const { return std::min(std::max(x, lo), hi); }
};
struct Sigmoid { float operator()(float x) const { return sigmoid(x); } };
struct Tanh { float operator()(float x) const { return std::tanh(x); } };
struct Silu { float operator()(float x) const { return x * sigmoid(x); } };
struct HardSigmoid {
  float alpha, beta;
  float operator()(float x) const { return std::max(0.f, std::min(1.f, alpha * x + beta)); }
};
struct HardSwish {
  float operator()(float x) const { return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f)); }
};
struct Gelu {
  float operator()(float x) const { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  float operator()(float x) const {
    return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
};
struct Mish { float operator()(float x) const { return x * std::tanh(softplus(x)); } };
struct Elu {
  float alpha;
  float operator()(float x) const { return x > 0.f ? x : alpha * std::expm1(x); }
};
struct Softplus { float operator()(float x) const { return softplus(x); } };

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
