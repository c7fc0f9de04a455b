#include "depthwise_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Output rows a piece of work, at least: enough pieces per thread to even out a ragged end.
constexpr int64_t kPiecesPerThread = 4;

struct Geometry {
  Geometry(const ConvProblem& p, int64_t lanes)
      : N(p.N), H(p.H), W(p.W), C(p.C), P(p.P()), Q(p.Q()), R(p.R), S(p.S), SH(p.attr.stride_h),
        SW(p.attr.stride_w), pad_top(p.attr.pad_top), pad_left(p.attr.pad_left), Cp(round_up(p.C, lanes)),
        residual(p.attr.residual), activation(p.attr.activation) {}
  int64_t N, H, W, C, P, Q, R, S, SH, SW, pad_top, pad_left;
  int64_t Cp;  // C rounded up to whole vectors: the filters' row stride
  Residual residual;
  Activation activation;
};

namespace avx512 {
using Vec = simd::Avx512;
constexpr int kBlock = 8;  // output columns in registers: 8 accumulators + up to 7 taps + the input
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512
#include "vector_epilogue.inc"
#include "depthwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512

namespace avx2 {
using Vec = simd::Avx2;
constexpr int kBlock = 4;  // of 16 registers: 4 accumulators + up to 7 taps + the input
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2
#include "vector_epilogue.inc"
#include "depthwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx2

}  // namespace

bool DepthwiseConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && a.group == p.C && p.K == p.C && p.C > 0 && a.dil_h == 1 && a.dil_w == 1 &&
         isa_ != VectorIsa::kNone;
}

std::string DepthwiseConv::name() const { return std::string("depthwise direct ") + isa_name(isa_); }

Status DepthwiseConv::run(const ConvProblem& p, const float* x, const float* w, bool w_constant, const float* b,
                          const float* z, float* y, const ParallelFor& parallel_for) {
  if (!supports(p)) return Status::Error("the depthwise kernel does not run this problem");
  const Geometry g(p, simd::lanes_of(isa_));
  const int64_t rows = g.N * g.P;
  if (rows == 0 || g.Q == 0) return Status::Ok();

  const int64_t taps = g.R * g.S;
  const auto filters = filters_.get(w, w_constant, taps * g.Cp, [&](float* f) {  // KRSC [C][R][S][1] to [R][S][Cp]
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t t = 0; t < taps; ++t) f[t * g.Cp + c] = w[c * taps + t];
  });
  const float* f = filters->data;
  const auto output_row = isa_ == VectorIsa::kAvx512 ? avx512::output_row : avx2::output_row;
  const int64_t per_piece = std::max<int64_t>(1, rows / (hardware_threads() * kPiecesPerThread));
  const int64_t pieces = (rows + per_piece - 1) / per_piece;
  parallel_for(pieces, [&](int64_t i) {
    for (int64_t row = i * per_piece; row < std::min(rows, (i + 1) * per_piece); ++row)
      output_row(g, x, f, b, z, row / g.P, row % g.P, y);
  });
  return Status::Ok();
}

}  // namespace epifuse
