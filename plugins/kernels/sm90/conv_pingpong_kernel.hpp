// A persistent ping-pong kernel for CUTLASS's SM90 implicit-GEMM conv mainloop.
//
// Why: CUTLASS 4.2 runs its SM90 conv only as a non-persistent kernel (one output tile per CTA;
// dispatch_policy.hpp static_asserts "Persistent schedules not support for conv yet"). A 3x3 conv
// with C = 64 has 9 k-steps per tile, so pipeline fill and the epilogue cost as much as the MMAs.
// cuDNN's kernel for the same layer (ncu, H200: sm90_xmma_fprop_implicit_gemm..._tilesize128x64x64)
// moves the same bytes L2->SM and issues the same tensor instructions, but runs one persistent CTA
// per SM with two consumer warp groups: one's epilogue overlaps the other's mainloop. This is that
// schedule: CUTLASS's GEMM ping-pong kernel (gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp,
// BSD-3-Clause, NVIDIA) with the conv problem-shape handling of its non-persistent kernel
// (sm90_gemm_tma_warpspecialized.hpp: linearized M, no L mode) and the static persistent scheduler
// only. The mainloop and epilogue collectives are CUTLASS's, unchanged: build them exactly as for the
// non-persistent kernel (KernelImplicitTmaWarpSpecializedSm90, epilogue TmaWarpSpecialized); each
// consumer warp group runs the whole tile, as there.
#pragma once

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/fast_math.h"
#include "cute/arch/cluster_sm90.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/arch/mma_sm90.h"
#include "cutlass/conv/detail.hpp"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/arch/grid_dependency_control.h"
#include "cute/tensor.hpp"

namespace epifuse::cuda::sm90 {

template <class ProblemShape_, class CollectiveMainloop_, class CollectiveEpilogue_>
class ConvPingpongKernel {
 public:
  using ProblemShape = ProblemShape_;  // cutlass::conv::ConvProblemShape

  using CollectiveMainloop = CollectiveMainloop_;
  using TileShape = typename CollectiveMainloop::TileShape;
  using TiledMma = typename CollectiveMainloop::TiledMma;
  using ArchTag = typename CollectiveMainloop::ArchTag;
  using ElementA = typename CollectiveMainloop::ElementA;
  using StrideA = typename CollectiveMainloop::StrideA;
  using ElementB = typename CollectiveMainloop::ElementB;
  using StrideB = typename CollectiveMainloop::StrideB;
  using DispatchPolicy = typename CollectiveMainloop::DispatchPolicy;
  using ElementAccumulator = typename CollectiveMainloop::ElementAccumulator;
  using ClusterShape = typename DispatchPolicy::ClusterShape;
  using MainloopArguments = typename CollectiveMainloop::Arguments;
  using MainloopParams = typename CollectiveMainloop::Params;
  static_assert(ArchTag::kMinComputeCapability >= 90);

  using CollectiveEpilogue = CollectiveEpilogue_;
  using ElementC = typename CollectiveEpilogue::ElementC;
  using StrideC = typename CollectiveEpilogue::StrideC;
  using ElementD = typename CollectiveEpilogue::ElementD;
  using StrideD = typename CollectiveEpilogue::StrideD;
  using EpilogueArguments = typename CollectiveEpilogue::Arguments;
  using EpilogueParams = typename CollectiveEpilogue::Params;

  using TileScheduler = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  using TileSchedulerArguments = typename TileScheduler::Arguments;
  using TileSchedulerParams = typename TileScheduler::Params;

  static constexpr uint32_t NumLoadWarpGroups = 1;
  static constexpr uint32_t NumMmaWarpGroups = 2;
  static constexpr uint32_t NumMMAThreads = cute::size(TiledMma{});
  static constexpr uint32_t MaxThreadsPerBlock =
      NumMMAThreads * NumMmaWarpGroups + NumLoadWarpGroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;
  static_assert(NumMMAThreads == 128, "each consumer warp group runs a whole tile");

  // As CUTLASS's ping-pong GEMM: the producer gives registers to the two math warp groups.
  static constexpr int RegsPerThread =
      (cute::size<0>(TileShape{}) * cute::size<1>(TileShape{}) * sizeof(ElementAccumulator)) /
      (NumMMAThreads * sizeof(uint32_t));
  static constexpr bool HeavyRegisterPressure = RegsPerThread >= 208;
  static constexpr uint32_t LoadRegisterRequirement = !HeavyRegisterPressure ? 40 : 24;
  static constexpr uint32_t MmaRegisterRequirement = !HeavyRegisterPressure ? 232 : 240;

  // The epilogue-load warp starts after the mainloop-load warp's first tile.
  using LoadWarpOrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;
  // Math warp groups take turns: one stage for the mainloop, one for the epilogue.
  static constexpr uint32_t StagesPerMathWarpGroup = 2;
  using MathWarpGroupOrderBarrier = cutlass::OrderedSequenceBarrier<StagesPerMathWarpGroup, NumMmaWarpGroups>;
  using MathWarpGroupOrderBarrierSharedStorage =
      cutlass::PipelineDetail::OrderedSequenceBarrierSharedStorage<MathWarpGroupOrderBarrier::SequenceDepth,
                                                                    MathWarpGroupOrderBarrier::SequenceLength>;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) MathWarpGroupOrderBarrierSharedStorage math_wg_order;
      alignas(16) typename LoadWarpOrderBarrier::SharedStorage load_order;
    } pipelines;

    // Unlike the non-persistent kernel, mainloop and epilogue run at once (different warp groups).
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);

  struct Arguments {
    ProblemShape problem_shape{};
    MainloopArguments mainloop{};
    EpilogueArguments epilogue{};
    cutlass::KernelHardwareInfo hw_info{};
    TileSchedulerArguments scheduler{};
  };

  // M = N*P*Q linearized, N = K, K = (C,S,R), L = 1 (the mainloop's im2col view).
  using ProblemShapeMNKL = decltype(CollectiveMainloop::get_problem_shape_MNKL(ProblemShape{}));

  struct Params {
    ProblemShapeMNKL problem_shape{};
    MainloopParams mainloop{};
    EpilogueParams epilogue{};
    cutlass::KernelHardwareInfo hw_info{};
    TileSchedulerParams scheduler{};
  };

  static Params to_underlying_arguments(Arguments const& args, void* workspace) {
    auto problem_shape_mnkl = CollectiveMainloop::get_problem_shape_MNKL(args.problem_shape);
    auto transformed_problem_shape = cutlass::conv::detail::get_transformed_problem_shape_MNKL(args.problem_shape);
    int sm_count = args.hw_info.sm_count;
    if (sm_count <= 0) sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(args.hw_info.device_id);
    cutlass::KernelHardwareInfo hw_info{args.hw_info.device_id, sm_count, args.hw_info.max_active_clusters};
    constexpr uint32_t kEpilogueSubTiles = CollectiveEpilogue::get_store_pipe_increment(TileShape{});
    return {problem_shape_mnkl,
            CollectiveMainloop::to_underlying_arguments(args.problem_shape, args.mainloop, workspace),
            CollectiveEpilogue::to_underlying_arguments(transformed_problem_shape, args.epilogue, workspace),
            hw_info,
            TileScheduler::to_underlying_arguments(problem_shape_mnkl, TileShape{}, ClusterShape{}, hw_info,
                                                   args.scheduler, nullptr, kEpilogueSubTiles)};
  }

  static bool can_implement(Arguments const& args) {
    auto transformed_problem_shape = cutlass::conv::detail::get_transformed_problem_shape_MNKL(args.problem_shape);
    return CollectiveMainloop::can_implement(args.problem_shape, args.mainloop) &&
           CollectiveEpilogue::can_implement(transformed_problem_shape, args.epilogue) &&
           TileScheduler::can_implement(args.scheduler);
  }

  // The static persistent scheduler and this epilogue need no workspace.
  static size_t get_workspace_size(Arguments const&) { return 0; }
  static cutlass::Status initialize_workspace(Arguments const&, void* = nullptr, cudaStream_t = nullptr,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  // One CTA per SM (or fewer, for small problems).
  static dim3 get_grid_shape(Params const& params) {
    TileSchedulerArguments args{};
    args.max_swizzle_size = 1 << params.scheduler.log_swizzle_size_;
    args.raster_order = params.scheduler.raster_order_ == TileScheduler::RasterOrder::AlongN
                            ? TileScheduler::RasterOrderOptions::AlongN
                            : TileScheduler::RasterOrderOptions::AlongM;
    return TileScheduler::get_grid_shape(params.scheduler, params.problem_shape, TileShape{}, ClusterShape{},
                                         params.hw_info, args);
  }

  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }

  CUTLASS_DEVICE
  void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum class WarpGroupRole { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    enum class ProducerWarpRole { Mainloop = 0, Warp1 = 1, Epilogue = 2, Warp3 = 3 };

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);

    int thread_idx = int(threadIdx.x);
    int lane_idx = cutlass::canonical_lane_idx();
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int warp_idx_in_warp_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    auto warp_group_role = WarpGroupRole(cutlass::canonical_warp_group_idx());
    auto producer_warp_role = ProducerWarpRole(warp_idx_in_warp_group);
    int lane_predicate = cute::elect_one_sync();
    uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if ((warp_idx == 0) && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Mainloop)
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1)
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = cutlass::NumThreadsPerWarpGroup;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Epilogue)
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1)
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = cute::block_rank_in_cluster();
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes)
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename LoadWarpOrderBarrier::Params params_load_order_barrier;
    params_load_order_barrier.group_id = producer_warp_role == ProducerWarpRole::Mainloop ? 0 : 1;
    params_load_order_barrier.group_size = cutlass::NumThreadsPerWarp;
    LoadWarpOrderBarrier load_order_barrier(shared_storage.pipelines.load_order, params_load_order_barrier);

    typename MathWarpGroupOrderBarrier::Params params_math_wg_order_barrier;
    params_math_wg_order_barrier.group_id =
        cutlass::canonical_warp_group_idx() - static_cast<int>(WarpGroupRole::Consumer0);
    params_math_wg_order_barrier.group_size = cutlass::NumThreadsPerWarpGroup;
    MathWarpGroupOrderBarrier math_wg_order_barrier(shared_storage.pipelines.math_wg_order,
                                                    params_math_wg_order_barrier);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    // Producers start with the opposite phase: every buffer is empty.
    cutlass::PipelineState mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    cutlass::PipelineState epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    cutlass::PipelineState epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    // Pipeline initialization must be visible to every CTA of the cluster before use.
    auto cluster_wait_fn = [&]() {
      if constexpr (size(ClusterShape{}) > 1) {
        cute::cluster_arrive_relaxed();
        return []() { cute::cluster_wait(); };
      } else {
        __syncthreads();
        return []() {};
      }
    }();

    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};

    CollectiveMainloop collective_mainloop;
    CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);

    // gA_mk: (BLK_M,BLK_K,m,k), gB_nk: (BLK_N,BLK_K,n,k); a conv has no L mode.
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    auto tile_coord = [&](auto const& work) {
      return make_coord(idx2crd(work.M_idx, shape<2>(gA_mkl)), idx2crd(work.N_idx, shape<2>(gB_nkl)), _, Int<0>{});
    };

    auto k_tile_count = size<3>(gA_mkl);
    auto c_tile_count = CollectiveEpilogue::get_load_pipe_increment(blk_shape);
    auto d_tile_count = CollectiveEpilogue::get_store_pipe_increment(blk_shape);

    TileScheduler scheduler{params.scheduler};
    if (warp_group_role == WarpGroupRole::Consumer1) {
      // The second math warp group starts on the CTA's second tile, and its pipeline states after
      // the first group's.
      scheduler.advance_to_next_work();
      mainloop_pipe_consumer_state.advance(k_tile_count);
      epi_load_pipe_consumer_state.advance(c_tile_count);
      epi_store_pipe_producer_state.advance(d_tile_count);
    }
    auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});

    cluster_wait_fn();

    if (warp_group_role == WarpGroupRole::Producer) {
      cutlass::arch::warpgroup_reg_dealloc<LoadRegisterRequirement>();
      if (producer_warp_role == ProducerWarpRole::Mainloop) {
        // Nothing of the prior grid's output may be read before it has finished.
        cutlass::arch::wait_on_dependent_grids();
        bool do_load_order_arrive = true;
        while (work_tile_info.is_valid()) {
          auto k_tile_iter = cute::make_coord_iterator(shape<3>(gA_mkl));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                   tile_coord(work_tile_info), k_tile_iter, k_tile_count, lane_idx,
                                   block_rank_in_cluster, shared_storage.tensors.mainloop);
          mainloop_pipe_producer_state.advance(k_tile_count);
          if (do_load_order_arrive) {
            load_order_barrier.arrive();
            do_load_order_arrive = false;
          }
          scheduler.advance_to_next_work();
          work_tile_info = scheduler.get_current_work();
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else if (producer_warp_role == ProducerWarpRole::Epilogue && collective_epilogue.is_producer_load_needed()) {
        cutlass::arch::wait_on_dependent_grids();
        bool do_load_order_wait = true;
        while (work_tile_info.is_valid()) {
          if (do_load_order_wait) {
            load_order_barrier.wait();
            do_load_order_wait = false;
          }
          epi_load_pipe_producer_state =
              collective_epilogue.load(epi_load_pipeline, epi_load_pipe_producer_state, problem_shape_MNKL, blk_shape,
                                       tile_coord(work_tile_info), tiled_mma, lane_idx, shared_storage.tensors.epilogue);
          scheduler.advance_to_next_work();
          work_tile_info = scheduler.get_current_work();
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
      }
    } else if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1) {
      cutlass::arch::warpgroup_reg_alloc<MmaRegisterRequirement>();
      while (work_tile_info.is_valid()) {
        auto blk_coord = tile_coord(work_tile_info);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));  // (MMA,MMA_M,MMA_N)

        // Mainloops in turn, so that one group's epilogue overlaps the other's MMAs.
        math_wg_order_barrier.wait();
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, k_tile_count,
                                warp_group_thread_idx, shared_storage.tensors.mainloop, params.mainloop);
        math_wg_order_barrier.arrive();
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, k_tile_count);
        mainloop_pipe_consumer_state.advance(k_tile_count * NumMmaWarpGroups);

        if (scheduler.is_last_tile(work_tile_info, NumMmaWarpGroups)) cutlass::arch::launch_dependent_grids();

        // Epilogues in turn too: they share the epilogue's shared memory.
        math_wg_order_barrier.wait();
        auto [epi_load_next, epi_store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
            problem_shape_MNKL, blk_shape, blk_coord, accumulators, tiled_mma, warp_group_thread_idx,
            shared_storage.tensors.epilogue);
        // TMA stores must finish before the other group may overwrite the staging buffers.
        auto [epi_load_after, epi_store_after] =
            collective_epilogue.store_tail(epi_load_pipeline, epi_load_next, epi_store_pipeline, epi_store_next);
        epi_load_pipe_consumer_state = epi_load_after;
        epi_store_pipe_producer_state = epi_store_after;
        epi_load_pipe_consumer_state.advance(c_tile_count);
        epi_store_pipe_producer_state.advance(d_tile_count);
        math_wg_order_barrier.arrive();

        scheduler.advance_to_next_work(NumMmaWarpGroups);
        work_tile_info = scheduler.get_current_work();
      }
    }
#else
    printf("ERROR: epifuse ConvPingpongKernel needs sm_90a.\n");
#endif
  }
};

}  // namespace epifuse::cuda::sm90
