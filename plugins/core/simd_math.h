// Vectorized fp32 math shared by the CPU kernels' epilogues: e^x and SiLU, 16 lanes (AVX-512F)
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

namespace epifuse {
namespace simd {

// e^x, x clamped to [kExpMin, kExpMax]: Cody-Waite reduction by ln 2 (kLn2Hi + kLn2Lo) and Cephes' expf
// polynomial (relative error ~1e-7; kExpPoly highest degree first), shared by the AVX-512 and AVX2 twins.
constexpr float kExpMin = -87.3f, kExpMax = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// AVX-512: the power of two applied by vscalefps.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (size_t i = 1; i < std::size(kExpPoly); ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
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
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
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
};

}  // namespace simd
}  // namespace epifuse
