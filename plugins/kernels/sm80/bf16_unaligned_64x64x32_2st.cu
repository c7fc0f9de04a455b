// sm80_bf16_unaligned_64x64x32_2st: C or K not multiples of 8: element-wise loads and stores (pipelined mainloop).
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_bf16_unaligned_64x64x32_2st";
using Impl = FusedConv<kName, cutlass::bfloat16_t, Shape<64, 64, 32>, Shape<32, 32, 32>, Shape<16, 8, 16>, 2,
                       cutlass::conv::IteratorAlgorithm::kAnalytic, /*AlignAB=*/1, /*AlignC=*/1>;
}  // namespace

KernelImpl bf16_unaligned_64x64x32_2st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
