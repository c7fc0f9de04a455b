// sm80_f16_64x64x64_4st: small / batch-1 layers: more CTAs to fill the SMs, 64 KiB smem.
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_f16_64x64x64_4st";
using Impl = FusedConv<kName, cutlass::half_t, Shape<64, 64, 64>, Shape<32, 32, 64>, Shape<16, 8, 16>, 4,
                       cutlass::conv::IteratorAlgorithm::kOptimized, /*AlignAB=*/8, /*AlignC=*/8>;
}  // namespace

KernelImpl f16_64x64x64_4st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
