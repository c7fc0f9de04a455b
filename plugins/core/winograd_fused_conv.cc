// F(2x2, 3x3) with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5;
// 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]: V = B^T d B per 4x4 input patch, U = G g G^T per filter,
// M = V . U summed over the input channels (16 GEMMs, one per position of the 4x4), Y = A^T M A.
// NHWC puts the channels of a pixel side by side, so every transform works on a vector of channels:
// 16 with AVX-512, 8 with AVX2.
#include "winograd_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// V and M of one block of tiles, sized to stay in a 1 MB L2 (Zen 4, Skylake-SP) beside the filters.
constexpr int64_t kBlockBytes = 192 * 1024;
// Blocks per thread at least, where the layer has that many tiles: evens out ragged ends.
constexpr int64_t kBlocksPerThread = 4;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

int64_t hardware_threads() {  // read once: hardware_concurrency() reads /sys on every call
  static const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  return threads;
}

// A 64-byte-aligned view into a vector of floats, so that every row of Cp or Kp floats starts a
// cache line (AVX-512) or half of one (AVX2).
float* aligned(std::vector<float>& storage, int64_t n) {
  if (storage.size() < static_cast<size_t>(n + 16)) storage.resize(static_cast<size_t>(n + 16));
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  return reinterpret_cast<float*>(round_up(static_cast<int64_t>(address), 64));
}

// The GEMM register tile: `rows` tiles x `vectors` vectors of output channels of accumulators.
struct GemmShape {
  int rows, vectors;
};

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

// U[16][Cp][Kp] from KRSC filters, zero where c >= C or k >= K. In double: the transform's sums
// of three filter taps then round once.
void transform_filters(const Geometry& g, const float* w, float* u) {
  std::fill(u, u + 16 * g.Cp * g.Kp, 0.f);
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

struct Vec {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kLanes = 16;
#define EPIFUSE_WINOGRAD_TARGET __attribute__((target("avx512f")))
  EPIFUSE_WINOGRAD_TARGET static Mask tail(int64_t n) {  // the first min(n, 16) lanes
    return n >= kLanes ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << n) - 1);
  }
  EPIFUSE_WINOGRAD_TARGET static F zero() { return _mm512_setzero_ps(); }
  EPIFUSE_WINOGRAD_TARGET static F set1(float a) { return _mm512_set1_ps(a); }
  EPIFUSE_WINOGRAD_TARGET static F load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  EPIFUSE_WINOGRAD_TARGET static F load_masked(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  EPIFUSE_WINOGRAD_TARGET static void store(float* p, F a) { _mm512_store_ps(p, a); }
  EPIFUSE_WINOGRAD_TARGET static void store_masked(float* p, Mask m, F a) { _mm512_mask_storeu_ps(p, m, a); }
  EPIFUSE_WINOGRAD_TARGET static F add(F a, F b) { return _mm512_add_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  EPIFUSE_WINOGRAD_TARGET static F max(F a, F b) { return _mm512_max_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F min(F a, F b) { return _mm512_min_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F where_negative(F x, F a) {  // a where x < 0, else x
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero(), _CMP_LT_OQ), a);
  }
  EPIFUSE_WINOGRAD_TARGET static F sigmoid(F x) { return simd::sigmoid16(x); }
  EPIFUSE_WINOGRAD_TARGET static F silu(F x) { return simd::silu16(x); }
};

// Register tiles of at most 25 of the 32 zmm accumulators, the rest for the filter vectors and the
// broadcast input; wider layers in column blocks of 4 vectors, the last narrower.
GemmShape gemm_shape(int64_t k_vectors) {
  static const GemmShape shapes[] = {{14, 1}, {12, 2}, {8, 3}, {6, 4}, {5, 5}};
  return k_vectors <= 5 ? shapes[k_vectors - 1] : GemmShape{6, 4};
}
GemmTile gemm_tile_for(GemmShape s);
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
#undef EPIFUSE_WINOGRAD_TARGET

}  // namespace avx512

namespace avx2 {

struct Vec {
  using F = __m256;
  using Mask = __m256i;
  static constexpr int64_t kLanes = 8;
#define EPIFUSE_WINOGRAD_TARGET __attribute__((target("avx2,fma")))
  EPIFUSE_WINOGRAD_TARGET static Mask tail(int64_t n) {  // lane j on where j < n
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, kLanes))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  EPIFUSE_WINOGRAD_TARGET static F zero() { return _mm256_setzero_ps(); }
  EPIFUSE_WINOGRAD_TARGET static F set1(float a) { return _mm256_set1_ps(a); }
  EPIFUSE_WINOGRAD_TARGET static F load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  EPIFUSE_WINOGRAD_TARGET static F load_masked(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  EPIFUSE_WINOGRAD_TARGET static void store(float* p, F a) { _mm256_store_ps(p, a); }
  EPIFUSE_WINOGRAD_TARGET static void store_masked(float* p, Mask m, F a) { _mm256_maskstore_ps(p, m, a); }
  EPIFUSE_WINOGRAD_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  EPIFUSE_WINOGRAD_TARGET static F max(F a, F b) { return _mm256_max_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F min(F a, F b) { return _mm256_min_ps(a, b); }
  EPIFUSE_WINOGRAD_TARGET static F where_negative(F x, F a) {
    return _mm256_blendv_ps(x, a, _mm256_cmp_ps(x, zero(), _CMP_LT_OQ));
  }
  EPIFUSE_WINOGRAD_TARGET static F sigmoid(F x) { return simd::sigmoid8(x); }
  EPIFUSE_WINOGRAD_TARGET static F silu(F x) { return simd::silu8(x); }
};

// 16 ymm registers: 6 rows x 2 vectors of accumulators (MLAS's AVX2 SGEMM tile), a last odd vector 6 x 1.
GemmShape gemm_shape(int64_t) { return {6, 2}; }
GemmTile gemm_tile_for(GemmShape s);
#include "winograd_kernels.inc"
GemmTile gemm_tile_for(GemmShape s) { return s.vectors == 1 ? gemm_tile<6, 1> : gemm_tile<6, 2>; }
#undef EPIFUSE_WINOGRAD_TARGET

}  // namespace avx2

// The widest vector ISA this CPU has, capped by EPIFUSE_CPU_ISA=avx2 (to run the AVX2 kernel on an
// AVX-512 CPU, for tests and comparisons).
WinogradIsa best_isa() {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* cap = std::getenv("EPIFUSE_CPU_ISA");
  if (avx512 && !(cap && std::strcmp(cap, "avx2") == 0)) return WinogradIsa::kAvx512;
  return avx2 ? WinogradIsa::kAvx2 : WinogradIsa::kNone;
}

Geometry geometry(const ConvProblem& p, WinogradIsa isa) {
  return isa == WinogradIsa::kAvx512 ? Geometry(p, avx512::Vec::kLanes, avx512::gemm_shape)
                                     : Geometry(p, avx2::Vec::kLanes, avx2::gemm_shape);
}

}  // namespace

struct WinogradConv::Filters {
  std::vector<float> storage;
  const float* u = nullptr;  // U[16][Cp][Kp], 64-byte aligned inside storage
};

WinogradConv::WinogradConv() : isa_(best_isa()) {}

bool WinogradConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && p.R == 3 && p.S == 3 && a.stride_h == 1 && a.stride_w == 1 &&
         a.dil_h == 1 && a.dil_w == 1 && a.group == 1 && p.C > 0 && p.K > 0 && isa_ != WinogradIsa::kNone;
}

std::string WinogradConv::name() const {
  return isa_ == WinogradIsa::kAvx512 ? "winograd F(2x2,3x3) avx512" : "winograd F(2x2,3x3) avx2";
}

Status WinogradConv::run(const ConvProblem& p, const float* x, const float* w, bool w_constant, const float* b,
                         const float* z, float* y, const ParallelFor& parallel_for) {
  if (!supports(p)) return Status::Error("the Winograd kernel does not run this problem");
  const Geometry g = geometry(p, isa_);
  if (g.tiles == 0) return Status::Ok();

  // Constant filters are transformed once; others on every call.
  std::shared_ptr<const Filters> filters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (w_constant && filters_source_ == w) filters = filters_;
  }
  if (!filters) {
    auto made = std::make_shared<Filters>();
    float* u = aligned(made->storage, 16 * g.Cp * g.Kp);
    transform_filters(g, w, u);
    made->u = u;
    filters = made;
    if (w_constant) {
      std::lock_guard<std::mutex> lock(mutex_);
      filters_ = filters;
      filters_source_ = w;
    }
  }
  const float* u = filters->u;
  const auto run_block = isa_ == WinogradIsa::kAvx512 ? avx512::run_block : avx2::run_block;

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
