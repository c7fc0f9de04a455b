// Few-channel convs (RGB stems: C <= 4, R*S <= 64 taps) as an implicit GEMM on the tensor cores,
// fed from shared memory instead of an im2col matrix. cuDNN's `fprop_image_first_layer` kernels work
// this way; the im2col + GEMM family writes and re-reads ~R*S/(stride_h*stride_w) copies of X and
// fills a GEMM pipeline per chunk, which made ResNet-50's stem 1.6x slower than cuDNN.
//
// A block owns an output tile of kStemTileRows x kStemTileCols pixels (128) of one image and kBlockN
// (16, 32 or 64) output channels. It stages the input patch the tile reads ([patch_h][patch_w][4]:
// channels padded to 4, zeros for padding) and the filter as a [kBlockN][taps x 4] matrix. Each of
// the 4 warps computes 32 pixels x kBlockN channels with mma.sync m16n8k16 (fp32 accumulate): the
// reduction order puts a tap's 4 channels in one thread's A fragment, so A comes from the patch with
// one 8-byte shared load per pixel row and k-step; B comes from ldmatrix. The epilogue, compiled per
// activation, turns the fragments into T in shared memory, which leaves as 16-byte stores. Blocks are
// persistent (grid = what fits), so the filter is staged once per block and output-channel block.
// Rule: stem_can_implement in plugins/core/rules_direct.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "activation.h"
#include "dtype.cuh"
#include "kernel_api.h"
#include "registry.h"

namespace epifuse::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileM = kStemTileRows * kStemTileCols;  // output pixels per block
static_assert(kTileM == kWarps * 32, "each warp owns 32 pixels: two m16 tiles");

struct Geometry {
  int N, H, W, C, K, R, S, P, Q;
  int stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
  int columns_padded;  // the reduction: R*S taps rounded up to 4, times kStemChannels
  int patch_h, patch_w;
  int tiles_p, tiles_q;
  int tiles;  // k_blocks * N * tiles_p * tiles_q (launch keeps it under INT32_MAX / 2: int32 tile decoding)
};

// mma.sync m16n8k16 with fp32 accumulation, the operand type T's atom from CuTe.
template <class T>
using Mma16816 = std::conditional_t<std::is_same_v<T, __half>, cute::SM80_16x8x16_F32F16F16F32_TN,
                                    cute::SM80_16x8x16_F32BF16BF16F32_TN>;

template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Mma16816<T>::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b0, b1, c[0], c[1], c[2], c[3]);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* shared) {
  cute::SM75_U32x4_LDSM_N::copy(*static_cast<const cute::uint128_t*>(shared), r[0], r[1], r[2], r[3]);
}

template <class T>
struct alignas(2 * sizeof(T)) Pair {
  T v[2];
};
template <class T>
struct alignas(kStemChannels * sizeof(T)) Quad {  // one patch pixel: 8 bytes
  T v[kStemChannels];
};

constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Shared memory: filter [kBlockN][columns_padded + 8] (the 8-element pad staggers ldmatrix rows over
// the banks), bias [kBlockN] floats, tap offsets [taps_padded] ints, then the patch, which the output
// stage [kTileM][kBlockN + 8] (T, after the epilogue) reuses once the MMAs are done.
template <int kBlockN>
struct Layout {
  size_t filter, bias, offsets, patch, total;
  __host__ __device__ Layout(int columns_padded, int patch_elements, size_t element) {
    filter = 0;
    bias = align16(size_t(kBlockN) * (columns_padded + 8) * element);
    offsets = bias + align16(kBlockN * sizeof(float));
    patch = offsets + align16(columns_padded / kStemChannels * sizeof(int));
    const size_t patch_bytes = size_t(patch_elements) * element, stage_bytes = size_t(kTileM) * (kBlockN + 8) * element;
    total = patch + align16(patch_bytes > stage_bytes ? patch_bytes : stage_bytes);
  }
};

// Blocks per SM the registers must allow: 64 accumulators per thread at kBlockN = 64 fit 4 blocks in
// 128 registers; the narrower blocks have the registers for more.
constexpr int min_blocks(int block_n) { return block_n == 64 ? 4 : 5; }
constexpr int kBatch = 4;  // filter taps (up to 16 loads) in flight per thread while staging the filter
constexpr int kPixelBatch = 4;  // patch pixels in flight per thread: up to 16 loads

// The reduction runs over (tap, channel) with channels padded to kStemChannels = 4, in an order
// chosen for the mma fragments: in k-step ks, logical column L holds tap 4*ks + (L % 8) / 2 and
// channel (L / 8) * 2 + L % 2. A thread's A fragment columns {2q, 2q+1, 2q+8, 2q+9} are then the four
// channels of one tap, which sit together in the patch: one 8-byte shared load per pixel row. In the
// filter, tap t's channels 0-1 sit at column 16 * (t / 4) + 2 * (t % 4) and channels 2-3 eight further.

template <class T, int kBlockN, class Act>
__device__ __forceinline__ void finish_fragments(const float (&acc)[2][kBlockN / 8][4], Act act, Residual residual,
                                                 const float* bias, const T* __restrict__ z, T* stage,
                                                 const Geometry& g, int n, int tile_p, int tile_q, int k0) {
  const int warp = threadIdx.x / 32, group = threadIdx.x % 32 / 4, quad = threadIdx.x % 4;
  // Accumulator (mi, j, 2*half + e) is pixel m = warp*32 + mi*16 + half*8 + group, channel j*8 + 2*quad + e.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = warp * 32 + mi * 16 + half * 8 + group;
      const int p = tile_p * kStemTileRows + m / kStemTileCols, q = tile_q * kStemTileCols + m % kStemTileCols;
      const bool inside = p < g.P && q < g.Q;
      const int64_t out = ((int64_t(n) * g.P + p) * g.Q + q) * g.K + k0;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const int col = j * 8 + 2 * quad;
        const float2 bias2 = *reinterpret_cast<const float2*>(bias + col);
        float v0 = acc[mi][j][2 * half] + bias2.x, v1 = acc[mi][j][2 * half + 1] + bias2.y;
        float z0 = 0.f, z1 = 0.f;
        if (residual != Residual::kNone && inside) {
          if (k0 + col < g.K) z0 = to_float(z[out + col]);
          if (k0 + col + 1 < g.K) z1 = to_float(z[out + col + 1]);
        }
        if (residual == Residual::kPre) v0 += z0, v1 += z1;
        v0 = act(v0), v1 = act(v1);
        if (residual == Residual::kPost) v0 += z0, v1 += z1;
        Pair<T> pair;
        pair.v[0] = from_float<T>(v0);
        pair.v[1] = from_float<T>(v1);
        *reinterpret_cast<Pair<T>*>(stage + m * (kBlockN + 8) + col) = pair;
      }
    }
}

// Act: the activation functor. The common stem activations get their own instance; the others share
// act::Runtime (a switch per element): a switch over all of them in one kernel kept the accumulators
// live across 14 branches and spilled.
template <class T, int kBlockN, class Act>
__global__ void __launch_bounds__(kThreads, min_blocks(kBlockN))
    stem_fused_conv(Geometry g, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    const T* __restrict__ z, T* __restrict__ y, Act act, Residual residual, bool vector_store) {
  constexpr int kNTiles = kBlockN / 8;       // n8 tiles per warp: a warp covers every channel of the block
  constexpr int kStageStride = kBlockN + 8;  // the pad spreads a warp's stage stores over the banks
  static_assert(kNTiles % 2 == 0, "ldmatrix.x4 loads two n8 tiles");
  extern __shared__ __align__(16) unsigned char smem[];
  const int patch_row = g.patch_w * kStemChannels;
  const Layout<kBlockN> layout(g.columns_padded, g.patch_h * patch_row, sizeof(T));
  const int filter_stride = g.columns_padded + 8;
  T* filter = reinterpret_cast<T*>(smem + layout.filter);
  float* bias = reinterpret_cast<float*>(smem + layout.bias);
  int* offsets = reinterpret_cast<int*>(smem + layout.offsets);
  T* patch = reinterpret_cast<T*>(smem + layout.patch);
  T* stage = patch;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, group = lane / 4, quad = lane % 4;
  const int taps = g.R * g.S, taps_padded = g.columns_padded / kStemChannels;

  // Tap t = r*S + s reads the patch at offsets[t] from its pixel's window origin; the padding taps
  // read offset 0 (a real tap of the same pixel: finite data times a zero filter column).
  for (int t = tid; t < taps_padded; t += kThreads) {
    const int r = t / g.S, s = t - r * g.S;
    offsets[t] = t < taps ? (r * g.dil_h * g.patch_w + s * g.dil_w) * kStemChannels : 0;
  }
  // Window origin of the four pixel rows this thread's A fragments hold: m = warp*32 + mi*16 + half*8 + group.
  int base[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = warp * 32 + mi * 16 + half * 8 + group;
      base[mi][half] =
          ((m / kStemTileCols) * g.stride_h * g.patch_w + (m % kStemTileCols) * g.stride_w) * kStemChannels;
    }

  const int spatial_tiles = g.N * g.tiles_p * g.tiles_q;
  const int row_extent = g.W * g.C;
  int staged_block = -1;
  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int k_block = tile / spatial_tiles;
    int rest = tile - k_block * spatial_tiles;
    const int tile_q = rest % g.tiles_q;
    rest /= g.tiles_q;
    const int tile_p = rest % g.tiles_p;
    const int n = rest / g.tiles_p;
    const int k0 = k_block * kBlockN;
    __syncthreads();  // the previous tile's stage has left (and the offsets table is written)
    if (k_block != staged_block) {
      static_assert(kBlockN <= kThreads, "a thread per bias element");
      // The bias load goes out with the filter's rather than after them (one global round trip less
      // before the first tile: at batch 1 every block stages once and runs one tile).
      const float bias_value = tid < kBlockN && k0 + tid < g.K ? to_float(b[k0 + tid]) : 0.f;
      // filter[row][column] = W[k0 + row][tap][channel], zero for padding taps, channels and rows: a
      // thread moves one tap's C <= 4 channels as two 4-byte pairs, kBatch taps in flight. Staging element
      // by element, with that index math per element, was a third of the kernel's instructions (ncu,
      // ResNet-50's stem at batch 32).
      for (int start = tid; start < kBlockN * taps_padded; start += kBatch * kThreads) {
        Quad<T> v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = start + u * kThreads, row = i / taps_padded, tap = i - row * taps_padded;
          const bool real = i < kBlockN * taps_padded && k0 + row < g.K && tap < taps;
          const T* src = w + (int64_t(k0 + row) * taps + tap) * g.C;
#pragma unroll
          for (int c = 0; c < kStemChannels; ++c) v[u].v[c] = real && c < g.C ? src[c] : from_float<T>(0.f);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = start + u * kThreads, row = i / taps_padded, tap = i - row * taps_padded;
          if (i >= kBlockN * taps_padded) continue;
          T* dst = filter + row * filter_stride + tap / 4 * 16 + tap % 4 * 2;
          *reinterpret_cast<Pair<T>*>(dst) = Pair<T>{{v[u].v[0], v[u].v[1]}};
          *reinterpret_cast<Pair<T>*>(dst + 8) = Pair<T>{{v[u].v[2], v[u].v[3]}};
        }
      }
      if (tid < kBlockN) bias[tid] = bias_value;
      staged_block = k_block;
    }
    // The patch [patch_h][patch_w][4]: input rows from h0, columns from w0; zeros outside X and for
    // the padding channels. A thread stages whole pixels (its C <= 4 loads, one 8-byte store) at a
    // fixed patch column, kPixelBatch rows in flight: per-element staging with its index math made this
    // kernel issue-bound (ncu, YOLOv8s stem at batch 32: SM 59% busy, DRAM 13%).
    const int h0 = tile_p * kStemTileRows * g.stride_h - g.pad_top;
    const int w0 = tile_q * kStemTileCols * g.stride_w - g.pad_left;
    const T* image = x + int64_t(n) * g.H * row_extent;
    // rows_per_pass patch rows of patch_w pixels per pass of the block; this thread's (row, column)
    // in a pass (one division per tile rather than three registers held across the tile loop).
    // Patches wider than the block take one row per pass and several columns per thread.
    const int rows_per_pass = g.patch_w <= kThreads ? kThreads / g.patch_w : 1;
    const int stage_row = g.patch_w <= kThreads ? tid / g.patch_w : 0;
    const int stage_col = g.patch_w <= kThreads ? tid - stage_row * g.patch_w : tid;
    for (int col = stage_col; col < g.patch_w && stage_row < rows_per_pass; col += kThreads) {
      const int wi = w0 + col;
      const bool column_inside = wi >= 0 && wi < g.W;
      for (int pr0 = stage_row; pr0 < g.patch_h; pr0 += kPixelBatch * rows_per_pass) {
        Quad<T> v[kPixelBatch];
#pragma unroll
        for (int u = 0; u < kPixelBatch; ++u) {
          const int pr = pr0 + u * rows_per_pass, h = h0 + pr;
          const bool inside = column_inside && pr < g.patch_h && h >= 0 && h < g.H;
          const int64_t at = int64_t(h) * row_extent + wi * g.C;
#pragma unroll
          for (int c = 0; c < kStemChannels; ++c) v[u].v[c] = inside && c < g.C ? image[at + c] : from_float<T>(0.f);
        }
#pragma unroll
        for (int u = 0; u < kPixelBatch; ++u) {
          const int pr = pr0 + u * rows_per_pass;
          if (pr < g.patch_h) reinterpret_cast<Quad<T>*>(patch)[pr * g.patch_w + col] = v[u];
        }
      }
    }
    __syncthreads();

    float acc[2][kNTiles][4] = {};
    for (int k = 0; k < g.columns_padded; k += 16) {
      const int offset = offsets[k / 4 + quad];  // this thread's tap in k-step k / 16
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint2 row_lo = *reinterpret_cast<const uint2*>(patch + base[mi][0] + offset);  // channels 0-3, row g
        const uint2 row_hi = *reinterpret_cast<const uint2*>(patch + base[mi][1] + offset);  // row g + 8
        a[mi][0] = row_lo.x, a[mi][1] = row_hi.x, a[mi][2] = row_lo.y, a[mi][3] = row_hi.y;
      }
#pragma unroll
      for (int j = 0; j < kNTiles; j += 2) {
        // Lanes 0-7 address n-tile j at columns k.., 8-15 at k+8.., 16-31 the same for n-tile j+1.
        uint32_t bfrag[4];
        ldmatrix_x4(bfrag, filter + ((j + lane / 16) * 8 + lane % 8) * filter_stride + k + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<T>(acc[mi][j], a[mi], bfrag[0], bfrag[1]);
          mma_16816<T>(acc[mi][j + 1], a[mi], bfrag[2], bfrag[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with the patch: the stage takes its place

    finish_fragments<T, kBlockN>(acc, act, residual, bias, z, stage, g, n, tile_p, tile_q, k0);
    __syncthreads();

    // 16-byte stores where K % 8 == 0 and Y is 16-byte aligned (vector_store), else element by element.
    if (vector_store) {
      // A thread keeps one 8-channel run and steps over pixels: kThreads / kRuns pixels per pass.
      constexpr int kRuns = kBlockN / 8, kPixelsPerPass = kThreads / kRuns;
      static_assert(kTileM % kPixelsPerPass == 0 && kPixelsPerPass % kStemTileCols == 0, "whole tile rows per pass");
      const int col = tid % kRuns * 8, m0 = tid / kRuns;
      const int q = tile_q * kStemTileCols + m0 % kStemTileCols;
      if (q < g.Q && k0 + col < g.K) {
        const int p0 = tile_p * kStemTileRows + m0 / kStemTileCols;
        T* out = y + ((int64_t(n) * g.P + p0) * g.Q + q) * g.K + k0 + col;
        const int64_t pass_stride = int64_t(kPixelsPerPass / kStemTileCols) * g.Q * g.K;  // output rows per pass
#pragma unroll
        for (int pass = 0; pass < kTileM / kPixelsPerPass; ++pass) {
          if (p0 + pass * (kPixelsPerPass / kStemTileCols) >= g.P) break;
          *reinterpret_cast<uint4*>(out + pass * pass_stride) =
              *reinterpret_cast<const uint4*>(stage + (m0 + pass * kPixelsPerPass) * kStageStride + col);
        }
      }
    } else {
      for (int i = tid; i < kTileM * kBlockN; i += kThreads) {
        const int m = i / kBlockN, col = i - m * kBlockN;
        const int p = tile_p * kStemTileRows + m / kStemTileCols, q = tile_q * kStemTileCols + m % kStemTileCols;
        if (p >= g.P || q >= g.Q || k0 + col >= g.K) continue;
        y[((int64_t(n) * g.P + p) * g.Q + q) * g.K + k0 + col] = stage[m * kStageStride + col];
      }
    }
  }
}


template <class T, int kBlockN, class Act>
Status launch_with(const Geometry& g, const Tensors& t, Act act, Residual residual, bool vector_store,
                   cudaStream_t stream) {
  auto kernel = stem_fused_conv<T, kBlockN, Act>;
  const size_t smem = Layout<kBlockN>(g.columns_padded, g.patch_h * g.patch_w * kStemChannels, sizeof(T)).total;
  // The largest shared-memory carveout: the default one fits 3 blocks of ~40 KB, registers allow 4.
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess && smem > 48 * 1024)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return check_launch("cuda_stem_mma", e);
  int device = 0, sms = 0, per_sm = 0;
  if (!current_device_sms(&device, &sms)) sms = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1) {
    cudaGetLastError();
    per_sm = 1;
  }
  const int64_t grid = std::min<int64_t>(g.tiles, int64_t(sms) * per_sm);
  kernel<<<unsigned(grid), kThreads, smem, stream>>>(g, static_cast<const T*>(t.x), static_cast<const T*>(t.w),
                                                     static_cast<const T*>(t.b), static_cast<const T*>(t.z),
                                                     static_cast<T*>(t.y), act, residual, vector_store);
  return check_launch("cuda_stem_mma", cudaGetLastError());
}

template <class T, int kBlockN>
Status launch_typed(const Geometry& g, const Tensors& t, const ConvAttributes& a, bool vector_store,
                    cudaStream_t stream) {
  auto with = [&](auto act) { return launch_with<T, kBlockN>(g, t, act, a.residual, vector_store, stream); };
  switch (a.activation.kind) {  // ResNet (relu), YOLO and EfficientNet (silu), MobileNetV3 (hardswish), ConvNeXt (none)
    case ActivationKind::kIdentity: return with(act::Identity{});
    case ActivationKind::kRelu: return with(act::Relu{});
    case ActivationKind::kSilu: return with(act::Silu16bit{});  // 16-bit outputs only
    case ActivationKind::kHardSwish: return with(act::HardSwish{});
    default: return with(act::runtime(a.activation));
  }
}

// Callers have checked stem_can_implement (the C ABI, kernel selection, TensorRT's shape change), so
// the patch fits shared memory; the concrete extents must also fit the int32 indexing used here.
Status launch(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  const ConvAttributes& a = p.attr;
  const int64_t P = p.P(), Q = p.Q();
  for (int64_t v : {p.N, p.H, p.W * p.C, P, Q, p.K, p.H + a.pad_top + a.pad_bottom,
                    (p.W + a.pad_left + a.pad_right) * p.C, P * a.stride_h + (p.R - 1) * a.dil_h,
                    (Q * a.stride_w + (p.S - 1) * a.dil_w) * p.C})
    if (v > INT32_MAX / 2) return Status::Error("cuda_stem_mma: a dimension of the problem exceeds int32 indexing");
  if (p.N == 0 || P <= 0 || Q <= 0 || p.K == 0) return Status::Ok();
  Geometry g;
  g.N = int(p.N), g.H = int(p.H), g.W = int(p.W), g.C = int(p.C), g.K = int(p.K), g.R = int(p.R), g.S = int(p.S);
  g.P = int(P), g.Q = int(Q);
  g.stride_h = int(a.stride_h), g.stride_w = int(a.stride_w), g.dil_h = int(a.dil_h), g.dil_w = int(a.dil_w);
  g.pad_top = int(a.pad_top), g.pad_left = int(a.pad_left);
  g.columns_padded = int((p.R * p.S + 3) / 4 * 4 * kStemChannels);
  g.patch_h = (kStemTileRows - 1) * g.stride_h + (g.R - 1) * g.dil_h + 1;
  g.patch_w = (kStemTileCols - 1) * g.stride_w + (g.S - 1) * g.dil_w + 1;
  g.tiles_p = (g.P + kStemTileRows - 1) / kStemTileRows;
  g.tiles_q = (g.Q + kStemTileCols - 1) / kStemTileCols;
  const int block_n = p.K <= 16 ? 16 : p.K <= 32 ? 32 : 64;
  const int64_t tiles = int64_t(g.N) * g.tiles_p * g.tiles_q * ((g.K + block_n - 1) / block_n);
  // Half of int32's range: the tile loop's `tile += gridDim.x` must not overflow either.
  if (tiles > INT32_MAX / 2) return Status::Error("cuda_stem_mma: more than INT32_MAX / 2 output tiles");
  g.tiles = int(tiles);
  const bool vector_store = p.K % 8 == 0 && reinterpret_cast<uintptr_t>(t.y) % 16 == 0;  // Z is read per element
  return visit_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      return Status::Error("cuda_stem_mma: float32 has no tensor-core path here");
    } else {
      switch (block_n) {
        case 16: return launch_typed<T, 16>(g, t, a, vector_store, stream);
        case 32: return launch_typed<T, 32>(g, t, a, vector_store, stream);
        default: return launch_typed<T, 64>(g, t, a, vector_store, stream);
      }
    }
  });
}

}  // namespace

KernelImpl stem_kernel() { return {"cuda_stem_mma", no_workspace, launch}; }

}  // namespace epifuse::cuda
