// F(2x2, 3x3) with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5;
// 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]: V = B^T d B per 4x4 input patch, U = G g G^T per filter,
// M = V . U summed over the input channels (16 GEMMs, one per position of the 4x4), Y = A^T M A.
// NHWC puts the channels of a pixel side by side, so every transform works on a vector of channels:
// 16 with AVX-512, 8 with AVX2.
#include "winograd_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// V and M of one block of tiles, sized to stay in a 1 MB L2 (Zen 4, Skylake-SP) beside the filters.
constexpr int64_t kBlockBytes = 192 * 1024;
// Blocks per thread at least, where the layer has that many tiles: evens out ragged ends.
constexpr int64_t kBlocksPerThread = 4;

using simd::GemmShape;

struct Geometry {
  Geometry(const ConvProblem& p, int64_t lanes, GemmShape (*gemm_shape)(int64_t k_vectors))
      : N(p.N), H(p.H), W(p.W), C(p.C), K(p.K), P(p.P()), Q(p.Q()), TP((P + 1) / 2), TQ((Q + 1) / 2),
        tiles(N * TP * TQ), pad_top(p.attr.pad_top), pad_left(p.attr.pad_left), Cp(round_up(C, lanes)),
        Kp(round_up(K, lanes)), gemm(gemm_shape(Kp / lanes)), residual(p.attr.residual),
        activation(p.attr.activation) {
    const int64_t rows = gemm.rows;
    const int64_t fits = std::max<int64_t>(rows, kBlockBytes / (16 * (Cp + Kp) * 4) / rows * rows);
    const int64_t shared = round_up((tiles + hardware_threads() * kBlocksPerThread - 1) /
                                        (hardware_threads() * kBlocksPerThread), rows);
    block = std::min(fits, std::max<int64_t>(rows, shared));
    blocks = (tiles + block - 1) / block;
  }
  int64_t N, H, W, C, K, P, Q, TP, TQ, tiles, pad_top, pad_left;
  int64_t Cp, Kp;  // C and K rounded up to whole vectors: the row strides of V, U and M
  GemmShape gemm;
  int64_t block = 0, blocks = 0;  // tiles per block (a multiple of gemm.rows); blocks
  Residual residual;
  Activation activation;

  int64_t scratch_floats() const { return 16 * block * (Cp + Kp); }
};

// U[16][Cp][Kp] from KRSC filters into zeros (left where c >= C or k >= K). In double: the transform's
// sums of three filter taps then round once.
void transform_filters(const Geometry& g, const float* w, float* u) {
  for (int64_t k = 0; k < g.K; ++k) {
    for (int64_t c = 0; c < g.C; ++c) {
      double f[3][3], gf[4][3];
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) f[r][s] = w[((k * 3 + r) * 3 + s) * g.C + c];
      for (int s = 0; s < 3; ++s) {
        gf[0][s] = f[0][s];
        gf[1][s] = 0.5 * (f[0][s] + f[1][s] + f[2][s]);
        gf[2][s] = 0.5 * (f[0][s] - f[1][s] + f[2][s]);
        gf[3][s] = f[2][s];
      }
      for (int i = 0; i < 4; ++i) {
        const double row[4] = {gf[i][0], 0.5 * (gf[i][0] + gf[i][1] + gf[i][2]),
                               0.5 * (gf[i][0] - gf[i][1] + gf[i][2]), gf[i][2]};
        for (int j = 0; j < 4; ++j) u[((i * 4 + j) * g.Cp + c) * g.Kp + k] = static_cast<float>(row[j]);
      }
    }
  }
}

using GemmTile = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t);

namespace avx512 {

using Vec = simd::Avx512;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512

GemmTile gemm_tile_for(GemmShape s);
#include "vector_epilogue.inc"
#include "winograd_kernels.inc"
GemmTile gemm_tile_for(GemmShape s) {
  switch (s.rows * 8 + s.vectors) {
    case 14 * 8 + 1: return gemm_tile<14, 1>;
    case 12 * 8 + 2: return gemm_tile<12, 2>;
    case 8 * 8 + 3: return gemm_tile<8, 3>;
    case 5 * 8 + 5: return gemm_tile<5, 5>;
    case 6 * 8 + 1: return gemm_tile<6, 1>;
    case 6 * 8 + 2: return gemm_tile<6, 2>;
    case 6 * 8 + 3: return gemm_tile<6, 3>;
    default: return gemm_tile<6, 4>;
  }
}
#undef EPIFUSE_VECTOR_TARGET

}  // namespace avx512

namespace avx2 {

using Vec = simd::Avx2;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2

GemmTile gemm_tile_for(GemmShape s);
#include "vector_epilogue.inc"
#include "winograd_kernels.inc"
GemmTile gemm_tile_for(GemmShape s) { return s.vectors == 1 ? gemm_tile<6, 1> : gemm_tile<6, 2>; }
#undef EPIFUSE_VECTOR_TARGET

}  // namespace avx2

Geometry geometry(const ConvProblem& p, VectorIsa isa) {
  return isa == VectorIsa::kAvx512 ? Geometry(p, simd::Avx512::kLanes, simd::Avx512::gemm_shape)
                                     : Geometry(p, simd::Avx2::kLanes, simd::Avx2::gemm_shape);
}

}  // namespace

bool WinogradConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && p.R == 3 && p.S == 3 && a.stride_h == 1 && a.stride_w == 1 &&
         a.dil_h == 1 && a.dil_w == 1 && a.group == 1 && p.C > 0 && p.K > 0 && isa_ != VectorIsa::kNone;
}

std::string WinogradConv::name() const { return std::string("winograd F(2x2,3x3) ") + isa_name(isa_); }

Status WinogradConv::run(const ConvProblem& p, const void* x_data, const void* w_data, bool w_constant,
                         const void* b_data, const void* z_data, void* y_data, const ParallelFor& parallel_for) {
  // fp32 only (supports)
  const float *x = static_cast<const float*>(x_data), *w = static_cast<const float*>(w_data),
              *b = static_cast<const float*>(b_data), *z = static_cast<const float*>(z_data);
  float* y = static_cast<float*>(y_data);
  if (!supports(p)) return Status::Error("the Winograd kernel does not run this problem");
  const Geometry g = geometry(p, isa_);
  if (g.tiles == 0) return Status::Ok();

  // Constant filters are transformed once; others on every call.
  const auto filters = filters_.get(w, w_constant, 16 * g.Cp * g.Kp, [&](float* u) { transform_filters(g, w, u); });
  const float* u = filters->data;  // U[16][Cp][Kp]
  const auto run_block = isa_ == VectorIsa::kAvx512 ? avx512::run_block : avx2::run_block;

  std::mutex error_mutex;
  std::string error;
  parallel_for(g.blocks, [&](int64_t i) {
    try {
      thread_local std::vector<float> scratch;
      float* v = aligned(scratch, g.scratch_floats());
      float* m = v + 16 * g.block * g.Cp;
      const int64_t t0 = i * g.block;
      run_block(g, x, u, b, z, t0, std::min(g.block, g.tiles - t0), v, m, y);
    } catch (const std::exception& e) {  // scratch that could not be allocated
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.empty()) error = std::string("Winograd convolution: ") + e.what();
    }
  });
  if (!error.empty()) return Status::Error(error);
  return Status::Ok();
}

}  // namespace epifuse
