// sm80_bf16_128x64x64_4st: K = 64 layers (a 128-wide N tile would idle half its MMAs), 96 KiB smem.
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_bf16_128x64x64_4st";
using Impl = FusedConv<kName, cutlass::bfloat16_t, Shape<128, 64, 64>, Shape<64, 32, 64>, Shape<16, 8, 16>, 4,
                       cutlass::conv::IteratorAlgorithm::kOptimized, /*AlignAB=*/8, /*AlignC=*/8>;
}  // namespace

KernelImpl bf16_128x64x64_4st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
