// sm80_f16_128x128x64_3st: large layers (K >= 128): 4 warps of 64x64, 96 KiB smem, 2 CTAs/SM on sm_90.
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_f16_128x128x64_3st";
using Impl = FusedConv<kName, cutlass::half_t, Shape<128, 128, 64>, Shape<64, 64, 64>, Shape<16, 8, 16>, 3,
                       cutlass::conv::IteratorAlgorithm::kOptimized, /*AlignAB=*/8, /*AlignC=*/8>;
}  // namespace

KernelImpl f16_128x128x64_3st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
