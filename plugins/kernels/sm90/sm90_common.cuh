// Shared pieces of the CUTLASS 3.x SM90 kernels (TMA + WGMMA, warp-specialized): the FusedConv
// epilogue as an EVT (epilogue visitor tree) whose activation and residual mode are chosen at run
// time, element types, hardware info, and cutlass::Status -> epifuse::Status.
//
// The tree:   D = Fused(acc, bias[k], C)       Fused = epifuse::cuda::Epilogue (epilogue.cuh):
//   none: act(acc + bias)      pre: act(acc + bias + C)      post: act(acc + bias) + C
// C is the residual Z, loaded by TMA only when a residual exists (ResidualFetch below); the
// activation (all 14 of the contract, with their parameters) is a runtime argument of the compute
// node, passed the way Sm90Compute passes `Fn::Arguments` to Clamp / LeakyReLU.
//
// Compiled only for sm_90a (sources.cmake): a plain sm_90 build compiles the kernels to stubs.
#pragma once
#include <cuda_runtime_api.h>
#include <type_traits>

#include <cstdint>
#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/device_kernel.h"
#include "cute/tensor.hpp"
#include "cutlass/kernel_hardware_info.hpp"  // must precede the conv collective headers
#include "cutlass/numeric_types.h"
#include "cutlass/fast_math.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"

#include "epilogue.cuh"
#include "kernel_api.h"

namespace epifuse::cuda::sm90 {

// ------------------------------------------------------------------------------------------------
// Element types
template <DType D>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};
// fp32 tensors: CUTLASS's SM90 builders run float operands as TF32 WGMMA (the F32_TF32 lines).
template <>
struct ElementOf<DType::kFloat> {
  using type = float;
};

using ElementAcc = float;
using ElementCompute = float;
// Elements per 16 bytes: TMA rows and the bias vector load.
template <class Element>
constexpr int kAlign16 = 16 / static_cast<int>(sizeof(Element));
// fp32 outputs get the accurate activations of activation.h; 16-bit outputs the approximate ones
// (fast:: below), whose error their rounding hides.
template <class Element>
constexpr bool kFastActivations = sizeof(Element) == 2;

// ------------------------------------------------------------------------------------------------
// Device activations for the epilogue, with the contract's formulas (activation.h) but the
// GPU's approximate exp / reciprocal / tanh (ex2, rcp, tanh.approx): output is 16-bit, and the accurate libm paths (IEEE
// division, expf) made SiLU cost 2.5x the whole identity kernel on the anchor layers.
namespace fast {
// sigmoid and SiLU with one MUFU instruction instead of exp + reciprocal (activation.h says why):
// SiLU was +20..60 us over identity on YOLOv8s's batch-32 layers.
using act::sigmoid_16bit;
using act::tanh_approx;
using Silu = act::Silu16bit;
CUTLASS_DEVICE float softplus(float x) { return fmaxf(x, 0.f) + log1pf(__expf(-fabsf(x))); }
struct Sigmoid {
  CUTLASS_DEVICE float operator()(float x) const { return sigmoid_16bit(x); }
};
struct Tanh {
  CUTLASS_DEVICE float operator()(float x) const { return tanh_approx(x); }
};
struct HardSigmoid {
  float alpha, beta;
  CUTLASS_DEVICE float operator()(float x) const { return fminf(fmaxf(fmaf(alpha, x, beta), 0.f), 1.f); }
};
struct HardSwish {
  CUTLASS_DEVICE float operator()(float x) const { return x * fminf(fmaxf(fmaf(x, 1.f / 6.f, 0.5f), 0.f), 1.f); }
};
struct Gelu {
  CUTLASS_DEVICE float operator()(float x) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  CUTLASS_DEVICE float operator()(float x) const {
    return 0.5f * x * (1.f + tanh_approx(0.79788456080286536f * fmaf(0.044715f * x, x * x, x)));
  }
};
struct Mish {
  CUTLASS_DEVICE float operator()(float x) const { return x * tanh_approx(softplus(x)); }
};
struct Elu {
  float alpha;
  CUTLASS_DEVICE float operator()(float x) const { return x > 0.f ? x : alpha * expm1f(x); }
};
struct Softplus {
  CUTLASS_DEVICE float operator()(float x) const { return softplus(x); }
};

}  // namespace fast

// The device functor of activation kind K, with the node's parameters: for 16-bit outputs (kFast) the
// approximate ones above where they differ, for fp32 outputs activation.h's (sigmoid with __expf and a
// 2-ulp division, tanhf, erff).
template <bool kFast, class Fast, class Accurate>
using Pick = std::conditional_t<kFast, Fast, Accurate>;
template <ActivationKind K, bool kFast>
CUTLASS_DEVICE auto activation(act::Runtime const& a) {
  if constexpr (K == ActivationKind::kIdentity) return act::Identity{};
  else if constexpr (K == ActivationKind::kRelu) return act::Relu{};
  else if constexpr (K == ActivationKind::kLeakyRelu) return act::LeakyRelu{a.p0};
  else if constexpr (K == ActivationKind::kClip) return act::Clip{a.p0, a.p1};
  else if constexpr (K == ActivationKind::kSigmoid) return Pick<kFast, fast::Sigmoid, act::Sigmoid>{};
  else if constexpr (K == ActivationKind::kTanh) return Pick<kFast, fast::Tanh, act::Tanh>{};
  else if constexpr (K == ActivationKind::kSilu) return Pick<kFast, fast::Silu, act::Silu>{};
  else if constexpr (K == ActivationKind::kHardSigmoid)
    return Pick<kFast, fast::HardSigmoid, act::HardSigmoid>{a.p0, a.p1};
  else if constexpr (K == ActivationKind::kHardSwish) return Pick<kFast, fast::HardSwish, act::HardSwish>{};
  else if constexpr (K == ActivationKind::kGelu) return Pick<kFast, fast::Gelu, act::Gelu>{};
  else if constexpr (K == ActivationKind::kGeluTanh) return Pick<kFast, fast::GeluTanh, act::GeluTanh>{};
  else if constexpr (K == ActivationKind::kMish) return Pick<kFast, fast::Mish, act::Mish>{};
  else if constexpr (K == ActivationKind::kElu) return Pick<kFast, fast::Elu, act::Elu>{a.p0};
  else return Pick<kFast, fast::Softplus, act::Softplus>{};
}

// Which activations an instantiation's epilogue carries. AnyActivation: all 14, chosen at run time,
// one switch per fragment, so one kernel serves every node. Its code costs registers (168 in the
// 128x64 conv); a SiLU-only policy measured 124, but __launch_bounds__(256, 2) fits this one in 128
// without spills (the _2cta kernels). Registers are not its cost: its code is (ActivationSet below).
// Calls f(functor).
struct AnyActivation {
  static constexpr bool contains(ActivationKind) { return true; }

  template <bool kFast, class F>
  CUTLASS_DEVICE static auto dispatch(act::Runtime const& a, F&& f) {
    switch (a.kind) {
      case ActivationKind::kIdentity: return f(activation<ActivationKind::kIdentity, kFast>(a));
      case ActivationKind::kRelu: return f(activation<ActivationKind::kRelu, kFast>(a));
      case ActivationKind::kLeakyRelu: return f(activation<ActivationKind::kLeakyRelu, kFast>(a));
      case ActivationKind::kClip: return f(activation<ActivationKind::kClip, kFast>(a));
      case ActivationKind::kSigmoid: return f(activation<ActivationKind::kSigmoid, kFast>(a));
      case ActivationKind::kTanh: return f(activation<ActivationKind::kTanh, kFast>(a));
      case ActivationKind::kSilu: return f(activation<ActivationKind::kSilu, kFast>(a));
      case ActivationKind::kHardSigmoid: return f(activation<ActivationKind::kHardSigmoid, kFast>(a));
      case ActivationKind::kHardSwish: return f(activation<ActivationKind::kHardSwish, kFast>(a));
      case ActivationKind::kGelu: return f(activation<ActivationKind::kGelu, kFast>(a));
      case ActivationKind::kGeluTanh: return f(activation<ActivationKind::kGeluTanh, kFast>(a));
      case ActivationKind::kMish: return f(activation<ActivationKind::kMish, kFast>(a));
      case ActivationKind::kElu: return f(activation<ActivationKind::kElu, kFast>(a));
      case ActivationKind::kSoftplus: return f(activation<ActivationKind::kSoftplus, kFast>(a));
    }
    return f(act::Identity{});
  }
};

// ActivationSet<kinds...>: an epilogue that carries only these activations. On the H200 the 14-way
// switch cost the 1x1 GEMM a tenth of its time (r50.s1.1x1up, SiLU: 36.6 µs with all 14, 33.7 with
// Identity/Relu/SiLU, 30.8 with SiLU alone; ncu: "no instruction" stalls 1.8 -> 0.4 per issue, i.e.
// instruction-cache misses), so the hot kernels carry two. The host checks membership before
// launch (contains(); the rules list the same kinds); dispatch never sees another kind.
template <ActivationKind... Kinds>
struct ActivationSet {
  static constexpr bool contains(ActivationKind k) { return ((k == Kinds) || ...); }

  template <bool kFast, class F>
  CUTLASS_DEVICE static auto dispatch(act::Runtime const& a, F&& f) {
    return pick<kFast, Kinds...>(a, f);
  }

 private:
  template <bool kFast, ActivationKind First, ActivationKind... Rest, class F>
  CUTLASS_DEVICE static auto pick(act::Runtime const& a, F& f) {
    if constexpr (sizeof...(Rest) == 0) {
      return f(activation<First, kFast>(a));
    } else {
      if (a.kind == First) return f(activation<First, kFast>(a));
      return pick<kFast, Rest...>(a, f);
    }
  }
};

// ------------------------------------------------------------------------------------------------
// The compute node's functor. Sm90Compute takes `ComputeFn<ElementCompute>::Arguments` as the
// node's runtime arguments and calls `ComputeFn<Array<ElementCompute, N>>{}(inputs..., args)`
// (sm90_visitor_compute_tma_warpspecialized.hpp), so both carry the same Arguments type.
template <class T, class Acts, bool kFast>
struct FusedEpilogueFn {
  using Arguments = Epilogue;
  CUTLASS_DEVICE T operator()(T const& acc, T const& bias, T const& z, Arguments const& e) const {
    return e(acc, bias, z);
  }
};

// The activation and residual switches are taken once per fragment, not per element: each
// (activation, residual) pair gets its own straight-line loop (a per-element switch made the
// epilogue several times slower on the H200).
template <int N, class Acts, bool kFast>
struct FusedEpilogueFn<cutlass::Array<float, N>, Acts, kFast> {
  using Arguments = Epilogue;
  using Frag = cutlass::Array<float, N>;

  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& bias, Frag const& z, Arguments const& e) const {
    const Residual residual = e.residual;
    return Acts::template dispatch<kFast>(e.activation, [&](auto act) {
      Frag out;
      // z holds whatever the registers hold when no residual is loaded; it is never read then.
      if (residual == Residual::kNone) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) out[i] = act(acc[i] + bias[i]);
      } else if (residual == Residual::kPre) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) out[i] = act(acc[i] + bias[i] + z[i]);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) out[i] = act(acc[i] + bias[i]) + z[i];
      }
      return out;
    });
  }
};

template <class Acts, bool kFast>
struct EpilogueFnOf {
  template <class T>
  using Fn = FusedEpilogueFn<T, Acts, kFast>;
};

// ------------------------------------------------------------------------------------------------
// Source (C = residual) fetch whose TMA load is switched at run time. Sm90SrcFetch always asks
// for C when its element type is not void; this node asks only when `enabled`, so a problem
// without a residual never reads C (the C descriptor then points at D and is never used).
template <class Element>
struct ResidualFetch : cutlass::epilogue::fusion::Sm90SrcFetch<Element> {
  using Base = cutlass::epilogue::fusion::Sm90SrcFetch<Element>;
  struct SharedStorage {};
  struct Arguments {
    bool enabled = false;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE ResidualFetch() : params() {}
  CUTLASS_HOST_DEVICE ResidualFetch(Params const& p, SharedStorage const&) : params(p) {}

  Params const params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return params.enabled; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return params.enabled; }
  CUTLASS_DEVICE bool is_zero() const { return !params.enabled; }
};

// The per-output-channel bias: a broadcast along the GEMM's N (output channels are its columns, the
// usual orientation) or, with kChannelRows (the GEMM computes Y^T: channels are its rows), along M.
template <class CtaTile, class ElementOut, bool kChannelRows = false>
using BiasBroadcast = std::conditional_t<
    kChannelRows,
    cutlass::epilogue::fusion::Sm90ColBroadcast<0, CtaTile, ElementOut, ElementCompute,
                                                cute::Stride<cute::_1, cute::_0, int64_t>, kAlign16<ElementOut>>,
    cutlass::epilogue::fusion::Sm90RowBroadcast<0, CtaTile, ElementOut, ElementCompute,
                                                cute::Stride<cute::_0, cute::_1, int64_t>, kAlign16<ElementOut>>>;

// The FusedConv EVT for a CTA tile.
template <class CtaTile, class ElementOut, class Acts, bool kChannelRows = false>
using FusedEvt = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<EpilogueFnOf<Acts, kFastActivations<ElementOut>>::template Fn, ElementOut,
                                           ElementCompute,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast<CtaTile, ElementOut, kChannelRows>,
    ResidualFetch<ElementOut>>;

// The tree without the residual: D = act(acc + bias[k]). With it the epilogue has no C operand
// (ElementC = void), so CUTLASS allocates no C buffers and delays each TMA store by one sub-tile
// (DelayTmaStore), overlapping it with the next sub-tile's math: for the memory-bound 1x1 GEMMs.
template <class T, class Acts, bool kFast>
struct BiasActFn {
  using Arguments = Epilogue;
  CUTLASS_DEVICE T operator()(T const& acc, T const& bias, Arguments const& e) const { return e(acc, bias, 0.f); }
};
template <int N, class Acts, bool kFast>
struct BiasActFn<cutlass::Array<float, N>, Acts, kFast> {
  using Arguments = Epilogue;
  using Frag = cutlass::Array<float, N>;
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& bias, Arguments const& e) const {
    return Acts::template dispatch<kFast>(e.activation, [&](auto act) {
      Frag out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) out[i] = act(acc[i] + bias[i]);
      return out;
    });
  }
};
template <class Acts, bool kFast>
struct BiasActFnOf {
  template <class T>
  using Fn = BiasActFn<T, Acts, kFast>;
};
template <class CtaTile, class ElementOut, class Acts, bool kChannelRows = false>
using BiasActEvt = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<BiasActFnOf<Acts, kFastActivations<ElementOut>>::template Fn, ElementOut,
                                           ElementCompute,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast<CtaTile, ElementOut, kChannelRows>>;
template <class Evt, class ElementOut>
typename Evt::Arguments bias_act_evt_arguments(const ConvProblem& p, const Tensors& t) {
  return typename Evt::Arguments{
      {},                                                        // acc
      {static_cast<ElementOut const*>(t.b), ElementOut(0), {}},  // bias[k]
      Epilogue::of(p)};                                          // act
}

// Runtime arguments of FusedEvt (children in order, then the node's own).
template <class Evt, class ElementOut>
typename Evt::Arguments fused_evt_arguments(const ConvProblem& p, const Tensors& t) {
  return typename Evt::Arguments{
      {},                                                               // acc
      {static_cast<ElementOut const*>(t.b), ElementOut(0), {}},         // bias[k]
      {p.attr.residual != Residual::kNone && t.z != nullptr},           // residual load
      Epilogue::of(p)};                                                 // act + residual mode
}

// ------------------------------------------------------------------------------------------------
// The current device and its SM count (0 when CUDA cannot say: CUTLASS then queries it itself).
inline cutlass::KernelHardwareInfo hardware_info() {
  cutlass::KernelHardwareInfo hw;
  if (!current_device_sms(&hw.device_id, &hw.sm_count)) hw.device_id = hw.sm_count = 0;
  return hw;
}

inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// TMA needs 16-byte aligned base addresses; the rules cannot see pointers, so check here.
inline Status check_pointers(const char* kernel, const ConvProblem& p, const Tensors& t) {
  if (!aligned16(t.x) || !aligned16(t.w) || !aligned16(t.b) || !aligned16(t.y) ||
      (p.attr.residual != Residual::kNone && !aligned16(t.z)))
    return Status::Error(std::string(kernel) + ": X, W, B, Z and Y must be 16-byte aligned (TMA)");
  if (p.attr.residual != Residual::kNone && t.z == nullptr)
    return Status::Error(std::string(kernel) + ": residual '" + residual_name(p.attr.residual) + "' without Z");
  return Status::Ok();
}

// The node's activation must be one the kernel's epilogue carries (Acts: AnyActivation, ActivationSet).
template <class Acts>
Status check_activation(const char* kernel, const ConvProblem& p) {
  const ActivationKind k = p.attr.activation.kind;
  if (Acts::contains(k)) return Status::Ok();
  return Status::Error(std::string(kernel) + ": activation " + activation_table()[static_cast<size_t>(k)].name +
                       " is not in this kernel's epilogue");
}

inline Status check_cutlass(const char* kernel, const char* step, cutlass::Status s) {
  if (s == cutlass::Status::kSuccess) return Status::Ok();
  return Status::Error(std::string(kernel) + ": CUTLASS " + step + ": " + cutlass::cutlassGetStatusString(s));
}

// can_implement -> workspace check -> initialize (host: TMA descriptors) -> launch(op) on `stream`.
template <class Op, class Launch>
Status run_op(const char* kernel, typename Op::Arguments const& args, void* workspace, size_t workspace_bytes,
              cudaStream_t stream, Launch launch) {
  EPIFUSE_RETURN_IF_ERROR(check_cutlass(kernel, "can_implement", Op::can_implement(args)));
  const size_t need = Op::get_workspace_size(args);
  if (need > workspace_bytes)
    return Status::Error(std::string(kernel) + ": workspace of " + std::to_string(workspace_bytes) +
                         " bytes, needs " + std::to_string(need));
  Op op;
  EPIFUSE_RETURN_IF_ERROR(check_cutlass(kernel, "initialize", op.initialize(args, workspace, stream)));
  EPIFUSE_RETURN_IF_ERROR(check_cutlass(kernel, "run", launch(op)));
  return check_launch(kernel, cudaGetLastError());
}

// Whether this translation unit's kernels contain CUTLASS's griddepcontrol waits (sources.cmake
// defines CUTLASS_ENABLE_GDC_FOR_SM90; a kernel built without it must never be a PDL launch).
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
constexpr bool kGridDependencyControl = true;
#else
constexpr bool kGridDependencyControl = false;
#endif

// Launch as a programmatic dependent (kernel_api.h) when asked to and this TU's kernels wait. Static:
// the answer differs between translation units, so each needs its own copy (an inline function would
// let the linker pick one for all).
static inline bool launch_with_pdl() { return kGridDependencyControl && programmatic_launch_enabled(); }

// For programmatic dependent launch (kernel_api.h): CUTLASS's SM90 GEMM kernels wait for the prior
// grid themselves (built with CUTLASS_ENABLE_GDC_FOR_SM90); its conv kernel does not, so this
// subclass waits at entry, then lets the next kernel on the stream be scheduled (its CTAs fill SMs
// this grid's last wave leaves idle, and wait in turn). Both are no-ops without a PDL launch.
template <class Kernel>
struct WaitsForPriorGrid : Kernel {
  CUTLASS_DEVICE void operator()(typename Kernel::Params const& params, char* smem) {
    cutlass::arch::wait_on_dependent_grids();
    cutlass::arch::launch_dependent_grids();
    Kernel::operator()(params, smem);
  }
};

// A CUTLASS kernel whose cutlass::device_kernel launch bounds ask for `kMinBlocks` CTAs per SM
// (CUTLASS's kernels say 1; -maxrregcount cannot override __launch_bounds__).
template <class Kernel, uint32_t kMinBlocks>
struct WithMinBlocksPerSm : Kernel {
  static constexpr uint32_t MinBlocksPerMultiprocessor = kMinBlocks;
};

// Per-SM shared memory of sm_90 (228 KiB) shared by two CTAs, less 1 KiB the hardware reserves
// per CTA: the budget of a configuration that must fit twice per SM.
constexpr int kTwoCtaSmemBytes = 233472 / 2 - 1024;
// The most dynamic shared memory one CTA may have on sm_90 (227 KiB).
constexpr int kSm90SmemBytes = 232448;

}  // namespace epifuse::cuda::sm90

// Defines `KernelImpl FN()` for registry kernel NAME, implemented by CONFIG (a ConvConfig or a
// GemmConfig: both provide workspace_size(p) and launch(name, p, t, ws, ws_bytes, stream)).
#define SM90_KERNEL(FN, NAME, ...)                                                                       \
  namespace epifuse::cuda {                                                                              \
  namespace {                                                                                            \
  using FN##_cfg = __VA_ARGS__;                                                                          \
  size_t FN##_ws(const ConvProblem& p) { return FN##_cfg::workspace_size(p); }                          \
  Status FN##_launch(const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes, cudaStream_t s) { \
    return FN##_cfg::launch(NAME, p, t, ws, ws_bytes, s);                                                \
  }                                                                                                      \
  }                                                                                                      \
  KernelImpl FN() { return {NAME, FN##_ws, FN##_launch}; }                                               \
  }
