// F(2x2, 3x3) with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5;
// 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]: V = B^T d B per 4x4 input patch, U = G g G^T per filter,
// M = V . U summed over the input channels (16 GEMMs, one per position of the 4x4), Y = A^T M A.
// NHWC puts the channels of a pixel side by side, so every transform works on 16 channels a vector.
#include "winograd_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

constexpr int64_t kLanes = 16;
// V and M of one block of tiles, sized to stay in a 1 MB L2 (Zen 4, Skylake-SP) beside the filters.
constexpr int64_t kBlockBytes = 192 * 1024;
// Blocks per thread at least, where the layer has that many tiles: evens out ragged ends.
constexpr int64_t kBlocksPerThread = 4;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

int64_t hardware_threads() {  // read once: hardware_concurrency() reads /sys on every call
  static const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  return threads;
}

bool has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// A 64-byte-aligned view into a vector of floats, so that every row of Cp or Kp floats starts a cache line.
float* aligned(std::vector<float>& storage, int64_t n) {
  if (storage.size() < static_cast<size_t>(n + kLanes)) storage.resize(static_cast<size_t>(n + kLanes));
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  return reinterpret_cast<float*>(round_up(static_cast<int64_t>(address), 64));
}

// The GEMM register tiles: `rows` tiles x `vectors` x 16 output channels of accumulators (at most
// 25 of AVX-512's 32 registers, the rest for the filter vectors and the broadcast input).
struct GemmShape {
  int rows, vectors;
};

GemmShape gemm_shape(int64_t k_vectors) {
  switch (k_vectors) {
    case 1: return {14, 1};
    case 2: return {12, 2};
    case 3: return {8, 3};
    case 4: return {6, 4};
    case 5: return {5, 5};
    default: return {6, 4};  // wider layers: several column blocks of 4 vectors, the last narrower
  }
}

struct Geometry {
  explicit Geometry(const ConvProblem& p)
      : N(p.N), H(p.H), W(p.W), C(p.C), K(p.K), P(p.P()), Q(p.Q()), TP((P + 1) / 2), TQ((Q + 1) / 2),
        tiles(N * TP * TQ), pad_top(p.attr.pad_top), pad_left(p.attr.pad_left), Cp(round_up(C, kLanes)),
        Kp(round_up(K, kLanes)), gemm(gemm_shape(Kp / kLanes)), residual(p.attr.residual),
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

#define EPIFUSE_AVX512 __attribute__((target("avx512f")))

EPIFUSE_AVX512 inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1);
}

// V rows [0, count) of the block: tile t0 + t's 4x4 input patch (zeros outside the image) transformed.
EPIFUSE_AVX512 void input_transform(const Geometry& g, const float* x, int64_t t0, int64_t count, float* v) {
  const int64_t plane = g.block * g.Cp;  // one of the 16 matrices
  for (int64_t t = 0; t < count; ++t) {
    const int64_t tile = t0 + t, n = tile / (g.TP * g.TQ), ty = tile / g.TQ % g.TP, tx = tile % g.TQ;
    const int64_t y0 = 2 * ty - g.pad_top, x0 = 2 * tx - g.pad_left;
    const float* image = x + n * g.H * g.W * g.C;
    for (int64_t c0 = 0; c0 < g.Cp; c0 += kLanes) {
      const __mmask16 mask = tail_mask(g.C - c0);
      __m512 d[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const int64_t yy = y0 + i, xx = x0 + j;
          const bool inside = yy >= 0 && yy < g.H && xx >= 0 && xx < g.W;
          d[i][j] = inside ? _mm512_maskz_loadu_ps(mask, image + (yy * g.W + xx) * g.C + c0) : _mm512_setzero_ps();
        }
      __m512 b[4][4];  // B^T d
      for (int j = 0; j < 4; ++j) {
        b[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        b[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        b[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        b[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      float* out = v + t * g.Cp + c0;
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        _mm512_store_ps(out + (i * 4 + 0) * plane, _mm512_sub_ps(b[i][0], b[i][2]));
        _mm512_store_ps(out + (i * 4 + 1) * plane, _mm512_add_ps(b[i][1], b[i][2]));
        _mm512_store_ps(out + (i * 4 + 2) * plane, _mm512_sub_ps(b[i][2], b[i][1]));
        _mm512_store_ps(out + (i * 4 + 3) * plane, _mm512_sub_ps(b[i][1], b[i][3]));
      }
    }
  }
}

// m[ROWS][VECTORS x 16] = v[ROWS][C] . u[C][VECTORS x 16], the accumulators in registers.
template <int ROWS, int VECTORS>
EPIFUSE_AVX512 void gemm_tile(const float* v, int64_t v_stride, const float* u, int64_t u_stride, float* m,
                              int64_t m_stride, int64_t C) {
  __m512 acc[ROWS][VECTORS];
#pragma GCC unroll 32
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < VECTORS; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    __m512 uc[VECTORS];
#pragma GCC unroll 8
    for (int j = 0; j < VECTORS; ++j) uc[j] = _mm512_load_ps(u + c * u_stride + j * kLanes);
#pragma GCC unroll 32
    for (int r = 0; r < ROWS; ++r) {
      const __m512 vr = _mm512_set1_ps(v[r * v_stride + c]);
#pragma GCC unroll 8
      for (int j = 0; j < VECTORS; ++j) acc[r][j] = _mm512_fmadd_ps(vr, uc[j], acc[r][j]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < VECTORS; ++j) _mm512_store_ps(m + r * m_stride + j * kLanes, acc[r][j]);
}

using GemmTile = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t);

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

// M rows [0, rows) of the block, rows a multiple of the register tile's (rows past the block's
// tiles read V's stale or zero rows and are never transformed out).
void gemms(const Geometry& g, const float* u, const float* v, int64_t rows, float* m) {
  const int64_t k_vectors = g.Kp / kLanes;
  for (int xi = 0; xi < 16; ++xi) {
    const float* vx = v + xi * g.block * g.Cp;
    const float* ux = u + xi * g.Cp * g.Kp;
    float* mx = m + xi * g.block * g.Kp;
    for (int64_t j0 = 0; j0 < k_vectors; j0 += g.gemm.vectors) {
      const GemmShape shape{g.gemm.rows, static_cast<int>(std::min<int64_t>(g.gemm.vectors, k_vectors - j0))};
      const GemmTile tile = gemm_tile_for(shape);
      for (int64_t r0 = 0; r0 < rows; r0 += shape.rows)
        tile(vx + r0 * g.Cp, g.Cp, ux + j0 * kLanes, g.Kp, mx + r0 * g.Kp + j0 * kLanes, g.Kp, g.C);
    }
  }
}

EPIFUSE_AVX512 __m512 activate(const Activation& a, __m512 x) {
  const float p0 = a.params[0], p1 = a.params[1];
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  // max/min return their second operand where one is NaN: a constant goes first so NaN propagates
  switch (a.kind) {
    case ActivationKind::kIdentity: return x;
    case ActivationKind::kRelu: return _mm512_max_ps(zero, x);
    case ActivationKind::kLeakyRelu:
      return _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), x, _mm512_set1_ps(p0));
    case ActivationKind::kClip: return _mm512_min_ps(_mm512_set1_ps(p1), _mm512_max_ps(_mm512_set1_ps(p0), x));
    case ActivationKind::kSigmoid: return simd::sigmoid16(x);
    case ActivationKind::kSilu: return simd::silu16(x);
    case ActivationKind::kHardSigmoid:
      return _mm512_max_ps(zero, _mm512_min_ps(one, _mm512_fmadd_ps(x, _mm512_set1_ps(p0), _mm512_set1_ps(p1))));
    case ActivationKind::kHardSwish: {
      const __m512 gate = _mm512_fmadd_ps(x, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
      return _mm512_mul_ps(x, _mm512_max_ps(zero, _mm512_min_ps(one, gate)));
    }
    default: {  // the rest lane by lane with the reference kernel's functions
      alignas(64) float lanes[kLanes];
      _mm512_store_ps(lanes, x);
      const act::Runtime f = act::runtime(a);
      for (float& value : lanes) value = f(value);
      return _mm512_load_ps(lanes);
    }
  }
}

// Y for the block's tiles from M: A^T M A, then the bias, residual and activation; outputs past
// the map's bottom or right edge (odd P or Q) are not written.
EPIFUSE_AVX512 void output_transform(const Geometry& g, const float* m, const float* bias, const float* z,
                                     int64_t t0, int64_t count, float* y) {
  const int64_t plane = g.block * g.Kp;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t tile = t0 + t, n = tile / (g.TP * g.TQ), ty = tile / g.TQ % g.TP, tx = tile % g.TQ;
    const int64_t rows = std::min<int64_t>(2, g.P - 2 * ty), cols = std::min<int64_t>(2, g.Q - 2 * tx);
    for (int64_t k0 = 0; k0 < g.Kp; k0 += kLanes) {
      const __mmask16 mask = tail_mask(g.K - k0);
      const float* in = m + t * g.Kp + k0;
      __m512 s[2][4];  // A^T M
      for (int j = 0; j < 4; ++j) {
        const __m512 m0 = _mm512_load_ps(in + (0 * 4 + j) * plane), m1 = _mm512_load_ps(in + (1 * 4 + j) * plane);
        const __m512 m2 = _mm512_load_ps(in + (2 * 4 + j) * plane), m3 = _mm512_load_ps(in + (3 * 4 + j) * plane);
        s[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        s[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
      }
      const __m512 b = _mm512_maskz_loadu_ps(mask, bias + k0);
      for (int64_t i = 0; i < rows; ++i) {
        const __m512 out[2] = {_mm512_add_ps(_mm512_add_ps(s[i][0], s[i][1]), s[i][2]),
                               _mm512_sub_ps(_mm512_sub_ps(s[i][1], s[i][2]), s[i][3])};
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t offset = ((n * g.P + 2 * ty + i) * g.Q + 2 * tx + j) * g.K + k0;
          __m512 value = _mm512_add_ps(out[j], b);
          if (g.residual == Residual::kPre) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, z + offset));
          value = activate(g.activation, value);
          if (g.residual == Residual::kPost) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, z + offset));
          _mm512_mask_storeu_ps(y + offset, mask, value);
        }
      }
    }
  }
}

}  // namespace

struct WinogradConv::Filters {
  std::vector<float> storage;
  const float* u = nullptr;  // U[16][Cp][Kp], 64-byte aligned inside storage
};

bool WinogradConv::supports(const ConvProblem& p) {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && p.R == 3 && p.S == 3 && a.stride_h == 1 && a.stride_w == 1 &&
         a.dil_h == 1 && a.dil_w == 1 && a.group == 1 && p.C > 0 && p.K > 0 && has_avx512f();
}

Status WinogradConv::run(const ConvProblem& p, const float* x, const float* w, bool w_constant, const float* b,
                         const float* z, float* y, const ParallelFor& parallel_for) {
  if (!supports(p)) return Status::Error("the Winograd kernel does not run this problem");
  const Geometry g(p);
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

  std::mutex error_mutex;
  std::string error;
  parallel_for(g.blocks, [&](int64_t i) {
    try {
      thread_local std::vector<float> scratch;
      float* v = aligned(scratch, g.scratch_floats());
      float* m = v + 16 * g.block * g.Cp;
      const int64_t t0 = i * g.block, count = std::min(g.block, g.tiles - t0);
      input_transform(g, x, t0, count, v);
      gemms(g, u, v, round_up(count, g.gemm.rows), m);
      output_transform(g, m, b, z, t0, count, y);
    } catch (const std::exception& e) {  // scratch that could not be allocated
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.empty()) error = std::string("Winograd convolution: ") + e.what();
    }
  });
  if (!error.empty()) return Status::Error(error);
  return Status::Ok();
}

}  // namespace epifuse
