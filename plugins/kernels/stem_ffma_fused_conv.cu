// fp32 few-channel convs (RGB stems: C <= 4, R*S <= 64 taps) on the CUDA cores, in exact fp32 (FFMA).
// The tensor-core stem kernel (stem_fused_conv.cu) takes 16-bit types only; in fp32 the other kernels
// were the direct kernel (a serial loop per output element: EfficientNet-B0's 3x3 stem took 318 µs at
// batch 16 on an H200, cuDNN 36) and im2col + a GEMM whose R*S*C = 27-deep reduction is mostly padding.
// A stem has few multiply-adds per output byte (27 per output at 3x3 RGB), so FFMA keeps up with the
// output writes and needs no TF32 rounding.
//
// A block owns an output tile of kStemTileRows x kStemTileCols pixels (128: one per thread) of one image
// and kBlockK (16) output channels. It stages the input patch the tile reads as float4 pixels (channels
// padded to 4, zeros outside X) and its filter block as [tap][channel][16] floats. Per tap a thread loads
// its pixel (one 16-byte shared load) and, per channel, the 16 filter values every thread of the block
// shares (four broadcast 16-byte loads), for 16 multiply-adds per channel.
// Rule: stem_ffma_can_implement in plugins/core/rules_direct.cc.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "epilogue.cuh"
#include "kernel_api.h"
#include "registry.h"

namespace epifuse::cuda {
namespace {

constexpr int kThreads = kStemTileRows * kStemTileCols;  // a thread per output pixel of the tile
constexpr int kBlockK = 16;                              // output channels per block: 16 accumulators a thread
constexpr int kQuads = kBlockK / 4;

struct Geometry {
  int N, H, W, K, R, S, P, Q;
  int stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
  int patch_h, patch_w, tiles_p, tiles_q;
};

// Shared memory in float4s: the filter block [R*S][C][kQuads], then the patch [patch_h][patch_w].
size_t shared_bytes(const Geometry& g, int C) {
  return (size_t(g.R) * g.S * C * kQuads + size_t(g.patch_h) * g.patch_w) * sizeof(float4);
}

template <int C>
__global__ void __launch_bounds__(kThreads)
    stem_ffma(Geometry g, const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
              const float* __restrict__ z, float* __restrict__ y, Epilogue epilogue, bool vector_store) {
  extern __shared__ float4 shared[];
  __shared__ float bias[kBlockK];
  const int taps = g.R * g.S;
  float4* filter = shared;
  float4* patch = shared + taps * C * kQuads;
  const int tid = threadIdx.x;
  int tile = blockIdx.x;
  const int tile_q = tile % g.tiles_q;
  tile /= g.tiles_q;
  const int tile_p = tile % g.tiles_p;
  const int n = tile / g.tiles_p;
  const int k0 = blockIdx.y * kBlockK;

  // The filter block: W is [K][R][S][C], so a run of taps*C floats per output channel, read along it.
  const int run = taps * C;
  float* filter_floats = reinterpret_cast<float*>(filter);
  for (int i = tid; i < kBlockK * run; i += kThreads) {
    const int k = i / run, tc = i - k * run;
    filter_floats[tc * kBlockK + k] = k0 + k < g.K ? w[int64_t(k0 + k) * run + tc] : 0.f;
  }
  if (tid < kBlockK) bias[tid] = k0 + tid < g.K ? b[k0 + tid] : 0.f;
  // The patch: input rows from h0, columns from w0, zeros outside X and for the padding channels.
  const int h0 = tile_p * kStemTileRows * g.stride_h - g.pad_top;
  const int w0 = tile_q * kStemTileCols * g.stride_w - g.pad_left;
  const float* image = x + int64_t(n) * g.H * g.W * C;
  for (int i = tid; i < g.patch_h * g.patch_w; i += kThreads) {
    const int pr = i / g.patch_w, pc = i - pr * g.patch_w, h = h0 + pr, wi = w0 + pc;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (h >= 0 && h < g.H && wi >= 0 && wi < g.W) {
      const float* pixel = image + (int64_t(h) * g.W + wi) * C;
#pragma unroll
      for (int c = 0; c < C; ++c) v[c] = pixel[c];
    }
    patch[i] = make_float4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();

  const int ty = tid / kStemTileCols, tx = tid - ty * kStemTileCols;
  const float4* origin = patch + ty * g.stride_h * g.patch_w + tx * g.stride_w;
  float acc[kBlockK] = {};
  for (int r = 0; r < g.R; ++r) {
    const float4* row = origin + r * g.dil_h * g.patch_w;
    const float4* taps_of_row = filter + r * g.S * C * kQuads;
    for (int s = 0; s < g.S; ++s) {
      const float4 pixel = row[s * g.dil_w];
      const float channel[4] = {pixel.x, pixel.y, pixel.z, pixel.w};
      const float4* f = taps_of_row + s * C * kQuads;
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int j = 0; j < kQuads; ++j) {
          const float4 wv = f[c * kQuads + j];
          acc[4 * j] += channel[c] * wv.x;
          acc[4 * j + 1] += channel[c] * wv.y;
          acc[4 * j + 2] += channel[c] * wv.z;
          acc[4 * j + 3] += channel[c] * wv.w;
        }
    }
  }

  const int p = tile_p * kStemTileRows + ty, q = tile_q * kStemTileCols + tx;
  if (p >= g.P || q >= g.Q) return;
  const int64_t out = ((int64_t(n) * g.P + p) * g.Q + q) * g.K + k0;
  const int width = min(kBlockK, g.K - k0);
  // 16-byte stores for whole quads where K % 4 == 0 and Y is 16-byte aligned; Z is read per element.
  const int quads = vector_store ? width / 4 : 0;
#pragma unroll
  for (int j = 0; j < kQuads; ++j) {
    if (j >= quads) break;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = epilogue(acc[4 * j + e], bias[4 * j + e], z ? z[out + 4 * j + e] : 0.f);
    *reinterpret_cast<float4*>(y + out + 4 * j) = make_float4(v[0], v[1], v[2], v[3]);
  }
#pragma unroll
  for (int k = 0; k < kBlockK; ++k)
    if (k >= 4 * quads && k < width) y[out + k] = epilogue(acc[k], bias[k], z ? z[out + k] : 0.f);
}


template <int C>
Status launch_channels(const Geometry& g, const Tensors& t, const Epilogue& e, bool vector_store, cudaStream_t stream) {
  const size_t smem = shared_bytes(g, C);
  if (smem > 48 * 1024) return Status::Error("cuda_stem_ffma: " + std::to_string(smem) + " bytes of shared memory > 48 KB");
  const dim3 grid(unsigned(int64_t(g.N) * g.tiles_p * g.tiles_q), unsigned((g.K + kBlockK - 1) / kBlockK));
  stem_ffma<C><<<grid, kThreads, smem, stream>>>(g, static_cast<const float*>(t.x), static_cast<const float*>(t.w),
                                                 static_cast<const float*>(t.b), static_cast<const float*>(t.z),
                                                 static_cast<float*>(t.y), e, vector_store);
  return check_launch("cuda_stem_ffma", cudaGetLastError());
}

// Callers have checked stem_ffma_can_implement (the C ABI, kernel selection, TensorRT's shape change);
// the concrete extents must also fit the int32 indexing and the grid.
Status launch(const ConvProblem& p, const Tensors& t, void*, size_t, cudaStream_t stream) {
  std::string why;
  if (!stem_ffma_can_implement(p, &why)) return Status::Error("cuda_stem_ffma cannot run this problem: " + why);
  const ConvAttributes& a = p.attr;
  const int64_t P = p.P(), Q = p.Q();
  if (p.N == 0 || P <= 0 || Q <= 0 || p.K == 0) return Status::Ok();
  for (int64_t v : {p.N, p.H, p.W, P, Q, p.K, p.H * p.W * p.C, P * Q * p.K, P * a.stride_h + (p.R - 1) * a.dil_h,
                    Q * a.stride_w + (p.S - 1) * a.dil_w})
    if (v > INT32_MAX / 2) return Status::Error("cuda_stem_ffma: a dimension of the problem exceeds int32 indexing");
  Geometry g;
  g.N = int(p.N), g.H = int(p.H), g.W = int(p.W), g.K = int(p.K), g.R = int(p.R), g.S = int(p.S);
  g.P = int(P), g.Q = int(Q);
  g.stride_h = int(a.stride_h), g.stride_w = int(a.stride_w), g.dil_h = int(a.dil_h), g.dil_w = int(a.dil_w);
  g.pad_top = int(a.pad_top), g.pad_left = int(a.pad_left);
  g.patch_h = (kStemTileRows - 1) * g.stride_h + (g.R - 1) * g.dil_h + 1;
  g.patch_w = (kStemTileCols - 1) * g.stride_w + (g.S - 1) * g.dil_w + 1;
  g.tiles_p = (g.P + kStemTileRows - 1) / kStemTileRows;
  g.tiles_q = (g.Q + kStemTileCols - 1) / kStemTileCols;
  if (int64_t(g.N) * g.tiles_p * g.tiles_q > INT32_MAX / 2)
    return Status::Error("cuda_stem_ffma: more than INT32_MAX / 2 output tiles");
  if ((g.K + kBlockK - 1) / kBlockK > 65535) return Status::Error("cuda_stem_ffma: K > 65535 x 16");
  const bool vector_store = p.K % 4 == 0 && reinterpret_cast<uintptr_t>(t.y) % 16 == 0;
  const Epilogue e = Epilogue::of(p);
  switch (p.C) {
    case 1: return launch_channels<1>(g, t, e, vector_store, stream);
    case 2: return launch_channels<2>(g, t, e, vector_store, stream);
    case 3: return launch_channels<3>(g, t, e, vector_store, stream);
    default: return launch_channels<4>(g, t, e, vector_store, stream);
  }
}

}  // namespace

KernelImpl stem_ffma_kernel() { return {"cuda_stem_ffma", no_workspace, launch}; }

}  // namespace epifuse::cuda
