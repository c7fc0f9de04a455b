#include "cpu_epilogue.h"

#include "cpu_isa.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// y = act(y) (+ z), 16 floats at a time, the tail masked. `act` is a simd_math function.
template <__m512 (*act)(__m512)>
__attribute__((target("avx512f"))) void pass16(float* y, const float* z, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = act(_mm512_loadu_ps(y + i));
    if (z) v = _mm512_add_ps(v, _mm512_loadu_ps(z + i));
    _mm512_storeu_ps(y + i, v);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = act(_mm512_maskz_loadu_ps(m, y + i));
    if (z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, z + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

template <__m256 (*act)(__m256)>
__attribute__((target("avx2,fma"))) void pass8(float* y, const float* z, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = act(_mm256_loadu_ps(y + i));
    if (z) v = _mm256_add_ps(v, _mm256_loadu_ps(z + i));
    _mm256_storeu_ps(y + i, v);
  }
  if (i < n) {  // the tail, masked: lane j takes part where j < n - i
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lanes);
    __m256 v = act(_mm256_maskload_ps(y + i, m));
    if (z) v = _mm256_add_ps(v, _mm256_maskload_ps(z + i, m));
    _mm256_maskstore_ps(y + i, m, v);
  }
}

bool in_pass(ActivationKind kind) { return kind == ActivationKind::kSilu || kind == ActivationKind::kGelu; }

}  // namespace

bool activation_in_pass(DType dtype, const ConvAttributes& a) {
  return dtype == DType::kFloat && in_pass(a.activation.kind) && (cpu_has_avx512f() || cpu_has_avx2_fma());
}

void activation_pass(const ConvAttributes& a, VectorIsa isa, float* y, const float* z, int64_t n) {
  const bool silu = a.activation.kind == ActivationKind::kSilu;
  if (!in_pass(a.activation.kind)) return;
  if (isa == VectorIsa::kAvx512) {
    (silu ? pass16<simd::silu16> : pass16<simd::gelu16>)(y, z, n);
  } else {
    (silu ? pass8<simd::silu8> : pass8<simd::gelu8>)(y, z, n);
  }
}

}  // namespace epifuse
