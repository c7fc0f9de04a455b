#include "channel_concat.h"

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

// Copies `rows` rows of `bytes` from src (rows back to back) into dst (rows `dst_stride` bytes apart).
__attribute__((target("avx512f,avx512bw"))) void copy_rows_avx512(const char* src, char* dst, int64_t rows,
                                                                 int64_t bytes, int64_t dst_stride) {
  const int64_t full = bytes / 64 * 64;
  const __mmask64 tail = bytes == full ? 0 : (~0ULL >> (64 - (bytes - full)));
  for (int64_t r = 0; r < rows; ++r, src += bytes, dst += dst_stride) {
    for (int64_t b = 0; b < full; b += 64) _mm512_storeu_si512(dst + b, _mm512_loadu_si512(src + b));
    if (tail) _mm512_mask_storeu_epi8(dst + full, tail, _mm512_maskz_loadu_epi8(tail, src + full));
  }
}

__attribute__((target("avx2"))) void copy_rows_avx2(const char* src, char* dst, int64_t rows, int64_t bytes,
                                                    int64_t dst_stride) {
  const int64_t full = bytes / 32 * 32;
  for (int64_t r = 0; r < rows; ++r, src += bytes, dst += dst_stride) {
    for (int64_t b = 0; b < full; b += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + b),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + b)));
    std::memcpy(dst + full, src + full, static_cast<size_t>(bytes - full));
  }
}

void copy_rows_plain(const char* src, char* dst, int64_t rows, int64_t bytes, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r, src += bytes, dst += dst_stride) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

using CopyRows = void (*)(const char*, char*, int64_t, int64_t, int64_t);

// AVX-512 with BW for the masked byte tail; EPIFUSE_CPU_ISA=avx2 caps it (best_vector_isa).
CopyRows copy_rows_for_this_cpu() {
  const VectorIsa isa = best_vector_isa();
  if (isa == VectorIsa::kAvx512 && cpu_has_avx512bw_vl()) return copy_rows_avx512;
  return isa != VectorIsa::kNone ? copy_rows_avx2 : copy_rows_plain;
}

}  // namespace

Status channel_concat_cpu(const void* const* x, const int64_t* channels, int64_t inputs, void* y, int64_t pixels,
                          size_t element_size, const ParallelFor& parallel) {
  if (inputs < 1) return Status::Error("no inputs");
  if (pixels < 0) return Status::Error("negative dimension");
  if (element_size != 2 && element_size != 4)
    return Status::Error("element size " + std::to_string(element_size) + " (only 2 and 4 bytes)");
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
        copy_rows(static_cast<const char*>(x[i]) + b * bytes, static_cast<char*>(y) + b * row + offset[i], rows,
                  bytes, row);
      }
    }
  };
  if (pixels * row < kMinBytesToSplit) {
    piece(0, pixels);
    return Status::Ok();
  }
  const int64_t per_piece = std::max<int64_t>(1, kPieceBytes / row), pieces = (pixels + per_piece - 1) / per_piece;
  parallel(pieces, [&](int64_t i) { piece(i * per_piece, std::min(pixels, (i + 1) * per_piece)); });
  return Status::Ok();
}

}  // namespace epifuse
