// One kernel of kernels.def in one dtype: the body of the translation units CMake generates
// (sources.cmake). A unit defines EPIFUSE_SM90_NAME (a kernels.def name), EPIFUSE_SM90_DTYPE (f16,
// bf16 or tf32) and EPIFUSE_SM90_GEMM_UNIT or EPIFUSE_SM90_CONV_UNIT, then includes this file, which turns
// the entry's columns into a GemmConfig / ConvConfig and defines `KernelImpl sm90_<dtype>_<name>()`.
// Every entry of the kind is declared as a type (cheap: nothing is instantiated until used), so a
// unit needs no parsing of its own.
// A unit may hold several kernels of one kind (EPIFUSE_CUDA_KERNELS_PER_UNIT): it includes this file
// once per kernel, redefining the name and dtype in between; everything above the instantiation is
// read once.
#ifndef EPIFUSE_SM90_MANIFEST_DECLARED
#define EPIFUSE_SM90_MANIFEST_DECLARED
#if defined(EPIFUSE_SM90_GEMM_UNIT)
#include "sm90_gemm.cuh"
#elif defined(EPIFUSE_SM90_CONV_UNIT)
#include "sm90_conv.cuh"
#else
#error "define EPIFUSE_SM90_GEMM_UNIT or EPIFUSE_SM90_CONV_UNIT before including instantiate.cuh"
#endif

// The manifest's column tokens as template arguments.
#define EPIFUSE_SM90_SCHEDULER_DATA_PARALLEL void
#define EPIFUSE_SM90_SCHEDULER_STREAMK cutlass::gemm::StreamKScheduler
#define EPIFUSE_SM90_ACTS_ANY sm90::AnyActivation
#define EPIFUSE_SM90_ACTS_RELU sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kRelu>
#define EPIFUSE_SM90_ACTS_SILU sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>
#define EPIFUSE_SM90_RESIDUAL_RESIDUAL sm90::WithResidual
#define EPIFUSE_SM90_RESIDUAL_NO_RESIDUAL sm90::NoResidual
#define EPIFUSE_SM90_EPI_EPI_AUTO cutlass::epilogue::collective::EpilogueTileAuto
#define EPIFUSE_SM90_EPI_EPI_128x64 cute::Shape<cute::_128, cute::_64>
#define EPIFUSE_SM90_ROWS_PIXEL_ROWS false
#define EPIFUSE_SM90_ROWS_CHANNEL_ROWS true
#define EPIFUSE_SM90_DTYPE_f16 DType::kFloat16
#define EPIFUSE_SM90_DTYPE_bf16 DType::kBFloat16
#define EPIFUSE_SM90_DTYPE_tf32 DType::kFloat

#if defined(EPIFUSE_SM90_GEMM_UNIT)
#define SM90_GEMM(name, tu, dtypes, tile_m, tile_n, tile_k, schedule, scheduler, acts, residual, epi, store_stages, \
                  rows, prefer)                                                                                 \
  struct name##_entry {                                                                                         \
    template <DType kDType>                                                                                     \
    using Config = sm90::GemmConfig<kDType, cute::Shape<cute::Int<tile_m>, cute::Int<tile_n>, cute::Int<tile_k>>, \
                                    cute::Shape<cute::_1, cute::_1, cute::_1>, sm90::schedule,                  \
                                    EPIFUSE_SM90_SCHEDULER_##scheduler, EPIFUSE_SM90_ACTS_##acts,               \
                                    EPIFUSE_SM90_EPI_##epi, EPIFUSE_SM90_RESIDUAL_##residual, store_stages,     \
                                    EPIFUSE_SM90_ROWS_##rows>;                                                  \
  };
#define SM90_CONV(...)
#else
#define SM90_GEMM(...)
#define SM90_CONV(name, tu, dtypes, tile_m, tile_n, tile_k, cluster_m, schedule, acts, prefer)                  \
  struct name##_entry {                                                                                         \
    template <DType kDType>                                                                                     \
    using Config = sm90::ConvConfig<kDType,                                                                     \
                                    cute::Shape<cute::Int<tile_m>, cute::Int<tile_n>, cute::Shape<cute::Int<tile_k>>>, \
                                    cute::Shape<cute::Int<cluster_m>, cute::_1, cute::_1>,                      \
                                    sm90::ConvSchedule::schedule, EPIFUSE_SM90_ACTS_##acts>;                    \
  };
#endif

namespace epifuse::cuda::sm90_manifest {
#include "kernels.def"
}  // namespace epifuse::cuda::sm90_manifest

#define EPIFUSE_SM90_CAT3_(a, b, c) a##b##c
#define EPIFUSE_SM90_CAT3(a, b, c) EPIFUSE_SM90_CAT3_(a, b, c)
#define EPIFUSE_SM90_STR_(x) #x
#define EPIFUSE_SM90_STR(x) EPIFUSE_SM90_STR_(x)
#define EPIFUSE_SM90_FN EPIFUSE_SM90_CAT3(sm90_, EPIFUSE_SM90_DTYPE, EPIFUSE_SM90_CAT3(_, EPIFUSE_SM90_NAME, ))
// One more expansion step, so that SM90_KERNEL's pasting sees the final names.
#define EPIFUSE_SM90_INSTANTIATE(FN, NAME, ...) SM90_KERNEL(FN, NAME, __VA_ARGS__)
#endif  // EPIFUSE_SM90_MANIFEST_DECLARED
EPIFUSE_SM90_INSTANTIATE(
    EPIFUSE_SM90_FN, EPIFUSE_SM90_STR(EPIFUSE_SM90_FN),
    sm90_manifest::EPIFUSE_SM90_CAT3(EPIFUSE_SM90_NAME, _entry, )::Config<EPIFUSE_SM90_CAT3(EPIFUSE_SM90_DTYPE_, EPIFUSE_SM90_DTYPE, )>)
