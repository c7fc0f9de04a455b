// CPU FusedConv for depthwise convolutions (one input and one output channel a group), fp32 on AVX-512
// or AVX2, bf16 on AVX-512 with BW (widened as loaded, fp32 arithmetic, rounded once as stored), NHWC:
// each output row's channel vectors accumulate the filter taps in registers, blocks of output columns
// sharing each input vector they read (a 3x3 stride-1 filter row: 10 loads for 24 multiply-adds), and
// the residual and activation apply to a block while it is in registers. A piece's rows run as strips: a
// block of columns down all the piece's rows, so that the input rows one output row shares with the next
// are still in L1 (MobileNetV3-Large's layers 1.12x on one thread, 1.07x on two, Zen 5); where a block's
// input through all channels would not fit L1 (14x14x480), pieces are bands of rows of a pair of channel
// vectors.
// Against oneDNN 3.2's brdgmm_dw (2 threads, Zen 4): ConvNeXt-T's 7x7 layers 1.05-1.34x, EfficientNet's
// and MobileNet's 3x3 and 5x5 0.90-1.11x in loops; in whole models on an AVX-512 Xeon faster on every
// depthwise layer, so CpuFusedConv runs it untimed with AVX-512 on the widths it unrolls (fp32 ones that
// sum no pool go to oneDNN on Zen 5, where oneDNN's measured faster); elsewhere it times the two per shape.
#pragma once
#include "direct_conv.h"

namespace epifuse {

// Its prepared filters: [R * S][Cp] taps of constant filters, each row of channels padded to whole vectors.
class DepthwiseConv final : public DirectConv {
 public:
  // group == C == K, dilation 1; fp32 on a CPU with AVX-512F or AVX2 and FMA, bf16 with AVX-512F, BW and VL.
  bool supports(const ConvProblem& p) const override;

  // "depthwise direct avx512" or "... avx2".
  std::string name() const override;

  // Whether `p`'s filter width and stride have a kernel unrolled for them (3, 5 or 7 wide, stride 1 or 2:
  // the cases of conv_rows_for in depthwise_kernels.inc); others run a column at a time, several times slower.
  static bool unrolled(const ConvProblem& p) {
    return (p.S == 3 || p.S == 5 || p.S == 7) && (p.attr.stride_w == 1 || p.attr.stride_w == 2);
  }

  Status run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
             const void* z, void* y, const ParallelFor& parallel_for) override;
  // As run, and where `mean` is not null, the mean of y over its rows and columns into it ([N][K] of
  // p.dtype), summed while the outputs are in registers: a squeeze-excite block's pool at no extra pass.
  Status run_with_mean(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                       const void* z, void* y, void* mean, const ParallelFor& parallel_for);
  // As run_with_mean, on the calling thread, as one piece: a band of rows of a pair op
  // (cpu_pointwise_depthwise.h), whose thread runs its bands one after another. Cut into pieces for
  // threads, a band's few rows went one row a piece, and no input row was read again from L1.
  Status run_band(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                  const void* z, void* y, void* mean);

 private:
  Status run_pieces(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                    const void* z, void* y, void* mean, const ParallelFor& parallel_for, int64_t wanted);
};

}  // namespace epifuse
