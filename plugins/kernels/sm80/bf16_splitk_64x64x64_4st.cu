// sm80_bf16_splitk_64x64x64_4st: parallel split-K (splitk_conv.cuh) for batch-1 layers with few
// output tiles and a long R*S*C loop; the 64x64 tile of the 64x64x64_4st configuration.
#include "sm80/splitk_conv.cuh"

namespace epifuse::cuda::sm80 {
namespace {
constexpr char kName[] = "sm80_bf16_splitk_64x64x64_4st";
using Impl = SplitKConv<kName, cutlass::bfloat16_t, cutlass::gemm::GemmShape<64, 64, 64>, cutlass::gemm::GemmShape<32, 32, 64>,
                        cutlass::gemm::GemmShape<16, 8, 16>, 4>;
}  // namespace

KernelImpl bf16_splitk_64x64x64_4st() { return Impl::impl(); }

}  // namespace epifuse::cuda::sm80
