// CUTLASS 3.x SM90 implicit-GEMM conv2d fprop (TMA im2col + WGMMA, KernelImplicitTmaWarpSpecializedSm90)
// with the runtime FusedConv EVT epilogue (sm90_common.cuh). X NHWC, W KRSC, Y/Z NHWC, fp32 accumulate.
// GEMM view: M = N*P*Q, N = K, K = R*S*C. One instantiation per .cu file (SM90_CONV_KERNEL).
#pragma once
#include "sm90_common.cuh"

#include "cutlass/conv/convolution.h"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"

#include "conv_pingpong_kernel.hpp"

namespace epifuse::cuda::sm90 {

// How output tiles map to CTAs. CUTLASS 4.2's own SM90 conv kernel is not persistent: one tile per
// CTA, one CTA per SM (kOneCta, the builder's automatic stage count fills shared memory) or two
// (kTwoCtas: a stage count that fits shared memory twice, kTwoCtaSmemBytes, and
// __launch_bounds__(threads, 2), which caps ptxas at 128 registers), so that one CTA's epilogue
// overlaps the other's mainloop. kPingpong: one persistent CTA per SM whose two math warp groups take
// turns (conv_pingpong_kernel.hpp), the schedule of cuDNN's Hopper conv kernels.
enum class ConvSchedule { kOneCta, kTwoCtas, kPingpong };

// Acts: the activations the epilogue carries (sm90_common.cuh).
template <DType kDType, class Tile, class Cluster, ConvSchedule kSchedule, class Acts = AnyActivation>
struct ConvConfig {
  static constexpr bool kTwoCtas = kSchedule == ConvSchedule::kTwoCtas;
  using Element = typename ElementOf<kDType>::type;
  using Layout = cutlass::layout::TensorNHWC;  // KRSC filters use the NHWC tag too

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute,
      Element, Layout, kAlign16<Element>,   // C = residual Z
      Element, Layout, kAlign16<Element>,   // D = Y
      cutlass::epilogue::TmaWarpSpecialized, FusedEvt<Tile, Element, Acts>>::CollectiveOp;

  static constexpr int kEpilogueSmem = static_cast<int>(sizeof(typename Epilogue::SharedStorage));
  static constexpr int kStageBytes =
      (cute::size<0>(Tile{}) + cute::size<1>(Tile{})) * cute::size<2>(Tile{}) * static_cast<int>(sizeof(Element));
  // 256 bytes for the pipeline barriers and the tensormap/scheduler bookkeeping.
  static constexpr int kTwoCtaStages = (kTwoCtaSmemBytes - kEpilogueSmem - 256) / kStageBytes;
  // The ping-pong kernel keeps the epilogue's buffers beside the mainloop's (no union) and adds two
  // order barriers.
  static constexpr int kCarveout = kEpilogueSmem + (kSchedule == ConvSchedule::kPingpong ? 256 : 0);
  using StageCount = cute::conditional_t<
      kTwoCtas, cutlass::conv::collective::StageCount<kTwoCtaStages>,
      cutlass::conv::collective::StageCountAutoCarveout<kCarveout>>;

  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
      Element, Layout, kAlign16<Element>, Element, Layout, kAlign16<Element>, ElementAcc, Tile, Cluster, StageCount,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop,
                                                       Mainloop::DispatchPolicy::NumSpatialDimensions>;
  // The ping-pong kernel waits for the prior grid itself (its load warps, before the first load).
  using Kernel = cute::conditional_t<
      kSchedule == ConvSchedule::kPingpong, ConvPingpongKernel<ProblemShape, Mainloop, Epilogue>,
      WaitsForPriorGrid<WithMinBlocksPerSm<cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>,
                                           kTwoCtas ? 2 : 1>>>;
  using Op = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static_assert(!kTwoCtas || kTwoCtaStages >= 3, "two CTAs per SM leave fewer than 3 stages");
  static_assert(!kTwoCtas || sizeof(typename Kernel::SharedStorage) <= kTwoCtaSmemBytes,
                "shared storage does not fit two CTAs per SM");
  static_assert(sizeof(typename Kernel::SharedStorage) <= kSm90SmemBytes, "shared storage exceeds one SM's");

  static ProblemShape problem_shape(const ConvProblem& p) {
    const auto& a = p.attr;
    return ProblemShape(cutlass::conv::Mode::kCrossCorrelation,
                        {int(p.N), int(p.H), int(p.W), int(p.C)},   // activation NHWC
                        {int(p.K), int(p.R), int(p.S), int(p.C)},   // filter KRSC
                        {int(a.pad_top), int(a.pad_left)},          // lower padding (h, w)
                        {int(a.pad_bottom), int(a.pad_right)},      // upper padding (h, w)
                        {int(a.stride_h), int(a.stride_w)},
                        {int(a.dil_h), int(a.dil_w)},
                        1);                                         // groups
  }

  static typename Op::Arguments arguments(const ConvProblem& p, const Tensors& t) {
    ProblemShape shape = problem_shape(p);
    // Output strides in the epilogue's ((Q,P,N),K,L) order, taken from the problem shape.
    typename Kernel::StrideC dC{};
    typename Kernel::StrideD dD{};
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideC{})>{}, [&](auto i) {
      cute::get<0, i>(dC) = shape.stride_C[ProblemShape::RankT - 2 - i];
      cute::get<0, i>(dD) = shape.stride_C[ProblemShape::RankT - 2 - i];
    });
    auto* y = static_cast<Element*>(t.y);
    // Without a residual C is never loaded (ResidualFetch), but initialize() still encodes a TMA
    // descriptor for it: give it D's valid address rather than null.
    const bool residual = p.attr.residual != Residual::kNone && t.z != nullptr;
    auto const* c = residual ? static_cast<Element const*>(t.z) : y;
    using Evt = typename Epilogue::FusionCallbacks;
    typename Op::Arguments args{
        shape,
        {static_cast<Element const*>(t.x), static_cast<Element const*>(t.w)},
        {fused_evt_arguments<Evt, Element>(p, t), c, dC, y, dD}};
    args.hw_info = hardware_info();
    return args;
  }

  static size_t workspace_size(const ConvProblem& p) {
    ProblemShape shape = problem_shape(p);
    typename Op::Arguments args{shape, {nullptr, nullptr}, {}};
    return Op::get_workspace_size(args);
  }

  static Status launch(const char* name, const ConvProblem& p, const Tensors& t, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
    if (p.dtype != kDType) return Status::Error(std::string(name) + ": wrong dtype " + dtype_name(p.dtype));
    if (p.attr.group != 1) return Status::Error(std::string(name) + ": group must be 1");
    EPIFUSE_RETURN_IF_ERROR(check_activation<Acts>(name, p));
    EPIFUSE_RETURN_IF_ERROR(check_pointers(name, p, t));
    return run_op<Op>(name, arguments(p, t), workspace, workspace_bytes, stream, [&](Op& op) {
      if (!launch_with_pdl()) return op.run(stream);
      // ConvUniversalAdapter::run has no PDL flag: its launch, with the attribute.
      typename Op::Params params = op.params();
      void* kernel_params[] = {&params};
      using ClusterShape = typename Kernel::DispatchPolicy::ClusterShape;
      const dim3 cluster(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), cute::size<2>(ClusterShape{}));
      return cutlass::ClusterLauncher::launch(Op::get_grid_shape(params), cluster, Kernel::get_block_shape(),
                                              Kernel::SharedStorageSize, stream,
                                              reinterpret_cast<void const*>(cutlass::device_kernel<Kernel>),
                                              kernel_params, /*launch_with_pdl=*/true);
    });
  }
};

}  // namespace epifuse::cuda::sm90

// Defines `KernelImpl FN()` for registry kernel NAME = ConvConfig<...>.
#define SM90_CONV_KERNEL(FN, NAME, ...) SM90_KERNEL(FN, NAME, sm90::ConvConfig<__VA_ARGS__>)
