// Grouped conv as per-group GEMMs: an im2col tile [rows, R*S*Cg] times W_g^T [R*S*Cg, Kg]
// (Eigen), then the fused epilogue on the fp32 accumulator tile while it is still in cache.
// Depthwise (Cg == 1) has no reduction worth a GEMM and uses a direct loop instead.
// 16-bit X and W are widened to fp32 once up front, so the inner loops only ever read fp32;
// only the epilogue (Z in, Y out) touches the storage type.
#include "reference_fused_conv.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <new>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "activation.h"
#include "float_types.h"

namespace epifuse {
namespace {

// Bounds the per-thread im2col tile so it stays in L2 next to the packed weights.
constexpr int64_t kIm2colTileFloats = 128 * 1024;
constexpr int64_t kMinTileRows = 64;
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kDepthwiseTileRows = 64;
// Output-channel chunks narrower than this make the GEMM inefficient.
constexpr int64_t kMinChunkChannels = 32;
// Enough tasks per thread to balance ragged tails.
constexpr int64_t kTasksPerThread = 4;
constexpr int64_t kConvertChunk = 1 << 16;

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Geometry {
  explicit Geometry(const ConvProblem& p)
      : N(p.N), H(p.H), W(p.W), C(p.C), K(p.K), R(p.R), S(p.S), P(p.P()), Q(p.Q()),
        G(p.attr.group), Cg(C / G), Kg(K / G), RSCg(R * S * Cg), M(N * P * Q),
        sh(p.attr.stride_h), sw(p.attr.stride_w), dh(p.attr.dil_h), dw(p.attr.dil_w),
        pt(p.attr.pad_top), pl(p.attr.pad_left) {}
  int64_t N, H, W, C, K, R, S, P, Q, G, Cg, Kg, RSCg, M;
  int64_t sh, sw, dh, dw, pt, pl;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float* scratch(std::vector<float>& buf, int64_t n) {
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

template <class T>
struct EpilogueArgs {
  const float* acc;  // [rows, cols], leading dimension cols
  int64_t rows, cols;
  const float* bias;  // [cols]
  const T* z;         // [rows, cols] with leading dimension ld, or null
  T* y;
  int64_t ld;
};

template <Residual M, class T, class Act>
void epilogue(const EpilogueArgs<T>& e, const Act& act) {
  for (int64_t i = 0; i < e.rows; ++i) {
    const float* a = e.acc + i * e.cols;
    T* y = e.y + i * e.ld;
    const T* z = M == Residual::kNone ? nullptr : e.z + i * e.ld;
    for (int64_t j = 0; j < e.cols; ++j) {
      float v = a[j] + e.bias[j];
      if constexpr (M == Residual::kPre) v += to_float(z[j]);
      v = act(v);
      if constexpr (M == Residual::kPost) v += to_float(z[j]);
      y[j] = from_float<T>(v);
    }
  }
}

template <class T>
using EpilogueFn = std::function<void(const EpilogueArgs<T>&)>;

template <class T>
EpilogueFn<T> make_epilogue(Residual r, const Activation& a) {
  EpilogueFn<T> fn;
  visit_activation(a, [&](auto act) {
    switch (r) {
      case Residual::kNone: fn = [act](const EpilogueArgs<T>& e) { epilogue<Residual::kNone>(e, act); }; break;
      case Residual::kPre: fn = [act](const EpilogueArgs<T>& e) { epilogue<Residual::kPre>(e, act); }; break;
      case Residual::kPost: fn = [act](const EpilogueArgs<T>& e) { epilogue<Residual::kPost>(e, act); }; break;
    }
  });
  return fn;
}

// Fills rows [m0, m0 + rows) of group g's im2col matrix; padding taps are zeros.
void im2col(const Geometry& g, const float* x, int64_t m0, int64_t rows, int64_t group, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t m = m0 + i, n = m / (g.P * g.Q), pq = m % (g.P * g.Q);
    const int64_t p = pq / g.Q, q = pq % g.Q;
    float* dst = out + i * g.RSCg;
    for (int64_t r = 0; r < g.R; ++r) {
      const int64_t h = p * g.sh - g.pt + r * g.dh;
      for (int64_t s = 0; s < g.S; ++s, dst += g.Cg) {
        const int64_t w = q * g.sw - g.pl + s * g.dw;
        if (h < 0 || h >= g.H || w < 0 || w >= g.W) {
          std::fill(dst, dst + g.Cg, 0.f);
          continue;
        }
        const float* src = x + ((n * g.H + h) * g.W + w) * g.C + group * g.Cg;
        std::copy(src, src + g.Cg, dst);
      }
    }
  }
}

template <class T>
void run_gemm(const Geometry& g, const float* x, const float* w, const float* bias, const T* z, T* y,
              const EpilogueFn<T>& epi, const ParallelFor& parallel_for, std::atomic<bool>& oom) {
  // A 1x1, stride-1, unpadded conv reads X in place: its im2col matrix is X itself.
  const bool x_is_im2col = g.R == 1 && g.S == 1 && g.sh == 1 && g.sw == 1 && g.P == g.H && g.Q == g.W;

  const int64_t tile_rows = std::clamp(kIm2colTileFloats / g.RSCg, kMinTileRows, kMaxTileRows);
  const int64_t m_tiles = ceil_div(g.M, tile_rows);
  // Split output channels only when tiles x groups leave threads idle (late, small layers).
  const int64_t wanted = ceil_div(kTasksPerThread * hardware_threads(), m_tiles * g.G);
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, g.Kg / kMinChunkChannels));
  const int64_t chunk = ceil_div(g.Kg, chunks);

  parallel_for(m_tiles * g.G * chunks, [&](int64_t task) {
    try {
      const int64_t c = task % chunks, group = task / chunks % g.G, tile = task / chunks / g.G;
      const int64_t m0 = tile * tile_rows, rows = std::min(tile_rows, g.M - m0);
      const int64_t k0 = group * g.Kg + c * chunk;
      const int64_t kn = std::min(chunk, (group + 1) * g.Kg - k0);
      if (kn <= 0) return;
      thread_local std::vector<float> cols_buf, acc_buf;
      const float* a;
      int64_t lda;
      if (x_is_im2col) {
        a = x + m0 * g.C + group * g.Cg;
        lda = g.C;
      } else {
        float* cols = scratch(cols_buf, rows * g.RSCg);
        im2col(g, x, m0, rows, group, cols);
        a = cols;
        lda = g.RSCg;
      }
      float* acc = scratch(acc_buf, rows * kn);
      Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>> A(a, rows, g.RSCg, Eigen::OuterStride<>(lda));
      Eigen::Map<const RowMajor> Wk(w + k0 * g.RSCg, kn, g.RSCg);
      Eigen::Map<RowMajor>(acc, rows, kn).noalias() = A * Wk.transpose();
      epi({acc, rows, kn, bias + k0, z ? z + m0 * g.K + k0 : nullptr, y + m0 * g.K + k0, g.K});
    } catch (const std::bad_alloc&) {
      oom = true;
    }
  });
}

// Depthwise and channel-multiplier convs (Cg == 1): output channel k reads input channel k / Kg.
// `wt` is W transposed to [R*S, K] so the inner loop runs over contiguous channels.
template <class T>
void run_depthwise(const Geometry& g, const float* x, const float* wt, const float* bias, const T* z,
                   T* y, const EpilogueFn<T>& epi, const ParallelFor& parallel_for,
                   std::atomic<bool>& oom) {
  const int64_t tile_rows =
      std::clamp<int64_t>(ceil_div(g.M, kTasksPerThread * hardware_threads()), 1, kDepthwiseTileRows);
  parallel_for(ceil_div(g.M, tile_rows), [&](int64_t tile) {
    try {
      const int64_t m0 = tile * tile_rows, rows = std::min(tile_rows, g.M - m0);
      thread_local std::vector<float> acc_buf;
      float* acc = scratch(acc_buf, rows * g.K);
      std::fill(acc, acc + rows * g.K, 0.f);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t m = m0 + i, n = m / (g.P * g.Q), pq = m % (g.P * g.Q);
        const int64_t p = pq / g.Q, q = pq % g.Q;
        float* out = acc + i * g.K;
        for (int64_t r = 0; r < g.R; ++r) {
          const int64_t h = p * g.sh - g.pt + r * g.dh;
          if (h < 0 || h >= g.H) continue;
          for (int64_t s = 0; s < g.S; ++s) {
            const int64_t w = q * g.sw - g.pl + s * g.dw;
            if (w < 0 || w >= g.W) continue;
            const float* src = x + ((n * g.H + h) * g.W + w) * g.C;
            const float* tap = wt + (r * g.S + s) * g.K;
            if (g.Kg == 1) {
              for (int64_t k = 0; k < g.K; ++k) out[k] += src[k] * tap[k];
            } else {
              for (int64_t k = 0; k < g.K; ++k) out[k] += src[k / g.Kg] * tap[k];
            }
          }
        }
      }
      epi({acc, rows, g.K, bias, z ? z + m0 * g.K : nullptr, y + m0 * g.K, g.K});
    } catch (const std::bad_alloc&) {
      oom = true;
    }
  });
}

// fp32 view of a tensor: the data itself for fp32, else a widened copy held in `storage`.
template <class T>
const float* as_float(const T* data, int64_t count, std::vector<float>& storage, const ParallelFor& parallel_for) {
  if constexpr (std::is_same_v<T, float>) {
    return data;
  } else {
    storage.resize(static_cast<size_t>(count));
    float* out = storage.data();
    parallel_for(ceil_div(count, kConvertChunk), [&](int64_t chunk) {
      const int64_t end = std::min(count, (chunk + 1) * kConvertChunk);
      for (int64_t i = chunk * kConvertChunk; i < end; ++i) out[i] = to_float(data[i]);
    });
    return out;
  }
}

template <class T>
Status run(const ConvProblem& p, const T* x, const T* w, const T* b, const T* z, T* y,
           const ParallelFor& parallel_for) {
  const Geometry g(p);
  std::vector<float> bias(static_cast<size_t>(g.K));
  for (int64_t k = 0; k < g.K; ++k) bias[k] = to_float(b[k]);
  std::vector<float> x_storage, w_storage;
  const float* x32 = as_float(x, g.N * g.H * g.W * g.C, x_storage, parallel_for);
  const EpilogueFn<T> epi = make_epilogue<T>(p.attr.residual, p.attr.activation);
  std::atomic<bool> oom{false};
  if (g.Cg == 1) {
    std::vector<float> wt(static_cast<size_t>(g.K * g.R * g.S));
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t rs = 0; rs < g.R * g.S; ++rs) wt[rs * g.K + k] = to_float(w[k * g.R * g.S + rs]);
    run_depthwise(g, x32, wt.data(), bias.data(), z, y, epi, parallel_for, oom);
  } else {
    const float* w32 = as_float(w, g.K * g.RSCg, w_storage, parallel_for);
    run_gemm(g, x32, w32, bias.data(), z, y, epi, parallel_for, oom);
  }
  if (oom) return Status::Error("out of memory for the CPU kernel's scratch buffers");
  return Status::Ok();
}

}  // namespace

Status check_cpu_problem(const ConvProblem& p, const void* x, const void* w, const void* b, const void* z,
                         const void* y, bool* empty) {
  EPIFUSE_RETURN_IF_ERROR(validate(p));
  for (int64_t d : {p.N, p.H, p.W, p.C, p.K, p.R, p.S})
    if (d < 0) return Status::Error("the CPU kernel needs every dimension known, got -1");
  EPIFUSE_RETURN_IF_ERROR(check_residual_input(p.attr.residual, z != nullptr));
  *empty = p.N == 0;
  if (!*empty && (!x || !w || !b || !y)) return Status::Error("X, W, B and Y must not be null");
  return Status::Ok();
}

Status reference_fused_conv(const ConvProblem& p, const void* x, const void* w, const void* b,
                            const void* z, void* y, const ParallelFor& parallel_for) {
  bool empty = false;
  EPIFUSE_RETURN_IF_ERROR(check_cpu_problem(p, x, w, b, z, y, &empty));
  if (empty) return Status::Ok();
  try {
    switch (p.dtype) {
      case DType::kFloat:
        return run(p, static_cast<const float*>(x), static_cast<const float*>(w),
                   static_cast<const float*>(b), static_cast<const float*>(z), static_cast<float*>(y),
                   parallel_for);
      case DType::kFloat16:
        return run(p, static_cast<const float16_t*>(x), static_cast<const float16_t*>(w),
                   static_cast<const float16_t*>(b), static_cast<const float16_t*>(z),
                   static_cast<float16_t*>(y), parallel_for);
      case DType::kBFloat16:
        return run(p, static_cast<const bfloat16_t*>(x), static_cast<const bfloat16_t*>(w),
                   static_cast<const bfloat16_t*>(b), static_cast<const bfloat16_t*>(z),
                   static_cast<bfloat16_t*>(y), parallel_for);
    }
  } catch (const std::bad_alloc&) {
    return Status::Error("out of memory in the CPU kernel");
  }
  return Status::Error("unsupported dtype");
}

}  // namespace epifuse
