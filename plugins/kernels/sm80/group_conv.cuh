// Grouped convolution (1 < group < C) on tensor cores with the FusedConv epilogue. CUTLASS 2.x has a
// group-mode mainloop (DefaultConv2dGroupFprop: analytic iterators that run over one group's input
// channels, then the next's) and the bias-broadcast epilogue (DefaultConv2dFpropWithBroadcast), but no
// kernel with both: its group kernel (conv/kernel/implicit_gemm_convolution.h) has a plain epilogue,
// and the broadcast kernel (conv/kernel/implicit_gemm_convolution_with_fused_epilogue.h) hard-codes
// GroupMode::kNone. GroupConvWithBroadcast is the broadcast kernel plus what group mode adds to the
// other: X's column offset of the CTA's first group and the GEMM-K iteration count over the CTA's
// groups (implicit_gemm_convolution.h, Params and operator()).
#pragma once
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d.h"
#include "cutlass/conv/kernel/default_conv2d_group_fprop.h"
#include "cutlass/conv/kernel/implicit_gemm_convolution_with_fused_epilogue.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {

// Split-K is not supported: CUTLASS's can_implement rejects it with groups (and the launcher never
// asks for it), so the CTA's K tile index is always 0.
template <typename Mma, typename Epilogue, typename Swizzle, cutlass::conv::GroupMode Mode>
struct GroupConvWithBroadcast
    : cutlass::conv::kernel::ImplicitGemmConvolutionWithFusedEpilogue<Mma, Epilogue, Swizzle,
                                                                        cutlass::conv::Operator::kFprop> {
  using Base = cutlass::conv::kernel::ImplicitGemmConvolutionWithFusedEpilogue<Mma, Epilogue, Swizzle,
                                                                                 cutlass::conv::Operator::kFprop>;
  using typename Base::Arguments;
  // What device::ImplicitGemmConvolution::can_implement checks the problem's groups against.
  static cutlass::conv::GroupMode const kGroupMode = Mode;

  struct Params : Base::Params {
    CUTLASS_HOST_DEVICE Params() {}
    CUTLASS_HOST_DEVICE Params(Arguments const& args, int* semaphore = nullptr) : Base::Params(args, semaphore) {
      // R * S * ceil((C / group) / tile K), times the groups of a CTA when K / group < tile N.
      this->gemm_k_iterations =
          cutlass::conv::implicit_gemm_k_iterations(cutlass::conv::Operator::kFprop, Mma::Shape::kK, args.problem_size,
                                                    Base::kIteratorAlgorithm, Mode, Mma::Shape::kN);
    }
  };

  CUTLASS_DEVICE
  void operator()(Params const& params, typename Base::SharedStorage& shared_storage) {
    Swizzle swizzle;
    cutlass::gemm::GemmCoord const tile = swizzle.get_tile_offset(params.swizzle_log_tile);
    if (params.grid_tiled_shape.m() <= tile.m() || params.grid_tiled_shape.n() <= tile.n()) return;

    // The CTA's output channels start in group n * tile N / (K / group), its input channels at that
    // group's first; the iterators move on to the CTA's next groups themselves.
    cutlass::conv::Conv2dProblemSize const& ps = params.problem_size;
    int const group = tile.n() * Mma::Shape::kN / (ps.K / ps.groups);
    int const thread_idx = threadIdx.x;
    typename Mma::IteratorA iterator_A(params.iterator_A, ps, params.ptr_A, thread_idx,
                                       cutlass::MatrixCoord(tile.m() * Mma::Shape::kM, group * (ps.C / ps.groups)));
    typename Mma::IteratorB iterator_B(params.iterator_B, ps, params.ptr_B, thread_idx,
                                       cutlass::MatrixCoord(0, tile.n() * Mma::Shape::kN));

    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const lane_idx = threadIdx.x % 32;
    Mma mma(shared_storage.main_loop, thread_idx, warp_idx, lane_idx);
    typename Mma::FragmentC accumulators;
    accumulators.clear();
    mma(params.gemm_k_iterations, accumulators, iterator_A, iterator_B, accumulators);

    // The broadcast kernel's epilogue, without its split-K paths.
    typename Base::EpilogueOutputOp output_op(params.output_op);
    cutlass::MatrixCoord const offset(tile.m() * Mma::Shape::kM, tile.n() * Mma::Shape::kN);
    auto const extent = Base::ConvOutputIteratorParameter::extent(ps);
    typename Epilogue::OutputTileIterator iterator_D(params.iterator_D, params.ptr_D, extent, thread_idx, offset);
    typename Epilogue::OutputTileIterator iterator_C(params.iterator_C, params.ptr_C, extent, thread_idx, offset);
    typename Epilogue::TensorTileIterator iterator_T(
        params.params_Tensor, static_cast<typename Epilogue::ElementTensor*>(params.ptr_Tensor), extent, thread_idx,
        offset);
    auto* vector = static_cast<typename Epilogue::ElementVector*>(params.ptr_Vector);
    if (vector) vector += offset.column() + tile.m() * params.ldr;
    Epilogue epilogue(shared_storage.epilogue, thread_idx, warp_idx, lane_idx);
    epilogue(output_op, vector, iterator_D, accumulators, iterator_C, iterator_T, extent, offset);
  }
};

// Name, Element, TileShape, WarpShape, InstShape and Stages as FusedConv's; the cp.async multistage
// mainloop (Stages > 2). X and W are read in 64-bit accesses: C / group a multiple of 4 (ResNeXt-50's
// first stage has 4 channels per group; cp.async copies 8 bytes through L1, which CUTLASS selects for
// accesses under 16). Y, Z and B go in accesses of kAlignC = min(8, tile N / 4) elements: CUTLASS's
// epilogue thread map gives each of a warp's 32 lanes its own access of an 8-row step only when a row
// has at least 4 of them (static_assert below).
// A GEMM-K step loads tile K input channels; where C / group is not a multiple of tile K, a group's last
// step also loads the next group's first channels, which the filter tile's zeros drop: only a
// non-finite X value (0 * inf) there reaches the outputs of the group before its own.
template <const char* Name, typename Element, typename TileShape, typename WarpShape, typename InstShape, int Stages>
struct GroupedConv {
  static constexpr int kAlignAB = 4;
  static constexpr int kAlignC = TileShape::kN / 4 < 8 ? TileShape::kN / 4 : 8;
  using EpilogueOp = FusedConvEpilogueOp<Element, kAlignC>;
  using Layout = cutlass::layout::TensorNHWC;
  using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>;
  static_assert(Stages > 2, "the group-mode kernels here use the multistage (cp.async) mainloop");

  // Only its Mma and its epilogue's shape are used.
  using GroupKernel = typename cutlass::conv::kernel::DefaultConv2dGroupFprop<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      TileShape, WarpShape, InstShape, EpilogueOp, Swizzle, Stages, cutlass::arch::OpMultiplyAdd,
      cutlass::conv::GroupMode::kMultipleGroup, cutlass::conv::IteratorAlgorithm::kAnalytic,
      cutlass::conv::StrideSupport::kStrided, kAlignAB, kAlignAB>::Kernel;
  using Mma = typename GroupKernel::Mma;
  // As DefaultConv2dFpropWithBroadcast builds its epilogue from the plain kernel's.
  using Epilogue = typename cutlass::conv::kernel::detail::DefaultConvEpilogueWithBroadcastTensorOp<
      cutlass::arch::Sm80, typename GroupKernel::Epilogue::Shape, typename GroupKernel::Epilogue::WarpMmaOperator,
      GroupKernel::Epilogue::kPartitionsK, Element, typename EpilogueOp::ElementT,
      typename EpilogueOp::ElementVector, EpilogueOp, GroupKernel::Epilogue::kElementsPerAccess>::Epilogue;

  // CUTLASS's thread maps divide a tile among the CTA's threads with integer divisions: shapes that do
  // not divide evenly compile, then leave part of a tile unread or unwritten.
  template <typename Map, int Rows, int Columns>
  static constexpr bool covers = Map::Iterations::kCount * Map::kThreads * Map::kElementsPerAccess == Rows * Columns;
  static_assert(covers<typename Mma::IteratorA::ThreadMap, TileShape::kM, TileShape::kK>, "A tile not covered");
  static_assert(covers<typename Mma::IteratorB::ThreadMap, TileShape::kK, TileShape::kN>, "B tile not covered");
  using OutputMap = typename Epilogue::OutputTileIterator::ThreadMap;
  static_assert(OutputMap::Detail::kAccessWidth * OutputMap::Detail::kAccessRows == 32 &&
                    OutputMap::Iterations::kColumn * OutputMap::Detail::kAccessWidth * kAlignC == TileShape::kN,
                "epilogue thread map does not give every lane its own part of the output tile");

  template <cutlass::conv::GroupMode Mode>
  using Kernel = GroupConvWithBroadcast<Mma, Epilogue, Swizzle, Mode>;
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel<cutlass::conv::GroupMode::kMultipleGroup>>;
  using SingleGroupConv =
      cutlass::conv::device::ImplicitGemmConvolution<Kernel<cutlass::conv::GroupMode::kSingleGroup>>;

  // CUTLASS's device can_implement checks one group mode per kernel type: kMultipleGroup needs
  // tile N % (K / group) == 0 (a CTA covers whole groups), kSingleGroup (K / group) % tile N == 0 (a
  // group covers whole CTAs) (device/implicit_gemm_convolution.h, "check group conv constraint"). The
  // kernel runs both alike (the group offset above, the analytic iterators and
  // implicit_gemm_k_iterations only tell kNone and kDepthwise from the rest), so the problem picks the
  // check, and only Conv's kernel is compiled.
  struct Check {
    static cutlass::Status can_implement(typename Conv::Arguments const& args) {
      cutlass::conv::Conv2dProblemSize const& ps = args.problem_size;
      if (ps.groups < 1 || ps.K % ps.groups != 0) return cutlass::Status::kErrorInvalidProblem;
      return TileShape::kN % (ps.K / ps.groups) == 0 ? Conv::can_implement(args)
                                                       : SingleGroupConv::can_implement(args);
    }
  };

  static KernelImpl impl() {
    return FusedConvLauncher<Name, Element, typename Conv::UnderlyingKernel, kAlignAB, kAlignC, Check>::impl();
  }
};

}  // namespace epifuse::cuda::sm80
