// Vectorized fp32 math shared by the CPU kernels' epilogues: e^x and SiLU, 16 lanes (AVX-512F)
// and 8 lanes (AVX2 + FMA). Each function carries its target attribute, so callers compiled for the
// baseline ISA may call them only after checking the CPU (__builtin_cpu_supports).
#pragma once

// GCC 12's AVX-512 intrinsics read a deliberately undefined register (_mm512_undefined_ps) that
// -Wmaybe-uninitialized reports at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstddef>
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

}  // namespace simd
}  // namespace epifuse
