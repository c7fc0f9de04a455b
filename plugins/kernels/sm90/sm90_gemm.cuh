// 1x1, stride-1, pad-0, group-1 convs as a plain GEMM with CUTLASS 3.x SM90 GemmUniversal (TMA +
// WGMMA, persistent warp-specialized cooperative or ping-pong kernels) and the same runtime FusedConv
// EVT epilogue (sm90_common.cuh):
//   Y[N*H*W, K] = X[N*H*W, C] x W[K, C]^T     (NHWC X is a row-major [M, C] matrix; the KRSC filter
//   of a 1x1 conv is a row-major [K, C] matrix = a column-major [C, K] B operand; Y, Z row-major [M, K]).
// Dilation does not matter when R = S = 1. One instantiation per .cu file (SM90_GEMM_KERNEL).
#pragma once
#include <type_traits>

#include "sm90_common.cuh"

#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/util/packed_stride.hpp"

namespace epifuse::cuda::sm90 {

struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

// Scheduler: void = the persistent data-parallel scheduler (one CTA per output tile, looping);
// cutlass::gemm::StreamKScheduler = stream-K / split-K chosen by CUTLASS's heuristic per problem, for
// problems with fewer output tiles than SMs and a long K loop (batch 1: M = 49..400 rows,
// C = 512..2048), where the data-parallel grid leaves most SMs idle. Its partial sums are reduced
// in the workspace before the fused epilogue runs, so the epilogue sees full accumulators. (A 128x64
// split-K instance with our own split count never won a layer of the five models on the H200, where
// the 64-row convs took the batch-1 1x1s, and was dropped.)

// Whether the epilogue reads a residual Z (FusedEvt) or has no C operand at all (BiasActEvt: no C
// buffers, TMA stores delayed by one sub-tile); the latter serves only problems without a residual.
struct WithResidual {
  static constexpr bool kResidual = true;
};
struct NoResidual {
  static constexpr bool kResidual = false;
};

// Acts: the activations the epilogue carries (sm90_common.cuh). EpiTile: the sub-tile the epilogue
// stores at a time; 128x64 beat CUTLASS's auto 128x32 (half the barriers per tile: r50.s1.1x1up 40.7 -> 36.6 µs).
// kStoreStages: 0 = CUTLASS's epilogue policy (2 store buffers; with a residual the D buffers reuse
// C's and only one TMA store is in flight while the next sub-tile is written); N > 0 = N buffers of
// their own, N - 1 stores in flight (needs a concrete EpiTile).
// kChannelRows: compute Y^T = W X^T instead (GEMM rows = output channels, columns = pixels; A = W, B = X,
// D column-major, which is Y's NHWC memory). cuBLAS runs the small-pixel-count 1x1s this way with
// tiles whose count matches the SM count (a 96- or 224-pixel side: nvjet_sm90_hsh_128x96_64x7_1x2 for
// ResNet-50's 14x14 1024->256 at batch 32), which the 64-row granularity of WGMMA's M does not allow
// along the pixels.
template <DType kDType, class Tile, class Cluster, class Schedule, class Scheduler = void,
          class Acts = AnyActivation, class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto,
          class Source = WithResidual, int kStoreStages = 0, bool kChannelRows = false>
struct GemmConfig {
  static constexpr bool kResidual = Source::kResidual;
  using Element = typename ElementOf<kDType>::type;
  using ElementC = std::conditional_t<kResidual, Element, void>;
  using Evt = std::conditional_t<kResidual, FusedEvt<Tile, Element, Acts, kChannelRows>,
                                 BiasActEvt<Tile, Element, Acts, kChannelRows>>;
  // Both orientations read their operands K-major: X [M, C] and W [K, C] are row-major [rows, C].
  using LayoutA = cutlass::layout::RowMajor;     // X [M, C] (kChannelRows: W [K, C])
  using LayoutB = cutlass::layout::ColumnMajor;  // W [K, C] == B [C, K] column-major (kChannelRows: X)
  using LayoutC = std::conditional_t<kChannelRows, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;  // Y, Z [M, K] (kChannelRows: Y^T [K, M])

  struct BuiltEpilogue {
    using type = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, ElementAcc, ElementCompute,
        ElementC, LayoutC, kAlign16<Element>, Element, LayoutC, kAlign16<Element>, typename Schedule::Epilogue,
        Evt>::CollectiveOp;
  };
  struct StagedEpilogue {
    static constexpr int kThreads = std::is_same_v<Schedule, Cooperative> ? 256 : 128;
    using Policy = cutlass::epilogue::Sm90TmaWarpSpecialized<kStoreStages, kStoreStages,
                                                             int(cute::size(EpiTile{})) / kThreads,
                                                             /*ReuseSmemC=*/false, /*DelayTmaStore=*/!kResidual>;
    using type = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
        Tile, EpiTile, ElementAcc, ElementCompute, ElementC, LayoutC, kAlign16<Element>, Element, LayoutC,
        kAlign16<Element>, Evt, Policy>::CollectiveOp;
  };
  using Epilogue = typename std::conditional_t<kStoreStages == 0, BuiltEpilogue, StagedEpilogue>::type;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, LayoutA, kAlign16<Element>, Element, LayoutB, kAlign16<Element>, ElementAcc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Schedule::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The GEMM's (M, N, K): pixels x channels x C, or channels x pixels x C with kChannelRows.
  static cute::Shape<int, int, int, int> gemm_shape(const ConvProblem& p) {
    const int pixels = static_cast<int>(p.N * p.H * p.W), channels = static_cast<int>(p.K), C = static_cast<int>(p.C);
    return kChannelRows ? cute::make_shape(channels, pixels, C, 1) : cute::make_shape(pixels, channels, C, 1);
  }

  static typename Op::Arguments arguments(const ConvProblem& p, const Tensors& t) {
    const auto shape = gemm_shape(p);
    const int M = cute::get<0>(shape), N = cute::get<1>(shape), K = cute::get<2>(shape);
    auto dA = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(M, K, 1));
    auto dB = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(N, K, 1));
    auto dC = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(M, N, 1));
    auto dD = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(M, N, 1));
    auto* y = static_cast<Element*>(t.y);
    auto const* x = static_cast<Element const*>(t.x);
    auto const* w = static_cast<Element const*>(t.w);
    using Callbacks = typename Epilogue::FusionCallbacks;
    typename Op::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                shape,
                                {kChannelRows ? w : x, dA, kChannelRows ? x : w, dB},
                                {},
                                hardware_info()};
    if constexpr (kResidual) {
      // Without a residual C is never loaded (ResidualFetch); its TMA descriptor gets D's address.
      const bool residual = p.attr.residual != Residual::kNone && t.z != nullptr;
      auto const* c = residual ? static_cast<Element const*>(t.z) : y;
      args.epilogue = {fused_evt_arguments<Callbacks, Element>(p, t), c, dC, y, dD};
    } else {
      args.epilogue = {bias_act_evt_arguments<Callbacks, Element>(p, t), nullptr, dC, y, dD};
    }
    return args;
  }

  static size_t workspace_size(const ConvProblem& p) {
    typename Op::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, gemm_shape(p), {}, {}, hardware_info()};
    return Op::get_workspace_size(args);
  }

  static Status launch(const char* name, const ConvProblem& p, const Tensors& t, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
    if (p.dtype != kDType) return Status::Error(std::string(name) + ": wrong dtype " + dtype_name(p.dtype));
    const auto& a = p.attr;
    if (p.R != 1 || p.S != 1 || a.stride_h != 1 || a.stride_w != 1 || a.pad_top || a.pad_left || a.pad_bottom ||
        a.pad_right || a.group != 1)
      return Status::Error(std::string(name) + ": not a 1x1, stride-1, unpadded, group-1 conv");
    if (!kResidual && a.residual != Residual::kNone)
      return Status::Error(std::string(name) + ": this kernel's epilogue has no residual input");
    EPIFUSE_RETURN_IF_ERROR(check_activation<Acts>(name, p));
    EPIFUSE_RETURN_IF_ERROR(check_pointers(name, p, t));
    return run_op<Op>(name, arguments(p, t), workspace, workspace_bytes, stream,
                      [&](Op& op) { return op.run(stream, nullptr, launch_with_pdl()); });
  }
};

}  // namespace epifuse::cuda::sm90

// Defines `KernelImpl FN()` for registry kernel NAME = GemmConfig<...>.
#define SM90_GEMM_KERNEL(FN, NAME, ...) SM90_KERNEL(FN, NAME, sm90::GemmConfig<__VA_ARGS__>)
