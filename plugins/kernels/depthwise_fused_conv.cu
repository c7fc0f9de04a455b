// Depthwise conv (group == C, K = m*C). Little arithmetic per byte, so the kernels are about reuse
// and access patterns. Five registry kernels (rules in plugins/core/rules_direct.cc, the untuned order
// in heuristics.cc; the tuner and TensorRT time them all):
//  - cuda_depthwise_global (m == 1, the filter covers the whole unpadded map, C even): a global pool
//    written as a conv, one output pixel per image; a block's threads split up to 256 pixels and 32
//    channels between them, and larger maps are split over blocks whose fp32 partial sums a second kernel
//    adds (the vector and scalar kernels give each output element or channel group one thread, a serial
//    loop over the map; the tile and strip kernels take only 3x3-7x7 maps).
// and, the most reuse first:
//  - cuda_depthwise_tile (m == 1, square 3x3/5x5/7x7, stride 1, dilation 1, any pads, C a multiple of
//    16 bytes' worth of elements): a block stages the input patch of a TP x QT output tile and CB
//    channels in shared memory with cp.async (the halo zero-filled, so the math has no predicates)
//    and each thread computes TQ columns x RP rows x 2 channels from it. The loads are all in flight
//    at once where the strip kernel below waited on L1/L2 row by row: ConvNeXt's dw7x7 82 -> 40 us.
//  - cuda_depthwise_strip (m == 1, square 3x3/5x5/7x7, stride_w 1 or 2, dil_w 1; any stride_h, dil_h,
//    pads): a thread owns VEC adjacent channels (its filter taps and bias live in registers for the
//    whole kernel) and computes a strip of TQ output columns of one output row. Per filter row it
//    loads the input window of the strip once ((TQ-1)*stride + S vectors along W) and every loaded
//    vector feeds up to S outputs. A block is `groups` channel groups x `rows` strips and walks a
//    contiguous chunk of (n, strip, p) items with p fastest, so consecutive items of a block (and its
//    two-dimensional tile of rows) reuse input rows from L1.
//  - cuda_depthwise_vec (m == 1, any geometry, 16-byte aligned): taps staged in shared memory as
//    [tap][channel], each thread computes VEC channels of one output pixel.
//  - cuda_depthwise_scalar: anything depthwise (m > 1, any alignment), one output element per thread.
// A launch checks what only it can see (pointer alignment, the device's limits) and returns an error
// naming the kernel; it never runs another kernel in its place.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "depthwise_geometry.h"
#include "dtype.cuh"
#include "epilogue.cuh"
#include "kernel_api.h"

namespace epifuse::cuda {
namespace {

using namespace epifuse::depthwise;

struct Geometry {
  int N, H, W, C, K, R, S, P, Q, multiplier;
  int stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
};

template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

constexpr int kScalarThreads = 256;

// VEC channels per thread; multiplier 1 (K == C). blockDim.x = channel groups of the slice,
// blockDim.y = pixels; gridDim.y walks channel slices.
template <class T, int VEC>
__global__ void depthwise_vec(Geometry g, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                              const T* __restrict__ z, T* __restrict__ y, Epilogue epilogue, int slice) {
  extern __shared__ float taps[];  // [R*S][slice]
  const int c_base = blockIdx.y * slice;
  const int rs = g.R * g.S;
  const int width = min(slice, g.C - c_base);
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < rs * width; i += blockDim.x * blockDim.y) {
    const int c = i % width, tap = i / width;
    taps[tap * slice + c] = to_float(w[int64_t(c_base + c) * rs + tap]);
  }
  __syncthreads();
  const int c_local = threadIdx.x * VEC;
  if (c_local >= width) return;
  const int c = c_base + c_local;
  const int64_t pixels = int64_t(g.N) * g.P * g.Q;
  for (int64_t pix = blockIdx.x * int64_t(blockDim.y) + threadIdx.y; pix < pixels; pix += int64_t(gridDim.x) * blockDim.y) {
    const int q = int(pix % g.Q);
    const int p = int((pix / g.Q) % g.P);
    const int n = int(pix / (int64_t(g.Q) * g.P));
    const int h0 = p * g.stride_h - g.pad_top, w0 = q * g.stride_w - g.pad_left;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
    for (int r = 0; r < g.R; ++r) {
      const int h = h0 + r * g.dil_h;
      if (h < 0 || h >= g.H) continue;
      const T* row = x + (int64_t(n) * g.H + h) * g.W * g.C + c;
      for (int s = 0; s < g.S; ++s) {
        const int wi = w0 + s * g.dil_w;
        if (wi < 0 || wi >= g.W) continue;
        const Vec<T, VEC> xv = *reinterpret_cast<const Vec<T, VEC>*>(row + int64_t(wi) * g.C);
        const float* t = taps + (r * g.S + s) * slice + c_local;
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += to_float(xv.v[j]) * t[j];
      }
    }
    const int64_t out = pix * g.K + c;
    Vec<T, VEC> yv, zv;
    if (z) zv = *reinterpret_cast<const Vec<T, VEC>*>(z + out);
#pragma unroll
    for (int j = 0; j < VEC; ++j) yv.v[j] = from_float<T>(epilogue(acc[j], to_float(b[c + j]), z ? to_float(zv.v[j]) : 0.f));
    *reinterpret_cast<Vec<T, VEC>*>(y + out) = yv;
  }
}

// ---- depthwise_strip ---------------------------------------------------------------------------

// The strip kernel's channels and columns per thread: strip_vec, strip_cols, shared_taps (depthwise_geometry.h).

// Launch layout of depthwise_strip, computed on the host.
struct StripTile {
  int groups;     // channel groups (VEC channels each) per block: blockDim.x; gridDim.y slices of C
  int strips;     // ceil(Q / TQ)
  int spatial;    // N * strips * P items (n, strip, p), p fastest
  int per_block;  // items per block (a multiple of blockDim.y); block b owns [b, b+1) * per_block
};

// An unsigned type of `bytes` bytes, for loads that may be replaced by zero bits.
template <int bytes>
struct RawBits;
template <>
struct RawBits<4> { using type = unsigned; };
template <>
struct RawBits<8> { using type = uint2; };
template <>
struct RawBits<16> { using type = uint4; };

// VEC elements of a vector load as floats (pairwise conversions for the 16-bit types).
template <class T, int VEC>
__device__ __forceinline__ void load_floats(float (&out)[VEC], const Vec<T, VEC>& v) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = to_float(v.v[k]);
}
template <int VEC>
__device__ __forceinline__ void load_floats(float (&out)[VEC], const Vec<__half, VEC>& v) {
#pragma unroll
  for (int k = 0; k < VEC; k += 2) {
    const float2 f = __half22float2(__halves2half2(v.v[k], v.v[k + 1]));
    out[k] = f.x;
    out[k + 1] = f.y;
  }
}
template <int VEC>
__device__ __forceinline__ void load_floats(float (&out)[VEC], const Vec<__nv_bfloat16, VEC>& v) {
#pragma unroll
  for (int k = 0; k < VEC; k += 2) {
    const float2 f = __bfloat1622float2(__halves2bfloat162(v.v[k], v.v[k + 1]));
    out[k] = f.x;
    out[k + 1] = f.y;
  }
}

// acc[j] += sum over the filter of x * taps for the TQ outputs of the strip whose input window
// starts at (h_first, w_first). kInterior: every row and column of the window is inside the image,
// so the loads need no predicates; otherwise each load is predicated and padding reads as 0.
// A thread's taps: taps(r, s, k) for its channel k, from registers or from the block's shared copy.
template <int R, int S, int VEC>
struct RegisterTaps {
  float v[R][S][VEC];
  __device__ __forceinline__ float operator()(int r, int s, int k) const { return v[r][s][k]; }
};
template <int S>
struct SharedTaps {
  const float* base;  // the block's [R*S][channels] taps, at this thread's first channel
  int stride;         // channels of the block
  __device__ __forceinline__ float operator()(int r, int s, int k) const { return base[(r * S + s) * stride + k]; }
};

template <bool kInterior, class T, int VEC, int R, int S, int SW, int TQ, class Taps>
__device__ __forceinline__ void strip_accumulate(float (&acc)[TQ][VEC], const Taps& taps,
                                                 const T* __restrict__ xn, const Geometry& g, int h_first,
                                                 int w_first) {
  using V = Vec<T, VEC>;
  using Raw = typename RawBits<sizeof(V)>::type;
  constexpr int kWin = strip_window(S, SW, TQ);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int h = h_first + r * g.dil_h;
    const bool row_ok = kInterior || unsigned(h) < unsigned(g.H);
    // Offsets are only formed for rows inside the image, so they cannot overflow.
    const T* px = xn + (row_ok ? (h * g.W + w_first) * g.C : 0);
    const int col = g.C / VEC;  // vectors between adjacent columns
    float xf[kWin][VEC];
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const bool ok = kInterior || (row_ok && unsigned(w_first + i) < unsigned(g.W));
      Raw raw{};  // zero bits: 0.0 in every element type
      if (ok) raw = reinterpret_cast<const Raw*>(px)[i * col];
      V v;
      memcpy(&v, &raw, sizeof(V));
      load_floats(xf[i], v);
    }
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int j = 0; j < TQ; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[j][k] = fmaf(xf[j * SW + s][k], taps(r, s, k), acc[j][k]);
  }
}

// `e` with its activation kind fixed at compile time (the same value it has at run time), so that
// Epilogue's per-element switch folds away.
template <ActivationKind kKind>
__device__ __forceinline__ Epilogue with_kind(Epilogue e) {
  e.activation.kind = kKind;
  return e;
}

// y = epilogue(acc, bias, z) for the TQ outputs of a strip (those with q < Q).
template <class T, int VEC, int TQ>
__device__ __forceinline__ void strip_store(const float (&acc)[TQ][VEC], const float (&bias)[VEC], const Epilogue& epilogue,
                                            const T* __restrict__ z, T* __restrict__ y, int64_t out_row, int q0,
                                            const Geometry& g) {
  using V = Vec<T, VEC>;
#pragma unroll
  for (int j = 0; j < TQ; ++j) {
    if (q0 + j >= g.Q) break;
    const int64_t out = out_row + (q0 + j) * g.K;
    V zv;
    if (z) zv = *reinterpret_cast<const V*>(z + out);
    V yv;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      yv.v[k] = from_float<T>(epilogue(acc[j][k], bias[k], z ? to_float(zv.v[k]) : 0.f));
    *reinterpret_cast<V*>(y + out) = yv;
  }
}

// multiplier 1, dil_w 1, stride_w SW. blockDim = (tile.groups, rows); gridDim = (chunks, slices).
// All int math is 32-bit except the per-image base offsets (the host checks the bounds).
template <class T, int VEC, int R, int S, int SW, int TQ>
__global__ void __launch_bounds__(kStripThreads, shared_taps(R, S, VEC) ? 5 : 1)
    depthwise_strip(Geometry g, StripTile tile, const T* __restrict__ x, const T* __restrict__ w,
                    const T* __restrict__ b, const T* __restrict__ z, T* __restrict__ y, Epilogue epilogue) {
  using V = Vec<T, VEC>;
  constexpr int kWin = strip_window(S, SW, TQ);
  const int c = (blockIdx.y * tile.groups + threadIdx.x) * VEC;
  const int begin = blockIdx.x * tile.per_block;
  const int end = min(tile.spatial, begin + tile.per_block);
  int item = begin + threadIdx.y;

  // This thread's taps: W is [K][R][S] (C / group == 1).
  using Taps = std::conditional_t<shared_taps(R, S, VEC), SharedTaps<S>, RegisterTaps<R, S, VEC>>;
  Taps taps;
  if constexpr (shared_taps(R, S, VEC)) {
    extern __shared__ float block_taps[];  // [R*S][tile.groups * VEC]
    const int channels = tile.groups * VEC;
    // Each thread stages its own channels' taps, a filter row (S*VEC loads in flight) at a time;
    // the block's rows of threads split the filter rows. Channels past C are never read.
    if (c < g.C)
      for (int r = threadIdx.y; r < R; r += blockDim.y) {
        float row[S][VEC];
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int k = 0; k < VEC; ++k) row[s][k] = to_float(__ldg(w + ((c + k) * R + r) * S + s));
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int k = 0; k < VEC; ++k) block_taps[(r * S + s) * channels + threadIdx.x * VEC + k] = row[s][k];
      }
    __syncthreads();
    taps = SharedTaps<S>{block_taps + threadIdx.x * VEC, channels};
  } else {
    if (c < g.C) {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int s = 0; s < S; ++s) taps.v[r][s][k] = to_float(__ldg(w + ((c + k) * R + r) * S + s));
    }
  }
  if (c >= g.C || item >= end) return;  // no __syncthreads below
  float bias[VEC];
  {
    const V bv = *reinterpret_cast<const V*>(b + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) bias[k] = to_float(bv.v[k]);
  }

  // item -> (n, strip, p), p fastest; advanced incrementally below.
  int p = item % g.P;
  int strip = (item / g.P) % tile.strips;
  int n = item / g.P / tile.strips;
  const int image_in = g.H * g.W * g.C;
  for (; item < end; item += blockDim.y) {
    const int q0 = strip * TQ;
    const int w_first = q0 * SW - g.pad_left;
    const int h_first = p * g.stride_h - g.pad_top;
    const T* xn = x + (int64_t(n) * image_in + c);
    float acc[TQ][VEC];
#pragma unroll
    for (int j = 0; j < TQ; ++j)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[j][k] = 0.f;
    if (w_first >= 0 && w_first + kWin <= g.W && h_first >= 0 && h_first + (R - 1) * g.dil_h < g.H)
      strip_accumulate<true, T, VEC, R, S, SW, TQ>(acc, taps, xn, g, h_first, w_first);
    else
      strip_accumulate<false, T, VEC, R, S, SW, TQ>(acc, taps, xn, g, h_first, w_first);

    const int64_t out_row = (int64_t(n) * g.P + p) * g.Q * g.K + c;  // Q * K < 2^31 (host)
    // The activation switch is uniform: dispatch once per item for the common ones, so that the
    // per-element epilogue below is straight-line code.
    switch (epilogue.activation.kind) {
      case ActivationKind::kIdentity: strip_store(acc, bias, with_kind<ActivationKind::kIdentity>(epilogue), z, y, out_row, q0, g); break;
      case ActivationKind::kRelu: strip_store(acc, bias, with_kind<ActivationKind::kRelu>(epilogue), z, y, out_row, q0, g); break;
      case ActivationKind::kClip: strip_store(acc, bias, with_kind<ActivationKind::kClip>(epilogue), z, y, out_row, q0, g); break;
      case ActivationKind::kSilu: strip_store(acc, bias, with_kind<ActivationKind::kSilu>(epilogue), z, y, out_row, q0, g); break;
      case ActivationKind::kHardSwish: strip_store(acc, bias, with_kind<ActivationKind::kHardSwish>(epilogue), z, y, out_row, q0, g); break;
      case ActivationKind::kGelu: strip_store(acc, bias, with_kind<ActivationKind::kGelu>(epilogue), z, y, out_row, q0, g); break;
      default: strip_store(acc, bias, epilogue, z, y, out_row, q0, g); break;
    }

    p += blockDim.y;
    while (p >= g.P) {
      p -= g.P;
      if (++strip == tile.strips) {
        strip = 0;
        ++n;
      }
    }
  }
}

// ---- depthwise_tile ----------------------------------------------------------------------------

// The tile configurations (TileConfig, TileWide, TileSmall) are in depthwise_geometry.h.

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool inside) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // src-size 0 writes 16 zero bytes: the halo outside the image (and channels past C) read as 0.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(inside ? 16 : 0));
}

template <class T, int R, class Cfg>
constexpr size_t tile_smem_bytes() {
  return size_t(Cfg::TP + R - 1) * (Cfg::QT + R - 1) * Cfg::CB * sizeof(T) + size_t(R) * R * Cfg::CB * sizeof(float);
}

// y = epilogue(acc, bias, z) for a thread's RP x TQ outputs of 2 channels (those inside P x Q).
template <class T, class Cfg>
__device__ __forceinline__ void tile_store(const float (&acc)[Cfg::RP][Cfg::TQ][2], const float (&bias)[2],
                                           const Epilogue& epilogue, const T* __restrict__ z, T* __restrict__ y,
                                           const Geometry& g, int n, int p_first, int q_first, int c) {
  using V = Vec<T, 2>;
#pragma unroll
  for (int a = 0; a < Cfg::RP; ++a) {
    const int p = p_first + a;
    if (p >= g.P) break;
#pragma unroll
    for (int j = 0; j < Cfg::TQ; ++j) {
      const int q = q_first + j;
      if (q >= g.Q) break;
      const int64_t out = ((int64_t(n) * g.P + p) * g.Q + q) * g.K + c;
      V zv, yv;
      if (z) zv = *reinterpret_cast<const V*>(z + out);
#pragma unroll
      for (int k = 0; k < 2; ++k) yv.v[k] = from_float<T>(epilogue(acc[a][j][k], bias[k], z ? to_float(zv.v[k]) : 0.f));
      *reinterpret_cast<V*>(y + out) = yv;
    }
  }
}

// multiplier 1, stride 1, dilation 1, R x R. gridDim = (N * tiles of P * tiles of Q, slices of CB channels).
template <class T, int R, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    depthwise_tile(Geometry g, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                   const T* __restrict__ z, T* __restrict__ y, Epilogue epilogue) {
  constexpr int TQ = Cfg::TQ, RP = Cfg::RP, CB = Cfg::CB, kPairs = CB / 2;
  constexpr int kRows = Cfg::TP + R - 1, kCols = Cfg::QT + R - 1, kWin = TQ + R - 1;
  constexpr int kElemsPerChunk = 16 / int(sizeof(T)), kChunks = CB / kElemsPerChunk;  // 16-byte chunks per pixel
  static_assert(CB % kElemsPerChunk == 0, "whole 16-byte chunks per pixel");
  extern __shared__ __align__(16) unsigned char tile_smem[];
  T* patch = reinterpret_cast<T*>(tile_smem);                                              // [kRows][kCols][CB]
  float* taps = reinterpret_cast<float*>(tile_smem + size_t(kRows) * kCols * CB * sizeof(T));  // [R*R][CB]

  const int tiles_q = (g.Q + Cfg::QT - 1) / Cfg::QT, tiles_p = (g.P + Cfg::TP - 1) / Cfg::TP;
  const int tq = blockIdx.x % tiles_q, tp = (blockIdx.x / tiles_q) % tiles_p, n = blockIdx.x / tiles_q / tiles_p;
  const int p0 = tp * Cfg::TP, q0 = tq * Cfg::QT, c0 = blockIdx.y * CB;
  const int h0 = p0 - g.pad_top, w0 = q0 - g.pad_left;
  const T* xn = x + int64_t(n) * g.H * g.W * g.C;  // per-image offsets fit 32 bits (host)
  for (int i = threadIdx.x; i < kRows * kCols * kChunks; i += Cfg::kThreads) {
    const int chunk = i % kChunks, pixel = i / kChunks;
    const int col = pixel % kCols, row = pixel / kCols;
    const int h = h0 + row, wi = w0 + col, c = c0 + chunk * kElemsPerChunk;
    const bool inside = unsigned(h) < unsigned(g.H) && unsigned(wi) < unsigned(g.W) && c < g.C;
    cp_async_16(patch + (row * kCols + col) * CB + chunk * kElemsPerChunk,
                inside ? xn + (h * g.W + wi) * g.C + c : x, inside);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  for (int i = threadIdx.x; i < R * R * CB; i += Cfg::kThreads) {  // W is [C][R][R]
    const int c = i % CB, tap = i / CB;
    taps[i] = c0 + c < g.C ? to_float(__ldg(w + (c0 + c) * R * R + tap)) : 0.f;
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();

  const int pair = threadIdx.x % kPairs, strip = threadIdx.x / kPairs % Cfg::STRIPS;
  const int row_group = threadIdx.x / (kPairs * Cfg::STRIPS);
  float acc[RP][TQ][2];
#pragma unroll
  for (int a = 0; a < RP; ++a)
#pragma unroll
    for (int j = 0; j < TQ; ++j) acc[a][j][0] = acc[a][j][1] = 0.f;
  const T* window = patch + (row_group * RP * kCols + strip * TQ) * CB + pair * 2;
  const float* tap_pair = taps + pair * 2;
  // Input row i of the thread's window feeds output row a through filter row i - a.
#pragma unroll
  for (int i = 0; i < RP + R - 1; ++i) {
    float xf[kWin][2];
#pragma unroll
    for (int k = 0; k < kWin; ++k) load_floats(xf[k], *reinterpret_cast<const Vec<T, 2>*>(window + (i * kCols + k) * CB));
#pragma unroll
    for (int a = 0; a < RP; ++a) {
      const int r = i - a;
      if (r < 0 || r >= R) continue;
#pragma unroll
      for (int s = 0; s < R; ++s) {
        const float2 t = *reinterpret_cast<const float2*>(tap_pair + (r * R + s) * CB);
#pragma unroll
        for (int j = 0; j < TQ; ++j) {
          acc[a][j][0] = fmaf(xf[j + s][0], t.x, acc[a][j][0]);
          acc[a][j][1] = fmaf(xf[j + s][1], t.y, acc[a][j][1]);
        }
      }
    }
  }
  const int c = c0 + pair * 2;
  if (c >= g.C) return;
  const float bias[2] = {to_float(b[c]), to_float(b[c + 1])};
  const int p_first = p0 + row_group * RP, q_first = q0 + strip * TQ;
  switch (epilogue.activation.kind) {  // uniform: straight-line epilogues for the common activations
    case ActivationKind::kIdentity: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kIdentity>(epilogue), z, y, g, n, p_first, q_first, c); break;
    case ActivationKind::kRelu: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kRelu>(epilogue), z, y, g, n, p_first, q_first, c); break;
    case ActivationKind::kClip: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kClip>(epilogue), z, y, g, n, p_first, q_first, c); break;
    case ActivationKind::kSilu: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kSilu>(epilogue), z, y, g, n, p_first, q_first, c); break;
    case ActivationKind::kHardSwish: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kHardSwish>(epilogue), z, y, g, n, p_first, q_first, c); break;
    case ActivationKind::kGelu: tile_store<T, Cfg>(acc, bias, with_kind<ActivationKind::kGelu>(epilogue), z, y, g, n, p_first, q_first, c); break;
    default: tile_store<T, Cfg>(acc, bias, epilogue, z, y, g, n, p_first, q_first, c); break;
  }
}

// Any multiplier, any alignment: one output element per thread.
template <class T>
__global__ void depthwise_scalar(Geometry g, const T* __restrict__ x, const T* __restrict__ w,
                                 const T* __restrict__ b, const T* __restrict__ z, T* __restrict__ y,
                                 Epilogue epilogue) {
  const int64_t total = int64_t(g.N) * g.P * g.Q * g.K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i % g.K);
    const int64_t pixel = i / g.K;
    const int q = int(pixel % g.Q);
    const int p = int((pixel / g.Q) % g.P);
    const int n = int(pixel / (int64_t(g.Q) * g.P));
    const int c = k / g.multiplier;
    const int h0 = p * g.stride_h - g.pad_top, w0 = q * g.stride_w - g.pad_left;
    const T* wk = w + int64_t(k) * g.R * g.S;
    float acc = 0.f;
    for (int r = 0; r < g.R; ++r) {
      const int h = h0 + r * g.dil_h;
      if (h < 0 || h >= g.H) continue;
      const T* row = x + (int64_t(n) * g.H + h) * g.W * g.C + c;
      for (int s = 0; s < g.S; ++s) {
        const int wi = w0 + s * g.dil_w;
        if (wi >= 0 && wi < g.W) acc += to_float(row[int64_t(wi) * g.C]) * to_float(__ldg(wk + r * g.S + s));
      }
    }
    y[i] = from_float<T>(epilogue(acc, to_float(b[k]), z ? to_float(z[i]) : 0.f));
  }
}

// The filter covers the whole map (P = Q = 1): each image's output is a per-channel dot product of its map
// with the taps. Block: kGlobalChannels / 2 threads along x (2 channels each, one 2-element load per pixel)
// x kGlobalLanes lanes along y splitting the pixels; gridDim.x channel slices, gridDim.y pixel ranges
// (global_plan's splits), gridDim.z image groups. The block's taps are staged once and serve each of its
// images; the lanes' partial sums meet in shared memory, and lane 0 applies the epilogue (one range) or
// leaves the range's sums in `partials` for depthwise_global_finish.
template <class T>
__global__ void __launch_bounds__(kGlobalChannels / 2 * kGlobalLanes)
    depthwise_global(Geometry g, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                     const T* __restrict__ z, T* __restrict__ y, Epilogue epilogue, float* __restrict__ partials,
                     int split_pixels, int images_per_block) {
  constexpr int kRow = kGlobalChannels + 1;  // padded: the staging loop writes a column of taps
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");  // the finish kernel may be scheduled now; it waits
#endif
  __shared__ float taps[kGlobalSplitPixels * kRow];
  __shared__ float partial[kGlobalLanes * kRow];
  const int c_base = blockIdx.x * kGlobalChannels, split = blockIdx.y;
  const int width = min(kGlobalChannels, g.C - c_base);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  const int c_local = 2 * threadIdx.x, c = c_base + c_local;
  const int pixels = g.R * g.S;  // == H * W
  const int p0 = split * split_pixels, count = min(split_pixels, pixels - p0);
  for (int i = tid; i < width * count; i += threads) {  // along the taps of a channel: coalesced
    const int ch = i / count, t = i % count;
    taps[t * kRow + ch] = to_float(w[int64_t(c_base + ch) * pixels + p0 + t]);
  }
  const int n0 = blockIdx.z * images_per_block, n1 = min(g.N, n0 + images_per_block);
  for (int n = n0; n < n1; ++n) {
    __syncthreads();  // the taps are staged; the previous image's partial sums are read
    float acc0 = 0.f, acc1 = 0.f;
    if (c_local < width) {
      const T* image = x + (int64_t(n) * pixels + p0) * g.C + c;
#pragma unroll 4
      for (int t = threadIdx.y; t < count; t += kGlobalLanes) {
        const Vec<T, 2> v = *reinterpret_cast<const Vec<T, 2>*>(image + int64_t(t) * g.C);
        acc0 += to_float(v.v[0]) * taps[t * kRow + c_local];
        acc1 += to_float(v.v[1]) * taps[t * kRow + c_local + 1];
      }
    }
    partial[threadIdx.y * kRow + c_local] = acc0;
    partial[threadIdx.y * kRow + c_local + 1] = acc1;
    __syncthreads();
    if (threadIdx.y != 0 || c_local >= width) continue;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int lane = 0; lane < kGlobalLanes; ++lane) {
      sum0 += partial[lane * kRow + c_local];
      sum1 += partial[lane * kRow + c_local + 1];
    }
    const int64_t out = int64_t(n) * g.K + c;
    if (gridDim.y > 1) {  // [image][channel][range]
      partials[out * gridDim.y + split] = sum0;
      partials[(out + 1) * gridDim.y + split] = sum1;
      continue;
    }
    Vec<T, 2> yv;
    yv.v[0] = from_float<T>(epilogue(sum0, to_float(b[c]), z ? to_float(z[out]) : 0.f));
    yv.v[1] = from_float<T>(epilogue(sum1, to_float(b[c + 1]), z ? to_float(z[out + 1]) : 0.f));
    *reinterpret_cast<Vec<T, 2>*>(y + out) = yv;
  }
}

// A split map's ranges added up, then the epilogue: a warp per output element, its lanes striding the
// element's contiguous partial sums and meeting by shuffles (a fixed order, so a run repeats bit for bit).
// Launched as a programmatic dependent of depthwise_global where the device has it (sm_90+): its blocks
// are scheduled while the ranges are summed and wait here for that grid's completion and memory, so the
// pool pays one launch latency, not two.
template <class T>
__global__ void depthwise_global_finish(int64_t outputs, int C, int splits, const float* __restrict__ partials,
                                        const T* __restrict__ b, const T* __restrict__ z, T* __restrict__ y,
                                        Epilogue epilogue) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (i >= outputs) return;  // whole warps: the 32 threads of one element share i
  const float* sums = partials + i * splits;
  float sum = 0.f;
  for (int s = lane; s < splits; s += 32) sum += sums[s];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) y[i] = from_float<T>(epilogue(sum, to_float(b[i % C]), z ? to_float(z[i]) : 0.f));
}

size_t global_workspace(const ConvProblem& p) {
  return p.N > 0 ? size_t(global_workspace_bytes(p.N, p.C, p.R * p.S)) : 0;  // N < 0: not known yet
}

Geometry geometry_of(const ConvProblem& p) {
  return {int(p.N), int(p.H), int(p.W), int(p.C), int(p.K), int(p.R), int(p.S), int(p.P()), int(p.Q()),
          int(p.K / p.C), int(p.attr.stride_h), int(p.attr.stride_w), int(p.attr.dil_h), int(p.attr.dil_w),
          int(p.attr.pad_top), int(p.attr.pad_left)};
}

// Each of x, b, z (when present) and y is `bytes`-aligned.
bool aligned_to(const Tensors& t, size_t bytes) {
  for (const void* ptr : {t.x, t.b, t.z, static_cast<const void*>(t.y)})
    if (reinterpret_cast<uintptr_t>(ptr) % bytes) return false;
  return true;
}

Status misaligned(const char* kernel, size_t bytes) {
  return Status::Error(std::string(kernel) + ": x, b, z and y must be " + std::to_string(bytes) + "-byte aligned");
}

template <class T, int VEC>
Status launch_vec(const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t stream) {
  if (!aligned_to(t, 16)) return misaligned("cuda_depthwise_vec", 16);
  const int rs = g.R * g.S;
  const int groups_per_block = std::min((g.C + VEC - 1) / VEC, kVecGroups);
  const int slice = groups_per_block * VEC;  // vec_slice(C): the rule bounded rs * slice
  const int pixels_per_block = kVecThreads / groups_per_block;
  const int64_t pixels = int64_t(g.N) * g.P * g.Q;
  const dim3 block(groups_per_block, pixels_per_block);
  const dim3 grid(unsigned(std::min<int64_t>((pixels + pixels_per_block - 1) / pixels_per_block, 1 << 20)),
                  unsigned((g.C + slice - 1) / slice));
  depthwise_vec<T, VEC><<<grid, block, rs * slice * sizeof(float), stream>>>(
      g, static_cast<const T*>(t.x), static_cast<const T*>(t.w), static_cast<const T*>(t.b),
      static_cast<const T*>(t.z), static_cast<T*>(t.y), e, slice);
  return check_launch("cuda_depthwise_vec", cudaGetLastError());
}

template <class T, int R, int S, int SW>
Status launch_strip(const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t stream) {
  constexpr int kVec = strip_vec(S), kCols = strip_cols(SW, S, sizeof(T));
  if (!aligned_to(t, kVec * sizeof(T))) return misaligned("cuda_depthwise_strip", kVec * sizeof(T));
  const int64_t strips = (g.Q + kCols - 1) / kCols;
  const int64_t spatial = int64_t(g.N) * g.P * strips;  // the rule kept 2 * spatial within int32
  const int groups_total = g.C / kVec;
  const int slices = (groups_total + kStripThreads - 1) / kStripThreads;
  const int groups = (groups_total + slices - 1) / slices;
  const int rows = std::max(1, kStripThreads / groups);

  // One wave of blocks, each owning a contiguous run of items: a thread loads its taps once.
  const auto kernel = depthwise_strip<T, kVec, R, S, SW, kCols>;
  const size_t smem = shared_taps(R, S, kVec) ? size_t(R) * S * groups * kVec * sizeof(float) : 0;
  // A slice holds up to kStripThreads * kVec channels: 49 * 256 * 4 bytes passes the default 48 KB.
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return check_launch("cuda_depthwise_strip (shared memory)", err);
  }
  int device = 0, sms = 0, per_sm = 0;
  if (!current_device_sms(&device, &sms)) return Status::Error("cuda_depthwise_strip: the device's SM count is unknown");
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, groups * rows, smem);
  if (err != cudaSuccess) return check_launch("cuda_depthwise_strip (occupancy)", err);
  if (per_sm < 1 || sms < 1) return Status::Error("cuda_depthwise_strip: no block fits on an SM");
  const int64_t max_chunks = (spatial + rows - 1) / rows;
  const int64_t wave = std::max<int64_t>(1, int64_t(sms) * per_sm / slices);
  int64_t per_block = (spatial + std::min(max_chunks, wave) - 1) / std::min(max_chunks, wave);
  per_block = (per_block + rows - 1) / rows * rows;
  const int64_t chunks = (spatial + per_block - 1) / per_block;
  const StripTile tile{groups, int(strips), int(spatial), int(per_block)};
  kernel<<<dim3(unsigned(chunks), unsigned(slices)), dim3(unsigned(groups), unsigned(rows)), smem, stream>>>(
      g, tile, static_cast<const T*>(t.x), static_cast<const T*>(t.w), static_cast<const T*>(t.b),
      static_cast<const T*>(t.z), static_cast<T*>(t.y), e);
  return check_launch("cuda_depthwise_strip", cudaGetLastError());
}

template <class T, int R, class Cfg>
void launch_tile_config(const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t stream, int64_t blocks) {
  depthwise_tile<T, R, Cfg><<<dim3(unsigned(blocks), unsigned((g.C + Cfg::CB - 1) / Cfg::CB)), Cfg::kThreads,
                              tile_smem_bytes<T, R, Cfg>(), stream>>>(
      g, static_cast<const T*>(t.x), static_cast<const T*>(t.w), static_cast<const T*>(t.b),
      static_cast<const T*>(t.z), static_cast<T*>(t.y), e);
}

// x 16-byte aligned (cp.async), y and z two-element aligned; the wide tiles, or the small ones where
// the wide ones would not fill the GPU.
template <class T, int R>
Status launch_tile(const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(t.x) % 16) return Status::Error("cuda_depthwise_tile: x must be 16-byte aligned");
  if (!aligned_to(t, 2 * sizeof(T))) return misaligned("cuda_depthwise_tile", 2 * sizeof(T));
  static_assert(tile_smem_bytes<T, R, TileWide>() <= 48 * 1024 && tile_smem_bytes<T, R, TileSmall>() <= 48 * 1024,
                "within the default dynamic shared memory");
  int device = 0, sms = 0;
  if (!current_device_sms(&device, &sms)) return Status::Error("cuda_depthwise_tile: the device's SM count is unknown");
  if (tile_few_blocks(g.N, g.P, g.Q, g.C, sms))
    launch_tile_config<T, R, TileSmall>(g, t, e, stream, tile_blocks<TileSmall>(g.N, g.P, g.Q));
  else
    launch_tile_config<T, R, TileWide>(g, t, e, stream, tile_blocks<TileWide>(g.N, g.P, g.Q));
  return check_launch("cuda_depthwise_tile", cudaGetLastError());
}

template <class T>
Status launch_global(const Geometry& g, const Tensors& t, const Epilogue& e, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  if (!aligned_to(t, 2 * sizeof(T))) return misaligned("cuda_depthwise_global", 2 * sizeof(T));
  const GlobalPlan plan = global_plan(g.N, g.C, int64_t(g.R) * g.S);
  const int64_t needed = global_workspace_bytes(g.N, g.C, int64_t(g.R) * g.S);
  if (needed > 0 && (workspace == nullptr || workspace_bytes < size_t(needed) || reinterpret_cast<uintptr_t>(workspace) % 8))
    return Status::Error("cuda_depthwise_global: needs an 8-byte aligned workspace of " + std::to_string(needed) +
                         " bytes, got " + std::to_string(workspace_bytes));
  float* partials = static_cast<float*>(workspace);
  const dim3 grid(unsigned(plan.slices), unsigned(plan.splits), unsigned(plan.image_groups));
  depthwise_global<T><<<grid, dim3(kGlobalChannels / 2, kGlobalLanes), 0, stream>>>(
      g, static_cast<const T*>(t.x), static_cast<const T*>(t.w), static_cast<const T*>(t.b),
      static_cast<const T*>(t.z), static_cast<T*>(t.y), e, partials, int(plan.split_pixels),
      int(plan.images_per_block));
  if (plan.splits > 1) {
    const int64_t outputs = int64_t(g.N) * g.C;
    DeviceInfo device;
    cudaLaunchAttribute dependent[1];
    dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((outputs + 7) / 8));
    config.blockDim = dim3(256);  // 8 warps a block
    config.stream = stream;
    config.attrs = dependent;
    config.numAttrs = current_device_info(&device).ok() && device.sm >= 90 ? 1 : 0;
    const cudaError_t launched = cudaLaunchKernelEx(
        &config, depthwise_global_finish<T>, outputs, g.C, int(plan.splits), static_cast<const float*>(partials),
        static_cast<const T*>(t.b), static_cast<const T*>(t.z), static_cast<T*>(t.y), e);
    if (launched != cudaSuccess) return check_launch("cuda_depthwise_global (finish)", launched);
  }
  return check_launch("cuda_depthwise_global", cudaGetLastError());
}

template <class T>
Status launch_scalar(const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t stream) {
  const int64_t total = int64_t(g.N) * g.P * g.Q * g.K;
  const int blocks = int(std::min<int64_t>((total + kScalarThreads - 1) / kScalarThreads, 1 << 20));
  depthwise_scalar<T><<<blocks, kScalarThreads, 0, stream>>>(g, static_cast<const T*>(t.x), static_cast<const T*>(t.w),
                                                             static_cast<const T*>(t.b), static_cast<const T*>(t.z),
                                                             static_cast<T*>(t.y), e);
  return check_launch("cuda_depthwise_scalar", cudaGetLastError());
}

// The kernel `name` on `p`: its rule checked on the concrete problem (a dimension may have been unknown
// when it was chosen), nothing launched for an empty output, then the dtype's instantiation.
template <class Run>
Status run(const char* name, bool (*can_implement)(const ConvProblem&, std::string*), const ConvProblem& p,
           Run&& launch_typed) {
  std::string why;
  if (!can_implement(p, &why)) return Status::Error(std::string(name) + " cannot run this problem: " + why);
  if (p.N * p.P() * p.Q() * p.K == 0) return Status::Ok();
  return visit_dtype(p.dtype, [&](auto tag) { return launch_typed(tag, geometry_of(p)); });
}

Status run_global(const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run("cuda_depthwise_global", depthwise_global_can_implement, p, [&](auto tag, const Geometry& g) {
    return launch_global<decltype(tag)>(g, t, Epilogue::of(p), workspace, workspace_bytes, stream);
  });
}

Status run_tile(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  return run("cuda_depthwise_tile", depthwise_tile_can_implement, p, [&](auto tag, const Geometry& g) {
    using T = decltype(tag);
    const Epilogue e = Epilogue::of(p);
    switch (g.R) {  // the rule allows 3, 5 and 7
      case 3: return launch_tile<T, 3>(g, t, e, stream);
      case 5: return launch_tile<T, 5>(g, t, e, stream);
      default: return launch_tile<T, 7>(g, t, e, stream);
    }
  });
}

Status run_strip(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  return run("cuda_depthwise_strip", depthwise_strip_can_implement, p, [&](auto tag, const Geometry& g) {
    using T = decltype(tag);
    const Epilogue e = Epilogue::of(p);
    switch (g.S * 10 + g.stride_w) {  // the rule allows 3, 5, 7 and strides 1, 2
      case 31: return launch_strip<T, 3, 3, 1>(g, t, e, stream);
      case 32: return launch_strip<T, 3, 3, 2>(g, t, e, stream);
      case 51: return launch_strip<T, 5, 5, 1>(g, t, e, stream);
      case 52: return launch_strip<T, 5, 5, 2>(g, t, e, stream);
      case 71: return launch_strip<T, 7, 7, 1>(g, t, e, stream);
      default: return launch_strip<T, 7, 7, 2>(g, t, e, stream);
    }
  });
}

Status run_vec(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  return run("cuda_depthwise_vec", depthwise_vec_can_implement, p, [&](auto tag, const Geometry& g) {
    using T = decltype(tag);
    return launch_vec<T, 16 / sizeof(T)>(g, t, Epilogue::of(p), stream);
  });
}

Status run_scalar(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  return run("cuda_depthwise_scalar", depthwise_scalar_can_implement, p, [&](auto tag, const Geometry& g) {
    return launch_scalar<decltype(tag)>(g, t, Epilogue::of(p), stream);
  });
}

}  // namespace

std::vector<KernelImpl> depthwise_kernels() {
  return {{"cuda_depthwise_global", global_workspace, run_global},
          {"cuda_depthwise_tile", no_workspace, run_tile},
          {"cuda_depthwise_strip", no_workspace, run_strip},
          {"cuda_depthwise_vec", no_workspace, run_vec},
          {"cuda_depthwise_scalar", no_workspace, run_scalar}};
}

}  // namespace epifuse::cuda
