// Vectorized fp32 math shared by the CPU kernels' epilogues: e^x, SiLU and GELU, 16 lanes (AVX-512F)
// and 8 lanes (AVX2 + FMA). Each function carries its target attribute, so callers compiled for the
// baseline ISA may call them only after checking the CPU (__builtin_cpu_supports).
#pragma once

// GCC 12's AVX-512 intrinsics read a deliberately undefined register (_mm512_undefined_ps) that
// -Wmaybe-uninitialized reports at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "cpu_isa.h"

namespace epifuse {
namespace simd {

// e^x, x clamped to [kExpMin, kExpMax]: Cody-Waite reduction by ln 2 (kLn2Hi + kLn2Lo), then a degree-5
// polynomial for e^r on |r| <= ln2/2 (relative minimax with the constant term 1, highest degree first;
// 1.7e-7 relative error evaluated in fp32). Five FMAs where Cephes' expf form takes eight ops: on Zen 4,
// whose 512-bit ops issue at one a cycle, SiLU went from 15.3 to 13.0 cycles a vector.
constexpr float kExpMin = -87.3f, kExpMax = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {8.2903131843e-3f, 4.1897930205e-2f, 1.6667635739e-1f,
                              4.9999150634e-1f, 9.9999970198e-1f, 1.f};

// AVX-512: the power of two applied by vscalefps.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (size_t i = 1; i < std::size(kExpPoly); ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);
}

// x * sigmoid(x) = x / (1 + e^-x); a NaN x stays NaN through the numerator.
__attribute__((target("avx512f"))) inline __m512 silu16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.f)));
}

// 1 / (1 + e^-x); a NaN x gives NaN (exp16's clamp alone would turn it into a number).
__attribute__((target("avx512f"))) inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  const __m512 s = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(e, _mm512_set1_ps(1.f)));
  return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// The same on AVX2 + FMA (Zen 3, Haswell to Ice Lake clients): 8 lanes, the power of two built in
// the exponent bits (n is in [-126, 127] after the clamp, so 2^n is a normal float).
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (size_t i = 1; i < std::size(kExpPoly); ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma"))) inline __m256 silu8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.f)));
}

__attribute__((target("avx2,fma"))) inline __m256 sigmoid8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  const __m256 s = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(e, _mm256_set1_ps(1.f)));
  return _mm256_blendv_ps(s, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// erf on [0, 4) in equal pieces, a polynomial in the offset v in [0, 1) within each (fit to Chebyshev
// nodes in double precision, highest degree first; the piece's coefficients picked by a lane permute),
// 1 beyond (erf(4) is 1 - 1.5e-8). Absolute error <= 7e-8 (16 pieces of degree 5, or 8 of degree 7
// for AVX2's 8-entry permutes). No division, no e^x: ~20 vector ops against ~30 with a divide in
// oneDNN's gelu_erf post-op.
constexpr float kErf16[6][16] = {
    {1.011011045e-04f, 4.426371743e-05f, -2.640115599e-05f, -6.514534471e-05f,
     -5.962989235e-05f, -2.992572445e-05f, -2.249385034e-06f, 1.106242962e-05f,
     1.215251541e-05f, 8.164629435e-06f, 4.137135875e-06f, 1.687224199e-06f,
     5.705734338e-07f, 1.626775230e-07f, 3.951193150e-08f, 8.233009829e-09f},
    {1.356711982e-05f, 5.354846362e-04f, 7.515219622e-04f, 6.009594072e-04f,
     2.597589919e-04f, -4.230521881e-05f, -1.872710127e-04f, -1.923552045e-04f,
     -1.335178531e-04f, -7.199752872e-05f, -3.169823685e-05f, -1.167337450e-05f,
     -3.646087634e-06f, -9.744509271e-07f, -2.241877866e-07f, -4.459280589e-08f},
    {-5.884859711e-03f, -4.851550795e-03f, -2.306959825e-03f, 4.128139990e-04f,
     2.167842351e-03f, 2.627206035e-03f, 2.174570691e-03f, 1.410837867e-03f,
     7.528701681e-04f, 3.381226852e-04f, 1.294642861e-04f, 4.260404967e-05f,
     1.211515792e-05f, 2.988473170e-06f, 6.412667517e-07f, 1.199585711e-07f},
    {1.965182264e-06f, -1.655782014e-02f, -2.745768800e-02f, -3.013613448e-02f,
     -2.594563551e-02f, -1.848042756e-02f, -1.115122531e-02f, -5.772739183e-03f,
     -2.583218971e-03f, -1.004078425e-03f, -3.401244467e-04f, -1.006456077e-04f,
     -2.606109047e-05f, -5.912930192e-06f, -1.176708793e-06f, -2.055618467e-07f},
    {2.820946276e-01f, 2.650031149e-01f, 2.196952850e-01f, 1.607326716e-01f,
     1.037769988e-01f, 5.913047120e-02f, 2.973270044e-02f, 1.319378801e-02f,
     5.166732706e-03f, 1.785553177e-03f, 5.445513525e-04f, 1.465591195e-04f,
     3.480915984e-05f, 7.295910109e-06f, 1.349488457e-06f, 2.202729519e-07f},
    {2.470240235e-09f, 2.763263881e-01f, 5.204998851e-01f, 7.111556530e-01f,
     8.427007794e-01f, 9.229001403e-01f, 9.661051631e-01f, 9.866716862e-01f,
     9.953222871e-01f, 9.985373020e-01f, 9.995930195e-01f, 9.998993874e-01f,
     9.999778867e-01f, 9.999957085e-01f, 9.999992847e-01f, 9.999998808e-01f},
};
constexpr float kErf8[8][8] = {
    {-1.234623051e-04f, 1.397281158e-04f, 2.925916669e-05f, -4.635180449e-05f,
     -5.637143659e-06f, 4.967263521e-06f, 1.356238386e-06f, 1.339472249e-07f},
    {-1.825705549e-04f, -9.044023464e-04f, 2.194258559e-04f, 3.036304552e-04f,
     -2.369950380e-05f, -4.344568515e-05f, -9.024408428e-06f, -7.921479437e-07f},
    {3.697021632e-03f, 3.166011884e-04f, -2.286468167e-03f, -4.607173032e-04f,
     4.338204453e-04f, 1.903930242e-04f, 2.975386997e-05f, 2.246033773e-06f},
    {-8.436001372e-05f, 1.140592154e-02f, 4.382064566e-03f, -2.790627303e-03f,
     -2.164031845e-03f, -5.383999087e-04f, -6.436224066e-05f, -4.092132258e-06f},
    {-4.699364677e-02f, -1.829945110e-02f, 1.728145778e-02f, 1.734503917e-02f,
     6.030656863e-03f, 1.043613069e-03f, 9.841064457e-05f, 5.252832125e-06f},
    {-2.825220918e-06f, -1.098488197e-01f, -1.037750468e-01f, -4.459900782e-02f,
     -1.033383422e-02f, -1.361407340e-03f, -1.044119199e-04f, -4.720373909e-06f},
    {5.641897321e-01f, 4.393913448e-01f, 2.075536549e-01f, 5.946515128e-02f,
     1.033350825e-02f, 1.089141122e-03f, 6.962521729e-05f, 2.699522156e-06f},
    {-1.062115507e-09f, 5.204998851e-01f, 8.427007794e-01f, 9.661051631e-01f,
     9.953222871e-01f, 9.995930195e-01f, 9.999778867e-01f, 9.999992847e-01f},
};
constexpr float kInvSqrt2 = 0.70710678118654752f;

// GELU, 0.5 x (1 + erf(x / sqrt 2)), as the exporters' Div/Erf/Add/Mul/Mul computes it (so -inf gives
// NaN as there); a NaN x stays NaN (the clamp's min returns the bound, and x multiplies the result).
__attribute__((target("avx512f"))) inline __m512 gelu16(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(kInvSqrt2));
  const __m512 a = _mm512_abs_ps(t);
  const __m512 s = _mm512_min_ps(_mm512_mul_ps(a, _mm512_set1_ps(4.f)), _mm512_set1_ps(15.999999f));
  const __m512i piece = _mm512_cvttps_epi32(s);
  const __m512 v = _mm512_sub_ps(s, _mm512_cvtepi32_ps(piece));
  __m512 r = _mm512_permutexvar_ps(piece, _mm512_loadu_ps(kErf16[0]));
  for (size_t d = 1; d < std::size(kErf16); ++d)
    r = _mm512_fmadd_ps(r, v, _mm512_permutexvar_ps(piece, _mm512_loadu_ps(kErf16[d])));
  const __m512 sign = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32(INT32_MIN)));
  r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_castps_si512(sign)));  // erf(t)
  const __m512 half_x = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half_x, r, half_x);
}

__attribute__((target("avx2,fma"))) inline __m256 gelu8(__m256 x) {
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(kInvSqrt2));
  const __m256 sign = _mm256_and_ps(t, _mm256_set1_ps(-0.f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.f), t);
  const __m256 s = _mm256_min_ps(_mm256_mul_ps(a, _mm256_set1_ps(2.f)), _mm256_set1_ps(7.9999995f));
  const __m256i piece = _mm256_cvttps_epi32(s);
  const __m256 v = _mm256_sub_ps(s, _mm256_cvtepi32_ps(piece));
  __m256 r = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kErf8[0]), piece);
  for (size_t d = 1; d < std::size(kErf8); ++d)
    r = _mm256_fmadd_ps(r, v, _mm256_permutevar8x32_ps(_mm256_loadu_ps(kErf8[d]), piece));
  r = _mm256_or_ps(r, sign);
  const __m256 half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(half_x, r, half_x);
}

#define EPIFUSE_AVX512 __attribute__((target("avx512f")))
#define EPIFUSE_AVX2 __attribute__((target("avx2,fma")))

// A GEMM register tile: `rows` rows x `vectors` vectors of output channels of accumulators.
struct GemmShape {
  int rows, vectors;
};

// The vector operations the CPU kernels' .inc sources are written against, one struct per ISA:
// 16 lanes with AVX-512F, 8 with AVX2 + FMA. Masks select the first lanes of a row's last vector.
struct Avx512 {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kLanes = 16;
  // At most 25 of the 32 zmm registers as accumulators, the rest for the filter vectors and the
  // broadcast input; wider layers in column blocks of 4 vectors, the last narrower.
  static GemmShape gemm_shape(int64_t k_vectors) {
    static const GemmShape shapes[] = {{14, 1}, {12, 2}, {8, 3}, {6, 4}, {5, 5}};
    return k_vectors <= 5 ? shapes[k_vectors - 1] : GemmShape{6, 4};
  }
  EPIFUSE_AVX512 static Mask tail(int64_t n) {  // the first min(n, 16) lanes
    return n >= kLanes ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << n) - 1);
  }
  EPIFUSE_AVX512 static F zero() { return _mm512_setzero_ps(); }
  EPIFUSE_AVX512 static F set1(float a) { return _mm512_set1_ps(a); }
  EPIFUSE_AVX512 static F load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  EPIFUSE_AVX512 static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  EPIFUSE_AVX512 static F load_masked(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  EPIFUSE_AVX512 static void store(float* p, F a) { _mm512_store_ps(p, a); }
  EPIFUSE_AVX512 static void store_masked(float* p, Mask m, F a) { _mm512_mask_storeu_ps(p, m, a); }
  EPIFUSE_AVX512 static F add(F a, F b) { return _mm512_add_ps(a, b); }
  EPIFUSE_AVX512 static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  EPIFUSE_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  EPIFUSE_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  EPIFUSE_AVX512 static F max(F a, F b) { return _mm512_max_ps(a, b); }
  EPIFUSE_AVX512 static F min(F a, F b) { return _mm512_min_ps(a, b); }
  EPIFUSE_AVX512 static F where_negative(F x, F a) {  // a where x < 0, else x
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero(), _CMP_LT_OQ), a);
  }
  EPIFUSE_AVX512 static F sigmoid(F x) { return simd::sigmoid16(x); }
  EPIFUSE_AVX512 static F silu(F x) { return simd::silu16(x); }
  EPIFUSE_AVX512 static F gelu(F x) { return simd::gelu16(x); }
};

struct Avx2 {
  using F = __m256;
  // vmaskmovps is slow on AMD cores (a masked store is microcoded on Zen 3 and 4), so the mask also says
  // whether every lane is on, and a whole vector takes the plain load or store.
  struct Mask {
    __m256i lanes;
    bool all;
  };
  static constexpr int64_t kLanes = 8;
  // 16 ymm registers: 6 rows x 2 vectors (MLAS's AVX2 SGEMM tile), a last odd vector 6 x 1.
  static GemmShape gemm_shape(int64_t) { return {6, 2}; }
  EPIFUSE_AVX2 static Mask tail(int64_t n) {  // lane j on where j < n
    return {_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, kLanes))),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            n >= kLanes};
  }
  EPIFUSE_AVX2 static F zero() { return _mm256_setzero_ps(); }
  EPIFUSE_AVX2 static F set1(float a) { return _mm256_set1_ps(a); }
  EPIFUSE_AVX2 static F load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  EPIFUSE_AVX2 static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  EPIFUSE_AVX2 static F load_masked(Mask m, const float* p) {
    return m.all ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m.lanes);
  }
  EPIFUSE_AVX2 static void store(float* p, F a) { _mm256_store_ps(p, a); }
  EPIFUSE_AVX2 static void store_masked(float* p, Mask m, F a) {
    if (m.all) {
      _mm256_storeu_ps(p, a);
    } else {
      _mm256_maskstore_ps(p, m.lanes, a);
    }
  }
  EPIFUSE_AVX2 static F add(F a, F b) { return _mm256_add_ps(a, b); }
  EPIFUSE_AVX2 static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  EPIFUSE_AVX2 static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  EPIFUSE_AVX2 static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  EPIFUSE_AVX2 static F max(F a, F b) { return _mm256_max_ps(a, b); }
  EPIFUSE_AVX2 static F min(F a, F b) { return _mm256_min_ps(a, b); }
  EPIFUSE_AVX2 static F where_negative(F x, F a) {
    return _mm256_blendv_ps(x, a, _mm256_cmp_ps(x, zero(), _CMP_LT_OQ));
  }
  EPIFUSE_AVX2 static F sigmoid(F x) { return simd::sigmoid8(x); }
  EPIFUSE_AVX2 static F silu(F x) { return simd::silu8(x); }
  EPIFUSE_AVX2 static F gelu(F x) { return simd::gelu8(x); }
};

// Floats a vector of the kernels written for `isa` (AVX-512: 16, AVX2: 8).
inline int64_t lanes_of(VectorIsa isa) { return isa == VectorIsa::kAvx512 ? Avx512::kLanes : Avx2::kLanes; }

}  // namespace simd
}  // namespace epifuse
