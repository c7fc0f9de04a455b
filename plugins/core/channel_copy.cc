#include "channel_copy.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_isa.h"

namespace epifuse {
namespace {

// Output bytes a piece of work: a hand-off to another thread costs a few microseconds.
constexpr int64_t kPieceBytes = 64 << 10;
// Below this many output bytes the copy runs on the calling thread.
constexpr int64_t kMinBytesToSplit = 256 << 10;

// Copies `rows` rows of `bytes` from src (rows `src_stride` bytes apart) into dst (`dst_stride` apart).
__attribute__((target("avx512f,avx512bw"))) void copy_rows_avx512(const char* src, int64_t src_stride, char* dst,
                                                                 int64_t dst_stride, int64_t rows, int64_t bytes) {
  const int64_t full = bytes / 64 * 64;
  const __mmask64 tail = bytes == full ? 0 : (~0ULL >> (64 - (bytes - full)));
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += dst_stride) {
    for (int64_t b = 0; b < full; b += 64) _mm512_storeu_si512(dst + b, _mm512_loadu_si512(src + b));
    if (tail) _mm512_mask_storeu_epi8(dst + full, tail, _mm512_maskz_loadu_epi8(tail, src + full));
  }
}

__attribute__((target("avx2"))) void copy_rows_avx2(const char* src, int64_t src_stride, char* dst,
                                                    int64_t dst_stride, int64_t rows, int64_t bytes) {
  const int64_t full = bytes / 32 * 32;
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += dst_stride) {
    for (int64_t b = 0; b < full; b += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + b),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + b)));
    std::memcpy(dst + full, src + full, static_cast<size_t>(bytes - full));
  }
}

void copy_rows_plain(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t rows,
                     int64_t bytes) {
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += dst_stride)
    std::memcpy(dst, src, static_cast<size_t>(bytes));
}

using CopyRows = void (*)(const char*, int64_t, char*, int64_t, int64_t, int64_t);

// AVX-512 with BW for the masked byte tail; EPIFUSE_CPU_ISA=avx2 caps it (best_vector_isa).
CopyRows copy_rows_for_this_cpu() {
  const VectorIsa isa = best_vector_isa();
  if (isa == VectorIsa::kAvx512 && cpu_has_avx512bw_vl()) return copy_rows_avx512;
  return isa != VectorIsa::kNone ? copy_rows_avx2 : copy_rows_plain;
}

Status check_element_size(size_t element_size) {
  if (element_size != 2 && element_size != 4)
    return Status::Error("element size " + std::to_string(element_size) + " (only 2 and 4 bytes)");
  return Status::Ok();
}

// Runs piece(p0, p1) over pixels [0, pixels), `row_bytes` of output a pixel: on the calling thread below
// kMinBytesToSplit, else in pieces of about kPieceBytes on `parallel`.
template <class Piece>
void over_pixels(int64_t pixels, int64_t row_bytes, const ParallelFor& parallel, Piece&& piece) {
  if (pixels * row_bytes < kMinBytesToSplit) return piece(0, pixels);
  const int64_t per_piece = std::max<int64_t>(1, kPieceBytes / row_bytes), pieces = (pixels + per_piece - 1) / per_piece;
  parallel(pieces, [&](int64_t i) { piece(i * per_piece, std::min(pixels, (i + 1) * per_piece)); });
}

}  // namespace

Status channel_concat_cpu(const void* const* x, const int64_t* channels, int64_t inputs, void* y, int64_t pixels,
                          size_t element_size, const ParallelFor& parallel) {
  if (inputs < 1) return Status::Error("no inputs");
  if (pixels < 0) return Status::Error("negative dimension");
  EPIFUSE_RETURN_IF_ERROR(check_element_size(element_size));
  const auto es = static_cast<int64_t>(element_size);
  std::vector<int64_t> offset(static_cast<size_t>(inputs));  // bytes into an output row
  int64_t row = 0;
  for (int64_t i = 0; i < inputs; ++i) {
    if (channels[i] < 0) return Status::Error("negative channel count of input " + std::to_string(i));
    offset[i] = row;
    row += channels[i] * es;
  }
  if (pixels == 0 || row == 0) return Status::Ok();
  const CopyRows copy_rows = copy_rows_for_this_cpu();
  // A block of pixels at a time, input by input: each input read in order, the block's output rows
  // (a few tens of kilobytes) filled while they stay in L1/L2.
  const int64_t block = std::max<int64_t>(1, (16 << 10) / row);
  auto piece = [&](int64_t p0, int64_t p1) {
    for (int64_t b = p0; b < p1; b += block) {
      const int64_t rows = std::min(block, p1 - b);
      for (int64_t i = 0; i < inputs; ++i) {
        const int64_t bytes = channels[i] * es;
        if (bytes == 0) continue;
        copy_rows(static_cast<const char*>(x[i]) + b * bytes, bytes, static_cast<char*>(y) + b * row + offset[i], row,
                  rows, bytes);
      }
    }
  };
  over_pixels(pixels, row, parallel, piece);
  return Status::Ok();
}

Status channel_slice_cpu(const void* x, int64_t C, int64_t start, int64_t count, void* y, int64_t pixels,
                         size_t element_size, const ParallelFor& parallel) {
  if (pixels < 0 || C < 0 || count < 0) return Status::Error("negative dimension");
  if (start < 0 || start + count > C)
    return Status::Error("channels [" + std::to_string(start) + ", " + std::to_string(start + count) +
                         ") outside the input's " + std::to_string(C));
  EPIFUSE_RETURN_IF_ERROR(check_element_size(element_size));
  const auto es = static_cast<int64_t>(element_size);
  if (pixels == 0 || count == 0) return Status::Ok();
  const CopyRows copy_rows = copy_rows_for_this_cpu();
  over_pixels(pixels, count * es, parallel, [&](int64_t p0, int64_t p1) {
    copy_rows(static_cast<const char*>(x) + (p0 * C + start) * es, C * es, static_cast<char*>(y) + p0 * count * es,
              count * es, p1 - p0, count * es);
  });
  return Status::Ok();
}

}  // namespace epifuse
