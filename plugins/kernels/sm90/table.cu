// The CUTLASS 3.x SM90 kernels in this build (sm_90a only; one translation unit per configuration).
// Names match plugins/core/rules_sm90.cc, whose order is the heuristic preference.
#include "kernel_api.h"

namespace epifuse::cuda {

#define EPIFUSE_SM90_KERNELS(X)                   \
  X(sm90_f16_gemm1x1_256x128_coop_relu)           \
  X(sm90_bf16_gemm1x1_256x128_coop_relu)          \
  X(sm90_f16_gemm1x1_256x128_coop_silu_nores)           \
  X(sm90_bf16_gemm1x1_256x128_coop_silu_nores)          \
  X(sm90_f16_gemm1x1t_128x96_coop_silu_nores)           \
  X(sm90_bf16_gemm1x1t_128x96_coop_silu_nores)          \
  X(sm90_f16_gemm1x1t_128x224_coop_silu_nores)          \
  X(sm90_bf16_gemm1x1t_128x224_coop_silu_nores)         \
  X(sm90_f16_gemm1x1_128x128_coop_relu)           \
  X(sm90_bf16_gemm1x1_128x128_coop_relu)          \
  X(sm90_f16_gemm1x1_128x128_coop_silu)           \
  X(sm90_bf16_gemm1x1_128x128_coop_silu)          \
  X(sm90_f16_gemm1x1_128x128_coop)                \
  X(sm90_bf16_gemm1x1_128x128_coop)               \
  X(sm90_f16_gemm1x1_128x128_pingpong)            \
  X(sm90_bf16_gemm1x1_128x128_pingpong)           \
  X(sm90_f16_gemm1x1_128x128_streamk)             \
  X(sm90_bf16_gemm1x1_128x128_streamk)            \
  X(sm90_f16_gemm1x1_128x64_pingpong)             \
  X(sm90_bf16_gemm1x1_128x64_pingpong)            \
  X(sm90_f16_conv_64x64x64_c1x1_2cta_relu)      \
  X(sm90_bf16_conv_64x64x64_c1x1_2cta_relu)     \
  X(sm90_f16_conv_64x64x64_c1x1_2cta_silu)      \
  X(sm90_bf16_conv_64x64x64_c1x1_2cta_silu)     \
  X(sm90_f16_conv_128x64x64_c1x1_pingpong_relu)   \
  X(sm90_bf16_conv_128x64x64_c1x1_pingpong_relu)  \
  X(sm90_f16_conv_128x64x64_c1x1_pingpong_silu)   \
  X(sm90_bf16_conv_128x64x64_c1x1_pingpong_silu)  \
  X(sm90_f16_conv_128x64x64_c1x1_pingpong)        \
  X(sm90_bf16_conv_128x64x64_c1x1_pingpong)       \
  X(sm90_f16_conv_128x128x64_c1x1_pingpong_silu)  \
  X(sm90_bf16_conv_128x128x64_c1x1_pingpong_silu) \
  X(sm90_f16_conv_128x128x64_c1x1_pingpong)       \
  X(sm90_bf16_conv_128x128x64_c1x1_pingpong)      \
  X(sm90_f16_conv_128x32x32_c1x1_pingpong)        \
  X(sm90_bf16_conv_128x32x32_c1x1_pingpong)       \
  X(sm90_f16_conv_128x64x64_c2x1_2cta)            \
  X(sm90_bf16_conv_128x64x64_c2x1_2cta)           \
  X(sm90_f16_conv_128x64x64_c2x1)                 \
  X(sm90_bf16_conv_128x64x64_c2x1)                \
  X(sm90_f16_conv_128x128x64_c1x1)                \
  X(sm90_bf16_conv_128x128x64_c1x1)               \
  X(sm90_f16_conv_128x32x32_c2x1_2cta_relu)       \
  X(sm90_bf16_conv_128x32x32_c2x1_2cta_relu)      \
  X(sm90_f16_conv_128x32x32_c2x1_2cta)            \
  X(sm90_bf16_conv_128x32x32_c2x1_2cta)           

#define EPIFUSE_DECLARE(fn) KernelImpl fn();
EPIFUSE_SM90_KERNELS(EPIFUSE_DECLARE)
#undef EPIFUSE_DECLARE

std::vector<KernelImpl> sm90_kernels() {
#define EPIFUSE_LIST(fn) fn(),
  return {EPIFUSE_SM90_KERNELS(EPIFUSE_LIST)};
#undef EPIFUSE_LIST
}

}  // namespace epifuse::cuda
