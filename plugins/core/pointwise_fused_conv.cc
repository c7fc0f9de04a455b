#include "pointwise_fused_conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "activation.h"
#include "simd_math.h"

namespace epifuse {
namespace {

// Pieces of pixels a thread: enough to even out a ragged end.
constexpr int64_t kPiecesPerThread = 4;
// Below this many multiply-adds the conv runs on the calling thread: a hand-off to ORT's pool costs a
// microsecond or two.
constexpr int64_t kMinMacsToSplit = 1 << 15;

struct Geometry {
  int64_t C, K, Kp;  // Kp: K rounded up to whole vectors
  simd::GemmShape shape;   // the register tile: pixels x output-channel vectors of a full panel
  Residual residual;
  Activation activation;
};

using Tile = void (*)(const Geometry&, const float*, const float*, const float*, const float*, float*, int64_t,
                      int64_t);

namespace avx512 {
using Vec = simd::Avx512;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX512
#include "vector_epilogue.inc"
#include "pointwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET

// The tiles gemm_shape makes: one panel of 1-5 vectors, or panels of 6 x 4 and a last narrower one. FIXED_C:
// the input channels, fixed when compiled (0: at run time).
template <int FIXED_C>
Tile tile_of(simd::GemmShape s) {
  switch (s.rows * 8 + s.vectors) {
    case 14 * 8 + 1: return tile<14, 1, FIXED_C>;
    case 12 * 8 + 2: return tile<12, 2, FIXED_C>;
    case 8 * 8 + 3: return tile<8, 3, FIXED_C>;
    case 6 * 8 + 1: return tile<6, 1, FIXED_C>;
    case 6 * 8 + 2: return tile<6, 2, FIXED_C>;
    case 6 * 8 + 3: return tile<6, 3, FIXED_C>;
    case 6 * 8 + 4: return tile<6, 4, FIXED_C>;
    case 5 * 8 + 5: return tile<5, 5, FIXED_C>;
    default: return nullptr;
  }
}

// 16 and 32 input channels with C fixed (the first expand of MobileNets and EfficientNets, MobileNetV3's
// 16 -> 16, the 32 -> 16 after MobileNetV2's, MNASNet's and EfficientNet's first depthwise conv): on one
// thread, hot, 16 -> 16 at 112x112 1.13x and 32 -> 16 1.17x, 32 -> 24 1.07x, the wider ones 1.00-1.02x
// (bench/cpu_pointwise.cc); whole models 1.00x.
Tile tile_for(simd::GemmShape s, int64_t C) {
  return C == 16 ? tile_of<16>(s) : C == 32 ? tile_of<32>(s) : tile_of<0>(s);
}
}  // namespace avx512

namespace avx2 {
using Vec = simd::Avx2;
#define EPIFUSE_VECTOR_TARGET EPIFUSE_AVX2
#include "vector_epilogue.inc"
#include "pointwise_kernels.inc"
#undef EPIFUSE_VECTOR_TARGET

Tile tile_for(simd::GemmShape s, int64_t) {
  if (s.rows != 6) return nullptr;
  return s.vectors == 1 ? tile<6, 1> : s.vectors == 2 ? tile<6, 2> : nullptr;
}
}  // namespace avx2

// A panel of output-channel vectors, from channel k0, and the tile that runs it.
struct Panel {
  int64_t k0;
  Tile tile;
};

}  // namespace

bool PointwiseConv::supports(const ConvProblem& p) const {
  const ConvAttributes& a = p.attr;
  return p.dtype == DType::kFloat && isa_ != VectorIsa::kNone && p.R == 1 && p.S == 1 && a.group == 1 &&
         a.stride_h == 1 && a.stride_w == 1 && a.pad_top == 0 && a.pad_left == 0 && a.pad_bottom == 0 &&
         a.pad_right == 0 && p.C > 0 && p.C <= kMaxChannels && p.K > 0;
}

std::string PointwiseConv::name() const { return std::string("pointwise direct ") + isa_name(isa_); }

Status PointwiseConv::run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                          const void* z, void* y, const ParallelFor& parallel_for) {
  if (!supports(p)) return Status::Error("the pointwise kernel does not run this problem");
  const bool avx512 = isa_ == VectorIsa::kAvx512;
  const int64_t lanes = simd::lanes_of(isa_), pixels = p.N * p.H * p.W;
  const int64_t Kp = round_up(p.K, lanes), k_vectors = Kp / lanes;
  const simd::GemmShape shape = avx512 ? simd::Avx512::gemm_shape(k_vectors) : simd::Avx2::gemm_shape(k_vectors);
  const Geometry g{p.C, p.K, Kp, shape, p.attr.residual, p.attr.activation};
  std::vector<Panel> panels;
  for (int64_t v = 0; v < k_vectors; v += shape.vectors) {
    const simd::GemmShape s{shape.rows, static_cast<int>(std::min<int64_t>(shape.vectors, k_vectors - v))};
    panels.push_back({v * lanes, avx512 ? avx512::tile_for(s, p.C) : avx2::tile_for(s, p.C)});
    if (panels.back().tile == nullptr) return Status::Error("the pointwise kernel has no tile for this shape");
  }
  const auto filters = filters_.get(w, w_constant, g.C * Kp, [&](float* f) {
    arrange_panels(static_cast<const float*>(w), g.C, g.K, Kp, shape.vectors * lanes, f);
  });
  const float *xs = static_cast<const float*>(x), *zs = static_cast<const float*>(z), *bias = static_cast<const float*>(b);
  float* ys = static_cast<float*>(y);
  const float* f = filters->data;
  const int64_t rows = shape.rows, blocks = (pixels + rows - 1) / rows;
  // Blocks [b0, b1) of `rows` pixels, every panel of each; the map's last partial block from a zero-padded
  // copy of its input.
  auto run_blocks = [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t i0 = blk * rows, valid = std::min(rows, pixels - i0);
      alignas(64) float padded[16 * kMaxChannels];
      const float* xb = xs + i0 * g.C;
      if (valid < rows) {
        std::memset(padded, 0, sizeof(float) * rows * g.C);
        std::memcpy(padded, xb, sizeof(float) * valid * g.C);
        xb = padded;
      }
      for (const Panel& panel : panels)
        panel.tile(g, xb, f + g.C * panel.k0, bias, zs ? zs + i0 * g.K : nullptr, ys + i0 * g.K, panel.k0, valid);
    }
  };
  if (pixels * g.C * g.K < kMinMacsToSplit) {
    run_blocks(0, blocks);
    return Status::Ok();
  }
  const int64_t pieces = std::min(blocks, hardware_threads() * kPiecesPerThread);
  parallel_for(pieces, [&](int64_t i) { run_blocks(i * blocks / pieces, (i + 1) * blocks / pieces); });
  return Status::Ok();
}

}  // namespace epifuse
