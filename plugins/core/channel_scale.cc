#include "channel_scale.h"

#include <algorithm>

#include "bf16_vectors.h"
#include "cpu_isa.h"
#include "float_types.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Pixels of one piece of work: about 64 KB of float X, so a piece stays in the core's cache.
constexpr int64_t kPieceFloats = 1 << 14;
// Below this many elements the product runs on the calling thread, as ORT runs its Mul there: handing
// a 7x7x1152 scale (14 us) to a second thread cost more than it saved.
constexpr int64_t kMinFloatsToSplit = 1 << 17;

EPIFUSE_AVX512 void scale_rows_avx512(const float* x, const float* s, float* y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) _mm512_storeu_ps(y + c, _mm512_mul_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(s + c)));
    if (c < C) {
      const __mmask16 m = static_cast<__mmask16>((1u << (C - c)) - 1);
      _mm512_mask_storeu_ps(y + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + c), _mm512_maskz_loadu_ps(m, s + c)));
    }
  }
}

EPIFUSE_AVX2 void scale_rows_avx2(const float* x, const float* s, float* y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(s + c)));
    for (; c < C; ++c) y[c] = x[c] * s[c];
  }
}

template <class T>
void scale_rows_plain(const T* x, const T* s, T* y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r, x += C, y += C)
    for (int64_t c = 0; c < C; ++c) y[c] = from_float<T>(to_float(x[c]) * to_float(s[c]));
}

// bfloat16: each product in fp32 and rounded once to nearest even, as the plain loop does.
EPIFUSE_AVX512 void scale_rows_bf16_avx512(const bfloat16_t* x, const bfloat16_t* s, bfloat16_t* y, int64_t rows,
                                           int64_t C) {
  for (int64_t r = 0; r < rows; ++r, x += C, y += C) {
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) store_bf16x16(y + c, _mm512_mul_ps(load_bf16x16(x + c), load_bf16x16(s + c)));
    for (; c < C; ++c) y[c] = from_float<bfloat16_t>(to_float(x[c]) * to_float(s[c]));
  }
}

template <class T>
using RowsFn = void (*)(const T*, const T*, T*, int64_t, int64_t);

RowsFn<float> rows_fn_for(const float*) {
  const VectorIsa isa = best_vector_isa();
  return isa == VectorIsa::kAvx512 ? scale_rows_avx512 : isa == VectorIsa::kAvx2 ? scale_rows_avx2
                                                                                  : scale_rows_plain<float>;
}

RowsFn<bfloat16_t> rows_fn_for(const bfloat16_t*) {
  return best_vector_isa() == VectorIsa::kAvx512 ? scale_rows_bf16_avx512 : scale_rows_plain<bfloat16_t>;
}

template <class T>
Status scale(const T* x, const T* s, T* y, int64_t N, int64_t pixels, int64_t C, bool scales_per_image,
             const ParallelFor& parallel) {
  if (N < 0 || pixels < 0 || C < 0) return Status::Error("negative dimension");
  if (N == 0 || pixels == 0 || C == 0) return Status::Ok();
  const RowsFn<T> rows_fn = rows_fn_for(x);
  if (N * pixels * C < kMinFloatsToSplit) {
    for (int64_t n = 0; n < N; ++n)
      rows_fn(x + n * pixels * C, s + (scales_per_image ? n * C : 0), y + n * pixels * C, pixels, C);
    return Status::Ok();
  }
  const int64_t per_piece = std::max<int64_t>(1, std::min(pixels, kPieceFloats / C));
  const int64_t pieces_per_image = (pixels + per_piece - 1) / per_piece;
  parallel(N * pieces_per_image, [&](int64_t i) {
    const int64_t n = i / pieces_per_image, p0 = (i % pieces_per_image) * per_piece;
    const int64_t rows = std::min(per_piece, pixels - p0), offset = (n * pixels + p0) * C;
    rows_fn(x + offset, s + (scales_per_image ? n * C : 0), y + offset, rows, C);
  });
  return Status::Ok();
}

}  // namespace

Status channel_scale_cpu(const float* x, const float* s, float* y, int64_t N, int64_t pixels, int64_t C,
                         bool scales_per_image, const ParallelFor& parallel) {
  return scale(x, s, y, N, pixels, C, scales_per_image, parallel);
}

Status channel_scale_cpu(const bfloat16_t* x, const bfloat16_t* s, bfloat16_t* y, int64_t N, int64_t pixels,
                         int64_t C, bool scales_per_image, const ParallelFor& parallel) {
  return scale(x, s, y, N, pixels, C, scales_per_image, parallel);
}

}  // namespace epifuse
