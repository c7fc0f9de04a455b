// CPU FusedConv for 3x3, stride-1 fp32 convolutions by Winograd's minimal filtering F(2x2, 3x3)
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016) on AVX-512 or AVX2: a 2x2
// output tile costs 16 multiply-adds per input and output channel where the direct convolution
// does 36. The CPU engines at hand compute these layers directly (MLAS; oneDNN 3.2 has no fp32
// Winograd on AMD cores), at ~85% of the FMA peak at best, so the fewer multiplies are the only
// way past them on a compute-bound layer.
//
// Work is cut into blocks of output tiles, each done start to end by one thread while its data
// stays in L2: the input transform of the block's 4x4 patches (V, 16 matrices of tiles x C), 16
// GEMMs against the filters transformed once (U, 16 matrices of C x K), and the output transform
// with the bias, the residual and the activation applied to the tile in registers.
// Filter transform in double, data transforms with coefficients 0, +-1 and +-1/2: the result is
// within a few fp32 ulps of the direct convolution's (relative L2 1e-7 to 4e-7 against float64, measured).
#pragma once
#include "direct_conv.h"

namespace epifuse {

// Its prepared filters: U = G g G^T of constant filters, made at the first call.
class WinogradConv final : public DirectConv {
 public:
  // fp32, 3x3, stride 1, dilation 1, one group, on a CPU with AVX-512F or AVX2 and FMA.
  bool supports(const ConvProblem& p) const override;

  // "winograd F(2x2,3x3) avx512" or "... avx2".
  std::string name() const override;

  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for) override;
};

}  // namespace epifuse
