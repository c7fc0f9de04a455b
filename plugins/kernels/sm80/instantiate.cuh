// One kernel of kernels.def in one dtype: the body of the translation units CMake generates
// (sources.cmake). A unit defines EPIFUSE_SM80_NAME (a kernels.def name), EPIFUSE_SM80_DTYPE (f16,
// bf16, f32 or tf32) and, for a SPLITK or GROUPED line, EPIFUSE_SM80_SPLITK_UNIT or EPIFUSE_SM80_GROUPED_UNIT,
// then includes this file, which turns the line's columns into a FusedConv / SplitKConv / GroupedConv
// and defines `KernelImpl <dtype>_<name>()` in epifuse::cuda::sm80 (table.cu lists them). Every line of
// the unit's kind is declared as an alias template (nothing is instantiated until used), so a unit needs
// no parsing of its own.
#if defined(EPIFUSE_SM80_SPLITK_UNIT)
#include "sm80/splitk_conv.cuh"
#elif defined(EPIFUSE_SM80_GROUPED_UNIT)
#include "sm80/group_conv.cuh"
#else
#include "sm80/sm80_conv.cuh"
#endif

#define EPIFUSE_SM80_ELEMENT_f16 cutlass::half_t
#define EPIFUSE_SM80_ELEMENT_bf16 cutlass::bfloat16_t
#define EPIFUSE_SM80_ELEMENT_f32 float
#define EPIFUSE_SM80_ELEMENT_tf32 float
// mma.sync shape, 128-bit access width and math of the element type (f32: 3xTF32; tf32: float operands
// rounded to TF32 for one mma.sync, CUTLASS's DefaultMmaTensorOp for float with OpMultiplyAdd).
#define EPIFUSE_SM80_INST_f16 cutlass::gemm::GemmShape<16, 8, 16>
#define EPIFUSE_SM80_INST_bf16 cutlass::gemm::GemmShape<16, 8, 16>
#define EPIFUSE_SM80_INST_f32 cutlass::gemm::GemmShape<16, 8, 8>
#define EPIFUSE_SM80_INST_tf32 cutlass::gemm::GemmShape<16, 8, 8>
#define EPIFUSE_SM80_ALIGN_f16 8
#define EPIFUSE_SM80_ALIGN_bf16 8
#define EPIFUSE_SM80_ALIGN_f32 4
#define EPIFUSE_SM80_ALIGN_tf32 4
#define EPIFUSE_SM80_OP_f16 cutlass::arch::OpMultiplyAdd
#define EPIFUSE_SM80_OP_bf16 cutlass::arch::OpMultiplyAdd
#define EPIFUSE_SM80_OP_f32 cutlass::arch::OpMultiplyAddFastF32
#define EPIFUSE_SM80_OP_tf32 cutlass::arch::OpMultiplyAdd

#define EPIFUSE_SM80_CAT_(a, b) a##b
#define EPIFUSE_SM80_CAT(a, b) EPIFUSE_SM80_CAT_(a, b)
#define EPIFUSE_SM80_OF(what) EPIFUSE_SM80_CAT(EPIFUSE_SM80_##what##_, EPIFUSE_SM80_DTYPE)
#define EPIFUSE_SM80_STR_(x) #x
#define EPIFUSE_SM80_STR(x) EPIFUSE_SM80_STR_(x)

// A FusedConv line: the kind's iterator algorithm and its A/B and C access widths (elements).
#define EPIFUSE_SM80_FUSED(name, algorithm, align_ab, align_c, tm, tn, tk, wm, wn, wk, stages)            \
  template <const char* kName>                                                                        \
  using entry_##name = FusedConv<kName, EPIFUSE_SM80_OF(ELEMENT), cutlass::gemm::GemmShape<tm, tn, tk>, \
                                 cutlass::gemm::GemmShape<wm, wn, wk>, EPIFUSE_SM80_OF(INST), stages,   \
                                 cutlass::conv::IteratorAlgorithm::algorithm, align_ab, align_c,        \
                                 EPIFUSE_SM80_OF(OP)>;
#if defined(EPIFUSE_SM80_SPLITK_UNIT)
#define EPIFUSE_SM80_KIND_SPLITK(name, tm, tn, tk, wm, wn, wk, stages)                                    \
  template <const char* kName>                                                                        \
  using entry_##name = SplitKConv<kName, EPIFUSE_SM80_OF(ELEMENT), cutlass::gemm::GemmShape<tm, tn, tk>, \
                                  cutlass::gemm::GemmShape<wm, wn, wk>, EPIFUSE_SM80_OF(INST), stages>;
#define EPIFUSE_SM80_KIND_ALIGNED(...)
#define EPIFUSE_SM80_KIND_FIXED8(...)
#define EPIFUSE_SM80_KIND_FEWCH(...)
#define EPIFUSE_SM80_KIND_UNALIGNED(...)
#define EPIFUSE_SM80_KIND_GROUPED(...)
#elif defined(EPIFUSE_SM80_GROUPED_UNIT)
#define EPIFUSE_SM80_KIND_GROUPED(name, tm, tn, tk, wm, wn, wk, stages)                                    \
  template <const char* kName>                                                                         \
  using entry_##name = GroupedConv<kName, EPIFUSE_SM80_OF(ELEMENT), cutlass::gemm::GemmShape<tm, tn, tk>, \
                                   cutlass::gemm::GemmShape<wm, wn, wk>, EPIFUSE_SM80_OF(INST), stages>;
#define EPIFUSE_SM80_KIND_SPLITK(...)
#define EPIFUSE_SM80_KIND_ALIGNED(...)
#define EPIFUSE_SM80_KIND_FIXED8(...)
#define EPIFUSE_SM80_KIND_FEWCH(...)
#define EPIFUSE_SM80_KIND_UNALIGNED(...)
#else
#define EPIFUSE_SM80_KIND_SPLITK(...)
#define EPIFUSE_SM80_KIND_GROUPED(...)
#define EPIFUSE_SM80_KIND_ALIGNED(name, ...) \
  EPIFUSE_SM80_FUSED(name, kOptimized, EPIFUSE_SM80_OF(ALIGN), EPIFUSE_SM80_OF(ALIGN), __VA_ARGS__)
#define EPIFUSE_SM80_KIND_FIXED8(name, ...) EPIFUSE_SM80_FUSED(name, kFixedChannels, 8, 8, __VA_ARGS__)
#define EPIFUSE_SM80_KIND_FEWCH(name, ...) EPIFUSE_SM80_FUSED(name, kFewChannels, 1, 8, __VA_ARGS__)
#define EPIFUSE_SM80_KIND_UNALIGNED(name, ...) EPIFUSE_SM80_FUSED(name, kAnalytic, 1, 1, __VA_ARGS__)
#endif
#define SM80_CONV(name, kind, dtypes, tm, tn, tk, wm, wn, wk, stages) \
  EPIFUSE_SM80_KIND_##kind(name, tm, tn, tk, wm, wn, wk, stages)

namespace epifuse::cuda::sm80 {
#include "kernels.def"

#define EPIFUSE_SM80_FN EPIFUSE_SM80_CAT(EPIFUSE_SM80_DTYPE, EPIFUSE_SM80_CAT(_, EPIFUSE_SM80_NAME))
namespace {
constexpr char kName[] = EPIFUSE_SM80_STR(EPIFUSE_SM80_CAT(sm80_, EPIFUSE_SM80_FN));
using Impl = EPIFUSE_SM80_CAT(entry_, EPIFUSE_SM80_NAME)<kName>;
}  // namespace

KernelImpl EPIFUSE_SM80_FN() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
