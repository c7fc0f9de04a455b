#include "gemv_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Output-channel vectors a block: accumulators in registers (8 of AVX-512's 32, of AVX2's 16).
constexpr int kBlockVectors = 8;
// Below this many multiply-adds the product runs on the calling thread: a hand-off to ORT's pool costs
// a few microseconds, what a 1152 x 48 product takes.
constexpr int64_t kMinMacsToSplit = 1 << 17;

struct Geometry {
  int64_t C, K, Kp;  // Kp: K rounded up to whole vectors, the prepared filters' row stride
  Residual residual;
  Activation activation;
};

namespace avx512 {
using Vec = simd::Avx512;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512
#include "vector_epilogue.inc"
#include "gemv_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx512

namespace avx2 {
using Vec = simd::Avx2;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2
#include "vector_epilogue.inc"
#include "gemv_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET
}  // namespace avx2

}  // namespace

bool GemvConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && p.R == 1 && p.S == 1 && a.group == 1 && a.stride_h == 1 && a.stride_w == 1 &&
         a.pad_top == 0 && a.pad_left == 0 && a.pad_bottom == 0 && a.pad_right == 0 && p.C > 0 && p.K > 0 &&
         p.N * p.H * p.W <= kMaxPixels && isa_ != VectorIsa::kNone;
}

std::string GemvConv::name() const { return std::string("gemv direct ") + isa_name(isa_); }

Status GemvConv::run(const ConvProblem& p, const void* x_data, const void* w_data, bool w_constant,
                     const void* b_data, const void* z_data, void* y_data, const ParallelFor& parallel_for) {
  // fp32 only (supports)
  const float *x = static_cast<const float*>(x_data), *w = static_cast<const float*>(w_data),
              *b = static_cast<const float*>(b_data), *z = static_cast<const float*>(z_data);
  float* y = static_cast<float*>(y_data);
  if (!supports(p)) return Status::Error("the gemv kernel does not run this problem");
  const int64_t lanes = simd::lanes_of(isa_), pixels = p.N * p.H * p.W;
  if (pixels == 0) return Status::Ok();
  const Geometry g{p.C, p.K, round_up(p.K, lanes), p.attr.residual, p.attr.activation};
  // KRSC [K][C] to panels of kBlockVectors output-channel vectors, each [C][its vectors], one after
  // another: a block's filters are one stream of memory (they come cold in a model).
  const int64_t panel_width = kBlockVectors * lanes;
  const auto filters = filters_.get(w, w_constant, g.C * g.Kp, [&](float* f) {
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t k0 = k / panel_width * panel_width, width = std::min(panel_width, g.Kp - k0);
      for (int64_t c = 0; c < g.C; ++c) f[g.C * k0 + c * width + (k - k0)] = w[k * g.C + c];
    }
  });
  const float* f = filters->data;
  const auto blocks_of_pixel = isa_ == VectorIsa::kAvx512 ? avx512::pixel_blocks : avx2::pixel_blocks;
  const int64_t blocks = (g.Kp + panel_width - 1) / panel_width;
  auto pixel = [&](int64_t i, int64_t b0, int64_t b1) {
    blocks_of_pixel(g, x + i * g.C, f, b, z ? z + i * g.K : nullptr, y + i * g.K, b0, b1);
  };
  if (pixels * g.C * g.K < kMinMacsToSplit) {
    for (int64_t i = 0; i < pixels; ++i) pixel(i, 0, blocks);
    return Status::Ok();
  }
  parallel_for(pixels * blocks, [&](int64_t i) { pixel(i / blocks, i % blocks, i % blocks + 1); });
  return Status::Ok();
}

}  // namespace epifuse
