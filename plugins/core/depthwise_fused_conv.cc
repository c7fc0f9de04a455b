#include "depthwise_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "activation.h"
#include "bf16_vectors.h"
#include "float_types.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Output rows a piece of work, at least: enough pieces per thread to even out a ragged end.
constexpr int64_t kPiecesPerThread = 4;
// Pieces of whole rows where one block of the AVX-512 kernels' output columns reads at most this much
// input through all channels: L1 is 32-48 KB.
constexpr int64_t kL1Bytes = 32 * 1024;

struct Geometry {
  Geometry(const ConvProblem& p, int64_t lanes)
      : N(p.N), H(p.H), W(p.W), C(p.C), P(p.P()), Q(p.Q()), R(p.R), S(p.S), SH(p.attr.stride_h),
        SW(p.attr.stride_w), pad_top(p.attr.pad_top), pad_left(p.attr.pad_left), lanes(lanes),
        Cp(round_up(p.C, lanes)), residual(p.attr.residual), activation(p.attr.activation) {}
  int64_t N, H, W, C, P, Q, R, S, SH, SW, pad_top, pad_left, lanes;
  int64_t Cp;  // C rounded up to whole vectors
  Residual residual;
  Activation activation;
};

namespace avx512 {
using Vec = simd::Avx512;
using Data = float;
constexpr int kBlock = 8;  // output columns in registers: 8 accumulators + up to 7 taps + the input
constexpr bool kPairs = true;  // 32 registers: two channel vectors at once where the taps fit
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512
#include "vector_epilogue.inc"
#include "depthwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512

// bfloat16 data (AVX512-BW for the masked 16-bit loads and stores), fp32 arithmetic.
namespace avx512_bf16 {
using Vec = simd::Avx512;
using Data = bfloat16_t;
constexpr int kBlock = 8;
constexpr bool kPairs = true;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512BW
EPIFUSE_VECTOR_TARGET inline Vec::F load_data(Vec::Mask m, const bfloat16_t* p) { return load_bf16x16_masked(m, p); }
EPIFUSE_VECTOR_TARGET inline Vec::F load_data(const bfloat16_t* p) { return load_bf16x16(p); }
EPIFUSE_VECTOR_TARGET inline void store_data(bfloat16_t* p, Vec::Mask m, Vec::F v) { store_bf16x16_masked(p, m, v); }
#include "vector_epilogue.inc"
#include "depthwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512_bf16

namespace avx2 {
using Vec = simd::Avx2;
using Data = float;
constexpr int kBlock = 4;  // of 16 registers: 4 accumulators + up to 7 taps + the input
constexpr bool kPairs = false;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2
#include "vector_epilogue.inc"
#include "depthwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx2

}  // namespace

bool DepthwiseConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  const bool dtype = p.dtype == DType::kFloat ? isa_ != VectorIsa::kNone
                     : p.dtype == DType::kBFloat16 && isa_ == VectorIsa::kAvx512 && cpu_has_avx512bw_vl();
  return dtype && a.group == p.C && p.K == p.C && p.C > 0 && a.dil_h == 1 && a.dil_w == 1;
}

std::string DepthwiseConv::name() const { return std::string("depthwise direct ") + isa_name(isa_); }

namespace {

// Output rows of `g` in pieces on the caller's threads (about `wanted` of them), the data of element type T.
// A piece runs its rows as strips (depthwise_kernels.inc's conv_rows). Where one block of
// output columns reads more input than L1 holds through all channels (14x14x480: 58 KB), a piece is a band
// of rows of one group of channels (`group_lanes`, a pair of vectors), which runs down its band: the input
// rows the group reads stay in L1 from one output row to the next, 1.2-1.4x faster on such layers (Zen 5).
// Else pieces are whole rows, and where those are too few to even out the threads' ends (7x7 maps: 7 rows
// on 2 threads), each row's channels are cut into groups of whole vectors too. Where `mean` ([N][C] of T),
// the output's mean over its rows and columns too: each piece of rows sums its outputs in registers into
// sums of its own for each image it covers, which the calling thread adds in a fixed order (the result
// does not depend on the intra-op thread count).
template <class T, class OutputRows>
void run_rows(const Geometry& g, const ParallelFor& parallel_for, int64_t wanted, OutputRows output_rows,
              int64_t group_lanes, const void* x, const float* f, const float* b, const void* z, void* y, T* mean) {
  const int64_t rows = g.N * g.P, vectors = g.Cp / g.lanes;
  const int64_t block_bytes = g.R * ((avx512::kBlock - 1) * g.SW + g.S) * g.C * static_cast<int64_t>(sizeof(T));
  int64_t group_vectors = group_lanes / g.lanes;
  if (block_bytes <= kL1Bytes) {
    const int64_t groups = rows >= wanted ? 1 : std::min(vectors, (wanted + rows - 1) / rows);
    group_vectors = (vectors + groups - 1) / groups;
  }
  const int64_t channel_groups = (vectors + group_vectors - 1) / group_vectors;
  const int64_t per_piece = std::min(rows, std::max<int64_t>(1, rows * channel_groups / wanted));
  const int64_t row_pieces = (rows + per_piece - 1) / per_piece;
  // The sums of row piece i for image n: Cp floats at sums + (i + n) * Cp. Pieces and images are both runs
  // of consecutive rows, so a later piece never holds an earlier image, and no two (piece, image) pairs
  // share a slot; zeros where a piece has no rows of an image.
  std::vector<float> storage;
  float* sums = mean ? aligned(storage, (row_pieces + g.N - 1) * g.Cp) : nullptr;  // zeroed as it grows
  parallel_for(row_pieces * channel_groups, [&](int64_t i) {
    const int64_t piece = i / channel_groups, group = i % channel_groups, first = piece * per_piece;
    const int64_t c_lo = group * group_vectors * g.lanes, c_hi = std::min(g.Cp, c_lo + group_vectors * g.lanes);
    output_rows(g, static_cast<const T*>(x), f, b, static_cast<const T*>(z), first, std::min(rows, first + per_piece),
                c_lo, c_hi, static_cast<T*>(y), sums ? sums + piece * g.Cp : nullptr);
  });
  if (!mean) return;
  const float scale = 1.f / static_cast<float>(g.P * g.Q);
  for (int64_t n = 0; n < g.N; ++n) {  // image n's pieces, in order, into its first piece's sums
    const int64_t first = n * g.P / per_piece, last = ((n + 1) * g.P - 1) / per_piece;
    float* total = sums + (first + n) * g.Cp;
    for (int64_t piece = first + 1; piece <= last; ++piece)
      for (int64_t c = 0; c < g.Cp; ++c) total[c] += sums[(piece + n) * g.Cp + c];
    for (int64_t c = 0; c < g.C; ++c) mean[n * g.C + c] = from_float<T>(total[c] * scale);
  }
}

}  // namespace

Status DepthwiseConv::run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                          const void* z, void* y, const ParallelFor& parallel_for) {
  return run_with_mean(p, x, w, w_constant, b, z, y, nullptr, parallel_for);
}

Status DepthwiseConv::run_with_mean(const ConvProblem& p, const void* x, const void* w, bool w_constant,
                                    const void* b, const void* z, void* y, void* mean,
                                    const ParallelFor& parallel_for) {
  return run_pieces(p, x, w, w_constant, b, z, y, mean, parallel_for, hardware_threads() * kPiecesPerThread);
}

Status DepthwiseConv::run_band(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                               const void* z, void* y, void* mean) {
  return run_pieces(p, x, w, w_constant, b, z, y, mean, parallel_for_serial, 1);
}

Status DepthwiseConv::run_pieces(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                                 const void* z, void* y, void* mean, const ParallelFor& parallel_for,
                                 int64_t wanted) {
  if (!supports(p)) return Status::Error("the depthwise kernel does not run this problem");
  const Geometry g(p, simd::lanes_of(isa_));
  if (g.N * g.P == 0 || g.Q == 0) return Status::Ok();  // an empty output has no mean to write: the caller's

  const bool bf16 = p.dtype == DType::kBFloat16;
  const auto value = [bf16](const void* data, int64_t i) {
    return bf16 ? to_float(static_cast<const bfloat16_t*>(data)[i]) : static_cast<const float*>(data)[i];
  };
  const int64_t taps = g.R * g.S;
  // KRSC [C][R][S][1] to [Cp / lanes][R][S][lanes]: a channel vector's taps one after another, so that the
  // kernel reaches them all from one pointer (with [R][S][Cp], each tap's offset took a register of its own)
  const auto filters = filters_.get(w, w_constant, taps * g.Cp, [&](float* f) {
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t t = 0; t < taps; ++t) f[(c / g.lanes * taps + t) * g.lanes + c % g.lanes] = value(w, c * taps + t);
  });
  const float* f = filters->data;
  if (bf16) {  // the bias in fp32, as the filters
    std::vector<float> bias(static_cast<size_t>(g.C));
    for (int64_t c = 0; c < g.C; ++c) bias[c] = value(b, c);
    run_rows<bfloat16_t>(g, parallel_for, wanted, avx512_bf16::output_rows, avx512_bf16::kGroupLanes, x, f,
                         bias.data(), z, y, static_cast<bfloat16_t*>(mean));
  } else {
    const bool avx512 = isa_ == VectorIsa::kAvx512;
    run_rows<float>(g, parallel_for, wanted, avx512 ? avx512::output_rows : avx2::output_rows,
                    avx512 ? avx512::kGroupLanes : avx2::kGroupLanes, x, f, static_cast<const float*>(b), z, y,
                    static_cast<float*>(mean));
  }
  return Status::Ok();
}

}  // namespace epifuse
