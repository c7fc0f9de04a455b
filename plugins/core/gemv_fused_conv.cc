#include "gemv_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "activation.h"
#include "bf16_vectors.h"
#include "float_types.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Output-channel vectors a block: accumulators in registers (8 of AVX-512's 32, of AVX2's 16).
constexpr int kBlockVectors = 8;
// Below this many multiply-adds the product runs on the calling thread: a hand-off to ORT's pool costs
// a microsecond or two, what streaming 128 KB of filters takes. In a model the filters come from L3 or
// memory, not L1: MobileNetV3-Large's 672 <-> 168 squeeze-excite convs (113K) took 22 us on one thread,
// 17-19 on two; its 16 gates 303 -> 270 us (ORT's 1x1 convs: 225).
constexpr int64_t kMinMacsToSplit = 1 << 15;

struct Geometry {
  int64_t C, K, Kp;  // Kp: K rounded up to whole vectors, the prepared filters' row stride
  Residual residual;
  Activation activation;
};

namespace avx512 {
using Vec = simd::Avx512;
using Data = float;
using Weight = float;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512
EPIFUSE_VECTOR_TARGET inline Vec::F load_weights(const float* p) { return Vec::load(p); }
#include "vector_epilogue.inc"
#include "gemv_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512

// bfloat16 data and filters (half the bytes of a squeeze-excite conv's filters to stream), fp32 sums;
// AVX512-BW for the masked 16-bit loads and stores.
namespace avx512_bf16 {
using Vec = simd::Avx512;
using Data = bfloat16_t;
using Weight = bfloat16_t;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512BW
EPIFUSE_VECTOR_TARGET inline Vec::F load_weights(const bfloat16_t* p) { return load_bf16x16(p); }
EPIFUSE_VECTOR_TARGET inline Vec::F load_data(Vec::Mask m, const bfloat16_t* p) { return load_bf16x16_masked(m, p); }
EPIFUSE_VECTOR_TARGET inline void store_data(bfloat16_t* p, Vec::Mask m, Vec::F v) { store_bf16x16_masked(p, m, v); }
#include "vector_epilogue.inc"
#include "gemv_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512_bf16

namespace avx2 {
using Vec = simd::Avx2;
using Data = float;
using Weight = float;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2
EPIFUSE_VECTOR_TARGET inline Vec::F load_weights(const float* p) { return Vec::load(p); }
#include "vector_epilogue.inc"
#include "gemv_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx2

}  // namespace

bool GemvConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  const bool dtype = p.dtype == DType::kFloat ? isa_ != VectorIsa::kNone
                     : p.dtype == DType::kBFloat16 && isa_ == VectorIsa::kAvx512 && cpu_has_avx512bw_vl();
  return dtype && p.R == 1 && p.S == 1 && a.group == 1 && a.stride_h == 1 && a.stride_w == 1 &&
         a.pad_top == 0 && a.pad_left == 0 && a.pad_bottom == 0 && a.pad_right == 0 && p.C > 0 && p.K > 0 &&
         p.N * p.H * p.W <= kMaxPixels;
}

std::string GemvConv::name() const { return std::string("gemv direct ") + isa_name(isa_); }

namespace {

// The pixels' blocks of output channels on the caller's threads (this one alone below kMinMacsToSplit).
template <class T, class PixelBlocks>
void run_pixels(const Geometry& g, int64_t pixels, int64_t blocks, PixelBlocks pixel_blocks, const void* x,
                const T* f, const float* b, const void* z, void* y, const ParallelFor& parallel_for) {
  const T *xs = static_cast<const T*>(x), *zs = static_cast<const T*>(z);
  T* ys = static_cast<T*>(y);
  auto pixel = [&](int64_t i, int64_t b0, int64_t b1) {
    pixel_blocks(g, xs + i * g.C, f, b, zs ? zs + i * g.K : nullptr, ys + i * g.K, b0, b1);
  };
  if (pixels * g.C * g.K < kMinMacsToSplit) {
    for (int64_t i = 0; i < pixels; ++i) pixel(i, 0, blocks);
    return;
  }
  parallel_for(pixels * blocks, [&](int64_t i) { pixel(i / blocks, i % blocks, i % blocks + 1); });
}

}  // namespace

Status GemvConv::run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                     const void* z, void* y, const ParallelFor& parallel_for) {
  if (!supports(p)) return Status::Error("the gemv kernel does not run this problem");
  const int64_t lanes = simd::lanes_of(isa_), pixels = p.N * p.H * p.W;
  if (pixels == 0) return Status::Ok();
  const Geometry g{p.C, p.K, round_up(p.K, lanes), p.attr.residual, p.attr.activation};
  const int64_t blocks = (g.Kp + kBlockVectors * lanes - 1) / (kBlockVectors * lanes);
  if (p.dtype == DType::kBFloat16) {  // bf16 filters in the float buffer, two a float; the bias in fp32
    const auto filters = filters_.get(w, w_constant, (g.C * g.Kp + 1) / 2, [&](float* f) {
      arrange_panels(static_cast<const bfloat16_t*>(w), g.C, g.K, g.Kp, kBlockVectors * lanes, reinterpret_cast<bfloat16_t*>(f));
    });
    std::vector<float> bias(static_cast<size_t>(g.K));
    for (int64_t k = 0; k < g.K; ++k) bias[k] = to_float(static_cast<const bfloat16_t*>(b)[k]);
    run_pixels(g, pixels, blocks, avx512_bf16::pixel_blocks, x, reinterpret_cast<const bfloat16_t*>(filters->data),
               bias.data(), z, y, parallel_for);
    return Status::Ok();
  }
  const auto filters = filters_.get(w, w_constant, g.C * g.Kp, [&](float* f) {
    arrange_panels(static_cast<const float*>(w), g.C, g.K, g.Kp, kBlockVectors * lanes, f);
  });
  run_pixels(g, pixels, blocks, isa_ == VectorIsa::kAvx512 ? avx512::pixel_blocks : avx2::pixel_blocks, x,
             filters->data, static_cast<const float*>(b), z, y, parallel_for);
  return Status::Ok();
}

}  // namespace epifuse
