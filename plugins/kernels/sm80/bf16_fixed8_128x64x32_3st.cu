// sm80_bf16_fixed8_128x64x32_3st: C == 8 exactly (RGB stems after zero-padding to 8 channels): one
// 16-byte access holds all channels of a pixel, so the GEMM-K index runs over (r, s) with full-width
// cp.async loads and a multistage pipeline.
#include "sm80/sm80_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_bf16_fixed8_128x64x32_3st";
using Impl = FusedConv<kName, cutlass::bfloat16_t, Shape<128, 64, 32>, Shape<64, 32, 32>, Shape<16, 8, 16>, 3,
                       cutlass::conv::IteratorAlgorithm::kFixedChannels, /*AlignAB=*/8, /*AlignC=*/8>;
}  // namespace

KernelImpl bf16_fixed8_128x64x32_3st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
