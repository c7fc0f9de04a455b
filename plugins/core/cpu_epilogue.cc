#include "cpu_epilogue.h"

// GCC 12's AVX-512 intrinsics read a deliberately undefined register (_mm512_undefined_ps) that
// -Wmaybe-uninitialized reports at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <iterator>

namespace epifuse {
namespace {

bool has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

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

__attribute__((target("avx512f"))) void silu_pass(float* y, const float* z, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = silu16(_mm512_loadu_ps(y + i));
    if (z) v = _mm512_add_ps(v, _mm512_loadu_ps(z + i));
    _mm512_storeu_ps(y + i, v);
  }
  if (i < n) {  // the tail, masked
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = silu16(_mm512_maskz_loadu_ps(m, y + i));
    if (z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, z + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
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

__attribute__((target("avx2,fma"))) void silu_pass_avx2(float* y, const float* z, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = silu8(_mm256_loadu_ps(y + i));
    if (z) v = _mm256_add_ps(v, _mm256_loadu_ps(z + i));
    _mm256_storeu_ps(y + i, v);
  }
  if (i < n) {  // the tail, masked: lane j takes part where j < n - i
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lanes);
    __m256 v = silu8(_mm256_maskload_ps(y + i, m));
    if (z) v = _mm256_add_ps(v, _mm256_maskload_ps(z + i, m));
    _mm256_maskstore_ps(y + i, m, v);
  }
}

}  // namespace

bool activation_in_pass(DType dtype, const ConvAttributes& a) {
  return dtype == DType::kFloat && a.activation.kind == ActivationKind::kSilu && (has_avx512f() || has_avx2_fma());
}

void activation_pass(const ConvAttributes& a, float* y, const float* z, int64_t n) {
  if (a.activation.kind != ActivationKind::kSilu) return;
  if (has_avx512f()) {
    silu_pass(y, z, n);
  } else {
    silu_pass_avx2(y, z, n);
  }
}

}  // namespace epifuse
