// Sixteen bfloat16 values to and from an AVX-512 float vector, with AVX-512F alone (no AVX512-BF16 needed),
// and the first lanes of a mask with AVX512-BW too: widening is exact; narrowing rounds to nearest even
// and keeps NaNs quiet, as from_float<bfloat16_t> does.
#pragma once
#include <immintrin.h>

#include "float_types.h"
#include "simd_math.h"

namespace epifuse {

EPIFUSE_AVX512 inline __m512 load_bf16x16(const bfloat16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The 16 bf16 bit patterns of v, rounded to nearest even (NaNs kept quiet).
EPIFUSE_AVX512 inline __m256i round_to_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

EPIFUSE_AVX512 inline void store_bf16x16(bfloat16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_to_bf16x16(v));
}

#define EPIFUSE_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

EPIFUSE_AVX512BW inline __m512 load_bf16x16_masked(__mmask16 m, const bfloat16_t* p) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

EPIFUSE_AVX512BW inline void store_bf16x16_masked(bfloat16_t* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, round_to_bf16x16(v));
}

}  // namespace epifuse
