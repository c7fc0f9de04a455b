// The CPU 1x1 kernel of the pair ops' bands (plugins/core/pointwise_fused_conv.h) alone, on MobileNetV3-Large's
// 1x1 convs of at most 128 input channels and MobileNetV2's 32-channel ones, over whole maps, fp32, batch 1, one thread, inputs hot in cache where
// they fit: a markdown table of the best time per call against the FMA-bound floor. Built from the library's
// sources, no ONNX Runtime:
//
//   g++ -std=c++17 -O3 -DNDEBUG -Iplugins/core bench/cpu_pointwise.cc
//       plugins/core/{pointwise_fused_conv,conv_problem,parallel,cpu_epilogue}.cc -o /tmp/cpu_pointwise -lpthread
//   (one command line, from the repository root)
//   /tmp/cpu_pointwise [--peak-gfma 8.1]
//
// --peak-gfma: one core's 16-lane multiply-adds a second (8.1 G on the Zen 5 of docs/bench-cpu.md); the floor
// counts whole output vectors (24 channels as 32). Two builds compare by running their binaries alternately,
// several times, and taking each layer's best.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_kernel_bench.h"
#include "pointwise_fused_conv.h"

using namespace epifuse;
using namespace epifuse_bench;

namespace {

struct Layer {
  int H, C, K;
  const char* activation;
  bool residual;  // added after the activation, as MobileNetV3's projections add the block's input
};

// MobileNetV3-Large's expands and projections of at most 128 input channels, then MobileNetV2's 32 -> 16 after
// its first depthwise conv and 32 -> 192 expand, at 224x224
const Layer kLayers[] = {
    {112, 16, 16, "identity", true}, {112, 16, 64, "relu", false},    {56, 24, 72, "relu", false},
    {56, 64, 24, "identity", false}, {56, 72, 24, "identity", true},  {28, 40, 120, "relu", false},
    {28, 120, 40, "identity", true}, {28, 40, 240, "hardswish", false}, {14, 80, 200, "hardswish", false},
    {14, 112, 672, "hardswish", false}, {112, 32, 16, "identity", false}, {28, 32, 192, "relu", false}};

}  // namespace

int main(int argc, char** argv) {
  double peak_gfma = 8.1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--peak-gfma") && i + 1 < argc) {
      peak_gfma = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--peak-gfma G]\n", argv[0]);
      return 2;
    }
  }
  std::printf("| 1x1 layer | activation | residual | µs | FMA floor µs | of peak |\n|---|---|---|---:|---:|---:|\n");
  double total = 0, total_floor = 0;
  for (const Layer& l : kLayers) {
    ConvProblem p;
    p.N = 1;
    p.H = p.W = l.H;
    p.C = l.C;
    p.K = l.K;
    p.R = p.S = 1;
    p.attr.residual = l.residual ? Residual::kPost : Residual::kNone;
    Status status = parse_activation(l.activation, nullptr, 0, &p.attr.activation);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.message().c_str());
      return 1;
    }
    const size_t pixels = static_cast<size_t>(l.H) * l.H;
    Aligned x(pixels * l.C), w(static_cast<size_t>(l.K) * l.C), b(l.K), z(pixels * l.K), y(pixels * l.K);
    fill_pattern(x.data, pixels * l.C, 97);
    fill_pattern(z.data, pixels * l.K, 89);
    fill_pattern(w.data, static_cast<size_t>(l.K) * l.C, 13);
    std::fill(b.data, b.data + l.K, 0.1f);
    PointwiseConv conv;
    const double best = best_call_us(9, 40, [&] {
      return conv.run(p, x.data, w.data, true, b.data, l.residual ? z.data : nullptr, y.data, parallel_for_serial);
    });
    if (best < 0) return 1;
    const double fmas = static_cast<double>(pixels) * l.C * ((l.K + 15) / 16);  // 16-lane multiply-adds
    const double floor = fmas / (peak_gfma * 1e3);
    total += best;
    total_floor += floor;
    std::printf("| %d -> %d @ %dx%d | %s | %s | %.1f | %.1f | %.0f%% |\n", l.C, l.K, l.H, l.H, l.activation,
                l.residual ? "yes" : "no", best, floor, 100 * floor / best);
  }
  std::printf("| total | | | %.1f | %.1f | %.0f%% |\n", total, total_floor, 100 * total_floor / total);
  return 0;
}
