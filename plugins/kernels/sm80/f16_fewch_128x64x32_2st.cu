// sm80_f16_fewch_128x64x32_2st: stems with C < 8 (RGB C = 3, C = 4): the GEMM-K index runs over (r, s, c) jointly, so a
// K-tile is not wasted on padding channels; element-wise loads (pipelined mainloop).
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_f16_fewch_128x64x32_2st";
using Impl = FusedConv<kName, cutlass::half_t, Shape<128, 64, 32>, Shape<64, 32, 32>, Shape<16, 8, 16>, 2,
                       cutlass::conv::IteratorAlgorithm::kFewChannels, /*AlignAB=*/1, /*AlignC=*/8>;
}  // namespace

KernelImpl f16_fewch_128x64x32_2st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
