#include "layer_norm.h"

#include <algorithm>
#include <cmath>

#include "cpu_isa.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Rows of one piece of work: about 64 KB of X.
constexpr int64_t kPieceFloats = 1 << 14;
// Below this many elements the rows run on the calling thread (a hand-off costs a few us).
constexpr int64_t kMinFloatsToSplit = 1 << 15;

// Two passes for the moments (the mean, then the squares of the centred values), and x - mean before
// the product by 1/std: exact where E[x^2] - E[x]^2, or x/std - mean/std, cancels for rows far from zero.
EPIFUSE_AVX512 void normalize_rows_avx512(const float* x, const float* scale, const float* bias, float* y,
                                          int64_t rows, int64_t C, float epsilon) {
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (C - full)) - 1);
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= full; c += 32) {
      s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + c));
      s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + c + 16));
    }
    if (c < full) s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + c));
    if (tail) s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(tail, x + full));
    const float mean = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / static_cast<float>(C);
    const __m512 m = _mm512_set1_ps(mean);
    s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (c = 0; c + 32 <= full; c += 32) {
      const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + c), m), d1 = _mm512_sub_ps(_mm512_loadu_ps(x + c + 16), m);
      s0 = _mm512_fmadd_ps(d0, d0, s0);
      s1 = _mm512_fmadd_ps(d1, d1, s1);
    }
    if (c < full) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + c), m);
      s0 = _mm512_fmadd_ps(d, d, s0);
    }
    if (tail) {
      const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + full), m);
      s1 = _mm512_fmadd_ps(d, d, s1);
    }
    const float variance = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / static_cast<float>(C);
    const float rstd = 1.f / std::sqrt(variance + epsilon);
    const __m512 a = _mm512_set1_ps(rstd);
    for (c = 0; c < full; c += 16) {
      const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), m), a);
      _mm512_storeu_ps(y + c, bias ? _mm512_fmadd_ps(n, _mm512_loadu_ps(scale + c), _mm512_loadu_ps(bias + c))
                                   : _mm512_mul_ps(n, _mm512_loadu_ps(scale + c)));
    }
    if (tail) {
      const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + full), m), a);
      const __m512 g = _mm512_maskz_loadu_ps(tail, scale + full);
      _mm512_mask_storeu_ps(y + full, tail,
                            bias ? _mm512_fmadd_ps(n, g, _mm512_maskz_loadu_ps(tail, bias + full)) : _mm512_mul_ps(n, g));
    }
  }
}

EPIFUSE_AVX2 float sum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

EPIFUSE_AVX2 void normalize_rows_avx2(const float* x, const float* scale, const float* bias, float* y,
                                      int64_t rows, int64_t C, float epsilon) {
  const int64_t full = C / 8 * 8;
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    __m256 s = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c < full; c += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + c));
    float sum = sum8(s);
    for (; c < C; ++c) sum += x[c];
    const float mean = sum / static_cast<float>(C);
    const __m256 m = _mm256_set1_ps(mean);
    s = _mm256_setzero_ps();
    for (c = 0; c < full; c += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + c), m);
      s = _mm256_fmadd_ps(d, d, s);
    }
    float squares = sum8(s);
    for (; c < C; ++c) squares += (x[c] - mean) * (x[c] - mean);
    const float rstd = 1.f / std::sqrt(squares / static_cast<float>(C) + epsilon);
    const __m256 a = _mm256_set1_ps(rstd);
    for (c = 0; c < full; c += 8) {
      const __m256 n = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), m), a);
      _mm256_storeu_ps(y + c, bias ? _mm256_fmadd_ps(n, _mm256_loadu_ps(scale + c), _mm256_loadu_ps(bias + c))
                                   : _mm256_mul_ps(n, _mm256_loadu_ps(scale + c)));
    }
    for (; c < C; ++c) {
      const float n = (x[c] - mean) * rstd;
      y[c] = bias ? std::fma(n, scale[c], bias[c]) : n * scale[c];
    }
  }
}

void normalize_rows_plain(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t C,
                          float epsilon) {
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    float sum = 0.f, squares = 0.f;
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const float mean = sum / static_cast<float>(C);
    for (int64_t c = 0; c < C; ++c) squares += (x[c] - mean) * (x[c] - mean);
    const float rstd = 1.f / std::sqrt(squares / static_cast<float>(C) + epsilon);
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * scale[c] + (bias ? bias[c] : 0.f);
  }
}

}  // namespace

Status layer_norm_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t C,
                      float epsilon, const ParallelFor& parallel) {
  if (rows < 0 || C < 0) return Status::Error("negative dimension");
  if (rows == 0 || C == 0) return Status::Ok();
  const VectorIsa isa = best_vector_isa();
  const auto rows_fn = isa == VectorIsa::kAvx512 ? normalize_rows_avx512
                       : isa == VectorIsa::kAvx2 ? normalize_rows_avx2 : normalize_rows_plain;
  if (rows * C < kMinFloatsToSplit) {
    rows_fn(x, scale, bias, y, rows, C, epsilon);
    return Status::Ok();
  }
  const int64_t per_piece = std::max<int64_t>(1, kPieceFloats / C);
  parallel((rows + per_piece - 1) / per_piece, [&](int64_t i) {
    const int64_t r0 = i * per_piece;
    rows_fn(x + r0 * C, scale, bias, y + r0 * C, std::min(per_piece, rows - r0), C, epsilon);
  });
  return Status::Ok();
}

}  // namespace epifuse
