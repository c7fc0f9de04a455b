#include "channel_mean.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "bf16_vectors.h"
#include "cpu_isa.h"
#include "float_types.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Rows of one piece of work: about 256 KB of X. Few pieces: 64 KB ones (9 for a 14x14x672 image) lost
// more to hand-offs and partial sums on two threads than they gained.
constexpr int64_t kPieceFloats = 1 << 16;
// Below this many elements of an image the sums run on the calling thread (a hand-off costs a few us).
constexpr int64_t kMinFloatsToSplit = 1 << 17;
// Channel vectors summed at once: accumulators in registers while the rows stream past.
constexpr int64_t kVectorsAtOnce = 8;

// sums[c] = the sum of x's `rows` rows (`stride` floats apart) at column c, for V vectors of columns from x
// (the last of them masked by `last`). A few vectors alone are summed over U rows at once, so that the
// additions to one accumulator do not wait on each other.
template <int V>
EPIFUSE_AVX512 void sum_vectors_avx512(const float* x, float* sums, int64_t rows, int64_t stride, __mmask16 last) {
  constexpr int U = V <= 2 ? 4 : V <= 4 ? 2 : 1;
  __m512 acc[U][V];
  for (auto& row_acc : acc)
    for (auto& a : row_acc) a = _mm512_setzero_ps();
  int64_t r = 0;
  for (; r + U <= rows; r += U, x += U * stride)
    for (int u = 0; u < U; ++u) {
      for (int v = 0; v + 1 < V; ++v) acc[u][v] = _mm512_add_ps(acc[u][v], _mm512_loadu_ps(x + u * stride + 16 * v));
      acc[u][V - 1] = _mm512_add_ps(acc[u][V - 1], _mm512_maskz_loadu_ps(last, x + u * stride + 16 * (V - 1)));
    }
  for (; r < rows; ++r, x += stride) {
    for (int v = 0; v + 1 < V; ++v) acc[0][v] = _mm512_add_ps(acc[0][v], _mm512_loadu_ps(x + 16 * v));
    acc[0][V - 1] = _mm512_add_ps(acc[0][V - 1], _mm512_maskz_loadu_ps(last, x + 16 * (V - 1)));
  }
  for (int u = 1; u < U; ++u)
    for (int v = 0; v < V; ++v) acc[0][v] = _mm512_add_ps(acc[0][v], acc[u][v]);
  for (int v = 0; v + 1 < V; ++v) _mm512_storeu_ps(sums + 16 * v, acc[0][v]);
  _mm512_mask_storeu_ps(sums + 16 * (V - 1), last, acc[0][V - 1]);
}

// Rows of more than kVectorsAtOnce vectors: the rows stream past in order, four at a time, their sum
// added to `sums` in L1.
EPIFUSE_AVX512 void sum_long_rows_avx512(const float* x, float* sums, int64_t rows, int64_t C, int64_t stride) {
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (C - full)) - 1);
  std::fill(sums, sums + C, 0.f);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4, x += 4 * stride) {
    int64_t c = 0;
    for (; c < full; c += 16) {
      const __m512 a = _mm512_add_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(x + stride + c));
      const __m512 b = _mm512_add_ps(_mm512_loadu_ps(x + 2 * stride + c), _mm512_loadu_ps(x + 3 * stride + c));
      _mm512_storeu_ps(sums + c, _mm512_add_ps(_mm512_loadu_ps(sums + c), _mm512_add_ps(a, b)));
    }
    if (tail) {
      const __m512 a =
          _mm512_add_ps(_mm512_maskz_loadu_ps(tail, x + c), _mm512_maskz_loadu_ps(tail, x + stride + c));
      const __m512 b = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, x + 2 * stride + c),
                                     _mm512_maskz_loadu_ps(tail, x + 3 * stride + c));
      const __m512 old = _mm512_maskz_loadu_ps(tail, sums + c);
      _mm512_mask_storeu_ps(sums + c, tail, _mm512_add_ps(old, _mm512_add_ps(a, b)));
    }
  }
  for (; r < rows; ++r, x += stride) {
    int64_t c = 0;
    for (; c < full; c += 16)
      _mm512_storeu_ps(sums + c, _mm512_add_ps(_mm512_loadu_ps(sums + c), _mm512_loadu_ps(x + c)));
    if (tail) {
      const __m512 old = _mm512_maskz_loadu_ps(tail, sums + c);
      _mm512_mask_storeu_ps(sums + c, tail, _mm512_add_ps(old, _mm512_maskz_loadu_ps(tail, x + c)));
    }
  }
}

EPIFUSE_AVX512 void sum_rows_avx512(const float* x, float* sums, int64_t rows, int64_t C, int64_t stride) {
  if (C > 16 * kVectorsAtOnce) return sum_long_rows_avx512(x, sums, rows, C, stride);
  using Block = void (*)(const float*, float*, int64_t, int64_t, __mmask16);
  static constexpr Block kBlocks[kVectorsAtOnce] = {
      sum_vectors_avx512<1>, sum_vectors_avx512<2>, sum_vectors_avx512<3>, sum_vectors_avx512<4>,
      sum_vectors_avx512<5>, sum_vectors_avx512<6>, sum_vectors_avx512<7>, sum_vectors_avx512<8>};
  for (int64_t c = 0; c < C; c += 16 * kVectorsAtOnce) {
    const int64_t vectors = std::min<int64_t>(kVectorsAtOnce, (C - c + 15) / 16);
    const int64_t in_last = C - c - 16 * (vectors - 1);  // 1..16 columns in the block's last vector
    const __mmask16 last = in_last >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << in_last) - 1);
    kBlocks[vectors - 1](x + c, sums + c, rows, stride, last);
  }
}

EPIFUSE_AVX2 void sum_rows_avx2(const float* x, float* sums, int64_t rows, int64_t C, int64_t stride) {
  int64_t c = 0;
  for (; c + 8 * kVectorsAtOnce <= C; c += 8 * kVectorsAtOnce) {
    __m256 acc[kVectorsAtOnce];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const float* row = x + c;
    for (int64_t r = 0; r < rows; ++r, row += stride)
      for (int64_t v = 0; v < kVectorsAtOnce; ++v) acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(row + 8 * v));
    for (int64_t v = 0; v < kVectorsAtOnce; ++v) _mm256_storeu_ps(sums + c + 8 * v, acc[v]);
  }
  for (; c + 8 <= C; c += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) a = _mm256_add_ps(a, _mm256_loadu_ps(x + r * stride + c));
    _mm256_storeu_ps(sums + c, a);
  }
  for (; c < C; ++c) {
    float a = 0.f;
    for (int64_t r = 0; r < rows; ++r) a += x[r * stride + c];
    sums[c] = a;
  }
}

template <class T>
void sum_rows_plain(const T* x, float* sums, int64_t rows, int64_t C, int64_t stride) {
  std::fill(sums, sums + C, 0.f);
  for (int64_t r = 0; r < rows; ++r, x += stride)
    for (int64_t c = 0; c < C; ++c) sums[c] += to_float(x[c]);
}

// bfloat16 rows, widened to fp32 as they are loaded and summed in fp32, four rows at a time into L1 sums.
EPIFUSE_AVX512 void sum_rows_bf16_avx512(const bfloat16_t* x, float* sums, int64_t rows, int64_t C, int64_t stride) {
  const int64_t full = C / 16 * 16;
  std::fill(sums, sums + C, 0.f);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4, x += 4 * stride) {
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 a = _mm512_add_ps(load_bf16x16(x + c), load_bf16x16(x + stride + c));
      const __m512 b = _mm512_add_ps(load_bf16x16(x + 2 * stride + c), load_bf16x16(x + 3 * stride + c));
      _mm512_storeu_ps(sums + c, _mm512_add_ps(_mm512_loadu_ps(sums + c), _mm512_add_ps(a, b)));
    }
    for (int64_t c = full; c < C; ++c)
      sums[c] += (to_float(x[c]) + to_float(x[stride + c])) + (to_float(x[2 * stride + c]) + to_float(x[3 * stride + c]));
  }
  for (; r < rows; ++r, x += stride) {
    for (int64_t c = 0; c < full; c += 16)
      _mm512_storeu_ps(sums + c, _mm512_add_ps(_mm512_loadu_ps(sums + c), load_bf16x16(x + c)));
    for (int64_t c = full; c < C; ++c) sums[c] += to_float(x[c]);
  }
}

// (x, sums, rows, C, stride): sums[c] over `rows` rows of C values, `stride` elements apart.
using SumFn = void (*)(const float*, float*, int64_t, int64_t, int64_t);
using SumBf16Fn = void (*)(const bfloat16_t*, float*, int64_t, int64_t, int64_t);

SumFn sum_fn_for(const float*) {
  const VectorIsa isa = best_vector_isa();
  return isa == VectorIsa::kAvx512 ? sum_rows_avx512 : isa == VectorIsa::kAvx2 ? sum_rows_avx2
                                                                                : sum_rows_plain<float>;
}

SumBf16Fn sum_fn_for(const bfloat16_t*) {
  return best_vector_isa() == VectorIsa::kAvx512 ? sum_rows_bf16_avx512 : sum_rows_plain<bfloat16_t>;
}

template <class T>
Status mean_of(const T* x, T* y, int64_t N, int64_t pixels, int64_t C, const ParallelFor& parallel) {
  if (N < 0 || pixels < 0 || C < 0) return Status::Error("negative dimension");
  if (N == 0 || C == 0) return Status::Ok();
  if (pixels == 0) {  // the mean of nothing, as ReduceMean gives it: 0/0
    std::fill(y, y + N * C, from_float<T>(std::numeric_limits<float>::quiet_NaN()));
    return Status::Ok();
  }
  const auto sum_fn = sum_fn_for(x);
  const float scale = 1.f / static_cast<float>(pixels);
  const int64_t per_piece = std::max<int64_t>(1, kPieceFloats / C);
  const int64_t pieces = (pixels + per_piece - 1) / per_piece;
  std::vector<float> partial, narrow(std::is_same_v<T, float> ? 0 : static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    const T* image = x + n * pixels * C;
    float* mean = narrow.empty() ? reinterpret_cast<float*>(y + n * C) : narrow.data();  // fp32 sums
    if (pixels * C < kMinFloatsToSplit || pieces < 2) {
      sum_fn(image, mean, pixels, C, C);
    } else {
      partial.resize(static_cast<size_t>(pieces * C));
      parallel(pieces, [&](int64_t i) {
        const int64_t p0 = i * per_piece;
        sum_fn(image + p0 * C, partial.data() + i * C, std::min(per_piece, pixels - p0), C, C);
      });
      std::copy(partial.begin(), partial.begin() + C, mean);
      for (int64_t i = 1; i < pieces; ++i)
        for (int64_t c = 0; c < C; ++c) mean[c] += partial[i * C + c];
    }
    for (int64_t c = 0; c < C; ++c) mean[c] *= scale;
    if (!narrow.empty())
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = from_float<T>(mean[c]);
  }
  return Status::Ok();
}

}  // namespace

Status channel_mean_cpu(const float* x, float* y, int64_t N, int64_t pixels, int64_t C, const ParallelFor& parallel) {
  return mean_of(x, y, N, pixels, C, parallel);
}

void channel_sums_cpu(const float* x, int64_t stride, float* sums, int64_t rows, int64_t C) {
  sum_fn_for(x)(x, sums, rows, C, stride);
}

Status channel_mean_cpu(const bfloat16_t* x, bfloat16_t* y, int64_t N, int64_t pixels, int64_t C,
                        const ParallelFor& parallel) {
  return mean_of(x, y, N, pixels, C, parallel);
}

}  // namespace epifuse
