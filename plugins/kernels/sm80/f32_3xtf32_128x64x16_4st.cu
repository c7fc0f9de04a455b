// sm80_f32_3xtf32_128x64x16_4st: fp32 through 3xTF32 (OpMultiplyAddFastF32: each operand split into
// a TF32 "big" and "small" part, three mma.sync per product), so fp32 models get tensor cores
// with fp32-level accuracy (plain TF32 would lose ~3 decimal digits). C % 4 == 0, K % 4 == 0.
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_f32_3xtf32_128x64x16_4st";
using Impl = FusedConv<kName, float, Shape<128, 64, 16>, Shape<64, 32, 16>, Shape<16, 8, 8>, 4,
                       cutlass::conv::IteratorAlgorithm::kOptimized, /*AlignAB=*/4, /*AlignC=*/4,
                       cutlass::arch::OpMultiplyAddFastF32>;
}  // namespace

KernelImpl f32_3xtf32_128x64x16_4st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
