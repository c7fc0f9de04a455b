#include "nchw_to_nhwc.h"

#include <algorithm>
#include <string>

namespace epifuse {
namespace {

// One row: y[w*C + c] = planes[c][w]. With C fixed the compiler keeps C read streams and writes y
// sequentially (shuffles, no scatter); the generic loop serves C > 8.
template <class E, int C>
void interleave_row(const E* x, E* y, int64_t plane, int64_t W) {
  for (int64_t w = 0; w < W; ++w) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) y[w * C + c] = x[c * plane + w];
  }
}

template <class E>
void interleave_row_any(const E* x, E* y, int64_t plane, int64_t W, int64_t C) {
  for (int64_t w = 0; w < W; ++w)
    for (int64_t c = 0; c < C; ++c) y[w * C + c] = x[c * plane + w];
}

template <class E>
using RowFn = void (*)(const E*, E*, int64_t, int64_t);

template <class E>
RowFn<E> row_function(int64_t C) {
  switch (C) {
    case 1: return interleave_row<E, 1>;
    case 2: return interleave_row<E, 2>;
    case 3: return interleave_row<E, 3>;
    case 4: return interleave_row<E, 4>;
    case 5: return interleave_row<E, 5>;
    case 6: return interleave_row<E, 6>;
    case 7: return interleave_row<E, 7>;
    case 8: return interleave_row<E, 8>;
    default: return nullptr;
  }
}

template <class E>
void transpose(const E* x, E* y, int64_t N, int64_t C, int64_t H, int64_t W, const ParallelFor& parallel) {
  const int64_t plane = H * W;
  const RowFn<E> row = row_function<E>(C);
  // Chunks of rows, a few per thread's share, so each task moves tens of kilobytes at least.
  const int64_t rows = N * H;
  const int64_t rows_per_task = std::max<int64_t>(1, (16384 / std::max<int64_t>(1, W * C)));
  const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  parallel(tasks, [&](int64_t t) {
    const int64_t end = std::min(rows, (t + 1) * rows_per_task);
    for (int64_t r = t * rows_per_task; r < end; ++r) {
      const int64_t n = r / H, h = r % H;
      const E* xr = x + n * C * plane + h * W;
      E* yr = y + (n * plane + h * W) * C;
      if (row)
        row(xr, yr, plane, W);
      else
        interleave_row_any(xr, yr, plane, W, C);
    }
  });
}

}  // namespace

Status nchw_to_nhwc_cpu(const void* x, void* y, int64_t N, int64_t C, int64_t H, int64_t W, size_t element_size,
                        const ParallelFor& parallel) {
  if (N < 0 || C < 0 || H < 0 || W < 0) return Status::Error("negative dimension");
  if (N == 0 || C == 0 || H == 0 || W == 0) return Status::Ok();
  switch (element_size) {
    case 4:
      transpose(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), N, C, H, W, parallel);
      return Status::Ok();
    case 2:
      transpose(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), N, C, H, W, parallel);
      return Status::Ok();
    default:
      return Status::Error("element size " + std::to_string(element_size) + " (only 2 and 4 bytes)");
  }
}

}  // namespace epifuse
