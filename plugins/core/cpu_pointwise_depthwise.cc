#include "cpu_pointwise_depthwise.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "prepared_filters.h"

namespace epifuse {
namespace {

// A band's window of the 1x1 conv's rows: what stays in a core's L2 (1-2 MB) beside the depthwise conv's
// output rows and its filters. Bands of at most kMaxBandRows output rows (a 7x7 map's whole height).
constexpr int64_t kWindowBytes = 256 << 10;
constexpr int64_t kMaxBandRows = 16;

// Pieces of output rows a thread, at least: enough to even out a ragged end.
constexpr int64_t kPiecesPerThread = 4;

// A thread's window of 1x1 conv rows, kept from one call to the next (a few hundred KB a thread): the call
// that filled it, where its rows start, and which rows of which image they are.
struct Window {
  std::vector<float> storage;
  uint64_t call = 0;
  const float* data = nullptr;
  int64_t image = -1, row0 = 0, row1 = 0;
};

Window& thread_window() {
  thread_local Window window;
  return window;
}

// Output rows a band: as many as fit the window, the depthwise filter's rows and stride taken into account.
int64_t band_rows(const ConvProblem& dw) {
  const int64_t row_bytes = dw.W * dw.C * static_cast<int64_t>(sizeof(float));
  const int64_t window_rows = std::max<int64_t>(dw.R, kWindowBytes / std::max<int64_t>(row_bytes, 1));
  return std::clamp<int64_t>((window_rows - dw.R) / dw.attr.stride_h + 1, 1, kMaxBandRows);
}

bool separate_from_environment() {
  const char* way = std::getenv("EPIFUSE_POINTWISE_DEPTHWISE");
  return way != nullptr && std::strcmp(way, "separate") == 0;
}

// Whether every band of `dw`'s output rows reads at least one row of its input, whatever its pads.
bool bands_read_rows(const ConvProblem& dw) {
  return dw.attr.dil_h == 1 && dw.attr.pad_top < dw.R && dw.attr.pad_bottom < dw.R;
}

// The rows of `dw`'s input that output rows [p0, p0 + rows) read, padding included: [first, last).
struct BandRows {
  int64_t first, last, i0, i1;  // i0, i1: those inside the map
  ConvProblem problem(const ConvProblem& dw) const {  // the depthwise conv of the band alone, image by image
    ConvProblem band = dw;
    band.N = 1;
    band.H = i1 - i0;
    band.attr.pad_top = i0 - first;
    band.attr.pad_bottom = last - i1;
    return band;
  }
};

BandRows band_rows_read(const ConvProblem& dw, int64_t p0, int64_t rows) {
  const int64_t first = p0 * dw.attr.stride_h - dw.attr.pad_top;
  const int64_t last = (p0 + rows - 1) * dw.attr.stride_h - dw.attr.pad_top + dw.R;
  return {first, last, std::max<int64_t>(0, first), std::min(dw.H, last)};
}

// The output rows of a piece [r, end) in bands of equal height, none taller than `band` (7 rows: 4 and 3,
// not 6 and 1), none across images: the next band's rows from r.
int64_t next_band_rows(int64_t r, int64_t end, int64_t band, int64_t P) {
  const int64_t left = end - r, left_bands = (left + band - 1) / band;
  return std::min((left + left_bands - 1) / left_bands, P - r % P);
}

}  // namespace

CpuPointwiseDepthwise::CpuPointwiseDepthwise() : separate_(separate_from_environment()) {}

Status CpuPointwiseDepthwise::check_pair(const ConvProblem& pw, const ConvProblem& dw) {
  const ConvAttributes &a = pw.attr, &d = dw.attr;
  if (pw.dtype != DType::kFloat || dw.dtype != DType::kFloat)
    return Status::Error(std::string("the pointwise-depthwise pair has no ") + dtype_name(pw.dtype) + " kernel");
  if (pw.R != 1 || pw.S != 1 || a.stride_h != 1 || a.stride_w != 1 || a.group != 1 || a.pad_top != 0 ||
      a.pad_left != 0 || a.pad_bottom != 0 || a.pad_right != 0 || a.residual != Residual::kNone)
    return Status::Error("the first conv must be 1x1, stride 1, unpadded, one group, without a residual");
  if (dw.N != pw.N || dw.H != pw.H || dw.W != pw.W || dw.C != pw.K)
    return Status::Error("the depthwise conv must read the 1x1 conv's output [N, H, W, K]");
  if (d.group != dw.C || dw.K != dw.C || d.residual != Residual::kNone)
    return Status::Error("the second conv must be depthwise (group = C = K), without a residual");
  return Status::Ok();
}

bool CpuPointwiseDepthwise::bands_can_run(const ConvProblem& pw, const ConvProblem& dw) const {
  return pointwise_.supports(pw) && depthwise_.supports(dw) && bands_read_rows(dw);
}

Status CpuPointwiseDepthwise::run_separate(const ConvProblem& pw, const ConvProblem& dw, const void* x,
                                           const void* w1, bool w1_constant, const void* b1, const void* w2,
                                           bool w2_constant, const void* b2, void* y, const ParallelFor& parallel_for,
                                           const ScratchAllocator& scratch, float* mean) {
  float* mid = scratch(pw.N * pw.H * pw.W * pw.K);
  if (mid == nullptr) return Status::Error("no memory for the 1x1 conv's output");
  EPIFUSE_RETURN_IF_ERROR(pointwise_conv_.run(pw, x, w1, w1_constant, b1, nullptr, mid, parallel_for));
  return depthwise_conv_.run(dw, mid, w2, w2_constant, b2, nullptr, y, parallel_for, mean);
}

Status CpuPointwiseDepthwise::run_bands(const ConvProblem& pw, const ConvProblem& dw, const void* x, const void* w1,
                                        bool w1_constant, const void* b1, const void* w2, bool w2_constant,
                                        const void* b2, void* y, const ParallelFor& parallel_for, float* mean) {
  const int64_t H = dw.H, W = dw.W, C = pw.C, K = dw.C, P = dw.P(), Q = dw.Q();
  const int64_t band = band_rows(dw), row = W * K, window = ((band - 1) * dw.attr.stride_h + dw.R) * row;
  // Pieces of consecutive output rows, several a thread to even out a ragged end. ORT's pool hands each
  // thread a run of consecutive pieces (the same run in every loop, so the rows a thread computes stay its own
  // from one layer to the next), and a piece that follows the thread's last one continues from its window.
  const int64_t rows = dw.N * P, pieces = std::min(rows, hardware_threads() * kPiecesPerThread);
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = ++calls;
  const float* xs = static_cast<const float*>(x);
  float* ys = static_cast<float*>(y);
  // Where `mean`: the sums of piece i's rows of image n at sums + (i + n) * K (pieces and images both runs of
  // consecutive rows, as DepthwiseConv's pieces), each band's mean times its pixels added in order.
  std::vector<float> storage;
  float* sums = mean ? aligned(storage, (pieces + dw.N - 1) * K) : nullptr;  // zeroed as it grows
  std::mutex error_mutex;
  Status error = Status::Ok();
  parallel_for(pieces, [&](int64_t piece) {
    Window& w = thread_window();
    float* wnd = aligned(w.storage, window);
    std::vector<float> band_mean(mean ? K : 0);
    if (w.call != call || w.data != wnd) {  // nothing of this call in it
      w.call = call;
      w.data = wnd;
      w.image = -1;
    }
    for (int64_t r = rows * piece / pieces, end = rows * (piece + 1) / pieces; r < end;) {
      const int64_t n = r / P, p0 = r % P, out_rows = next_band_rows(r, end, band, P);
      const BandRows read = band_rows_read(dw, p0, out_rows);
      const int64_t i0 = read.i0, i1 = read.i1;
      int64_t kept = 0;  // rows the band before computed: moved to the window's top
      if (w.image == n && w.row0 <= i0 && i0 < w.row1) {
        kept = std::min(w.row1, i1) - i0;
        if (i0 > w.row0) std::memmove(wnd, wnd + (i0 - w.row0) * row, static_cast<size_t>(kept * row) * sizeof(float));
      }
      Status s1 = Status::Ok(), s2 = Status::Ok();
      if (i1 - i0 > kept) {
        ConvProblem rows_pw = pw;
        rows_pw.N = 1;
        rows_pw.H = i1 - i0 - kept;
        s1 = pointwise_.run(rows_pw, xs + ((n * H + i0 + kept) * W) * C, w1, w1_constant, b1, nullptr,
                            wnd + kept * row, parallel_for_serial);
      }
      w.image = n, w.row0 = i0, w.row1 = i1;
      if (s1.ok())
        s2 = depthwise_.run_band(read.problem(dw), wnd, w2, w2_constant, b2, nullptr, ys + (n * P + p0) * Q * K,
                                 mean ? band_mean.data() : nullptr);
      if (s2.ok() && mean) {
        float* slot = sums + (piece + n) * K;
        const float pixels = static_cast<float>(out_rows * Q);
        for (int64_t c = 0; c < K; ++c) slot[c] += band_mean[c] * pixels;
      }
      if (!s1.ok() || !s2.ok()) {
        w.image = -1;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.ok()) error = s1.ok() ? s2 : s1;
        return;
      }
      r += out_rows;
    }
  });
  if (!error.ok() || mean == nullptr) return error;
  for (int64_t n = 0; n < dw.N; ++n) {  // image n's pieces, in order
    float* total = mean + n * K;
    std::fill(total, total + K, 0.f);
    for (int64_t piece = 0; piece < pieces; ++piece) {
      const int64_t first = rows * piece / pieces, last = rows * (piece + 1) / pieces;  // its rows
      if (last <= n * P || first >= (n + 1) * P) continue;
      for (int64_t c = 0; c < K; ++c) total[c] += sums[(piece + n) * K + c];
    }
    const float scale = 1.f / static_cast<float>(P * Q);
    for (int64_t c = 0; c < K; ++c) total[c] *= scale;
  }
  return Status::Ok();
}

Status CpuPointwiseDepthwise::run(const ConvProblem& pw, const ConvProblem& dw, const void* x, const void* w1,
                                  bool w1_constant, const void* b1, const void* w2, bool w2_constant, const void* b2,
                                  void* y, const ParallelFor& parallel_for, const ScratchAllocator& scratch,
                                  float* mean) {
  EPIFUSE_RETURN_IF_ERROR(check_pair(pw, dw));
  if (pw.N * pw.H * pw.W == 0 || dw.P() * dw.Q() == 0) return Status::Ok();
  if (x == nullptr || w1 == nullptr || b1 == nullptr || w2 == nullptr || b2 == nullptr || y == nullptr)
    return Status::Error("a tensor of the pointwise-depthwise pair is missing");
  if (!separate_ && bands_can_run(pw, dw))
    return run_bands(pw, dw, x, w1, w1_constant, b1, w2, w2_constant, b2, y, parallel_for, mean);
  return run_separate(pw, dw, x, w1, w1_constant, b1, w2, w2_constant, b2, y, parallel_for, scratch, mean);
}

}  // namespace epifuse

namespace epifuse {

CpuDepthwisePointwise::CpuDepthwisePointwise() : separate_(separate_from_environment()) {}

Status CpuDepthwisePointwise::check_pair(const ConvProblem& dw, const ConvProblem& pw) {
  const ConvAttributes &d = dw.attr, &a = pw.attr;
  if (pw.dtype != DType::kFloat || dw.dtype != DType::kFloat)
    return Status::Error(std::string("the depthwise-pointwise pair has no ") + dtype_name(pw.dtype) + " kernel");
  if (d.group != dw.C || dw.K != dw.C || d.residual != Residual::kNone)
    return Status::Error("the first conv must be depthwise (group = C = K), without a residual");
  if (pw.R != 1 || pw.S != 1 || a.stride_h != 1 || a.stride_w != 1 || a.group != 1 || a.pad_top != 0 ||
      a.pad_left != 0 || a.pad_bottom != 0 || a.pad_right != 0)
    return Status::Error("the second conv must be 1x1, stride 1, unpadded, one group");
  if (pw.N != dw.N || pw.H != dw.P() || pw.W != dw.Q() || pw.C != dw.K)
    return Status::Error("the 1x1 conv must read the depthwise conv's output [N, P, Q, K]");
  return Status::Ok();
}

bool CpuDepthwisePointwise::bands_can_run(const ConvProblem& dw, const ConvProblem& pw) const {
  return pointwise_.supports(pw) && depthwise_.supports(dw) && bands_read_rows(dw);
}

Status CpuDepthwisePointwise::run_bands(const ConvProblem& dw, const ConvProblem& pw, const void* x, const void* w1,
                                        bool w1_constant, const void* b1, const void* w2, bool w2_constant,
                                        const void* b2, const void* z, void* y, const ParallelFor& parallel_for) {
  const int64_t H = dw.H, W = dw.W, C = dw.C, K = pw.K, P = dw.P(), Q = dw.Q();
  const int64_t row = Q * C;  // a row of the window: the depthwise conv's output
  const int64_t band = std::clamp<int64_t>(kWindowBytes / (row * static_cast<int64_t>(sizeof(float))), 1, kMaxBandRows);
  const int64_t rows = dw.N * P, pieces = std::min(rows, hardware_threads() * kPiecesPerThread);
  const float *xs = static_cast<const float*>(x), *zs = static_cast<const float*>(z);
  float* ys = static_cast<float*>(y);
  std::mutex error_mutex;
  Status error = Status::Ok();
  parallel_for(pieces, [&](int64_t piece) {
    Window& w = thread_window();
    w.image = -1;  // its rows are not a pointwise-depthwise pair's any more
    float* wnd = aligned(w.storage, band * row);
    for (int64_t r = rows * piece / pieces, end = rows * (piece + 1) / pieces; r < end;) {
      const int64_t n = r / P, p0 = r % P, out_rows = next_band_rows(r, end, band, P);
      const BandRows read = band_rows_read(dw, p0, out_rows);
      Status s = depthwise_.run_band(read.problem(dw), xs + (n * H + read.i0) * W * C, w1, w1_constant, b1, nullptr,
                                     wnd, nullptr);
      if (s.ok()) {
        ConvProblem band_pw = pw;
        band_pw.N = 1;
        band_pw.H = out_rows;
        const int64_t out = (n * P + p0) * Q * K;
        s = pointwise_.run(band_pw, wnd, w2, w2_constant, b2, zs ? zs + out : nullptr, ys + out, parallel_for_serial);
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.ok()) error = s;
        return;
      }
      r += out_rows;
    }
  });
  return error;
}

Status CpuDepthwisePointwise::run(const ConvProblem& dw, const ConvProblem& pw, const void* x, const void* w1,
                                  bool w1_constant, const void* b1, const void* w2, bool w2_constant, const void* b2,
                                  const void* z, void* y, const ParallelFor& parallel_for,
                                  const ScratchAllocator& scratch) {
  EPIFUSE_RETURN_IF_ERROR(check_pair(dw, pw));
  if (dw.N * dw.P() * dw.Q() == 0) return Status::Ok();
  if (x == nullptr || w1 == nullptr || b1 == nullptr || w2 == nullptr || b2 == nullptr || y == nullptr ||
      (pw.attr.residual != Residual::kNone && z == nullptr))
    return Status::Error("a tensor of the depthwise-pointwise pair is missing");
  if (!separate_ && bands_can_run(dw, pw))
    return run_bands(dw, pw, x, w1, w1_constant, b1, w2, w2_constant, b2, z, y, parallel_for);
  float* mid = scratch(dw.N * dw.P() * dw.Q() * dw.K);
  if (mid == nullptr) return Status::Error("no memory for the depthwise conv's output");
  EPIFUSE_RETURN_IF_ERROR(depthwise_conv_.run(dw, x, w1, w1_constant, b1, nullptr, mid, parallel_for));
  return pointwise_conv_.run(pw, mid, w2, w2_constant, b2, z, y, parallel_for);
}

}  // namespace epifuse
