// The depthwise kernel's tile configurations against its strip kernel, on the depthwise shapes of
// ConvNeXt, EfficientNet and MobileNet (fp16, stride 1, SiLU): µs per call from CUDA-graph replays of
// 20 calls, and each result's error against a float64 direct conv. It compiles
// plugins/kernels/depthwise_fused_conv.cu into itself, so configurations that the library does not
// use can be timed beside those it does (add a TileConfig below). Build here, run on the GPU machine:
//
//   cmake -S plugins -B build -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DEPIFUSE_BENCH=ON
//   cmake --build build --target bench_depthwise_tiles && build/bench/bench_depthwise_tiles
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "depthwise_fused_conv.cu"
#include "harness.cuh"

namespace epifuse::cuda {

namespace {
__global__ void reference(Geometry g, const __half* x, const __half* w, const __half* b, double* y) {
  const int64_t total = int64_t(g.N) * g.P * g.Q * g.K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i % g.K);
    const int64_t pixel = i / g.K;
    const int q = int(pixel % g.Q), p = int(pixel / g.Q % g.P), n = int(pixel / g.Q / g.P);
    double acc = __half2float(b[k]);
    for (int r = 0; r < g.R; ++r)
      for (int s = 0; s < g.S; ++s) {
        const int h = p - g.pad_top + r, wi = q - g.pad_left + s;
        if (h >= 0 && h < g.H && wi >= 0 && wi < g.W)
          acc += double(__half2float(x[((int64_t(n) * g.H + h) * g.W + wi) * g.C + k])) *
                 __half2float(w[(k * g.R + r) * g.S + s]);
      }
    y[i] = acc / (1.0 + exp(-acc));
  }
}
}  // namespace
}  // namespace epifuse::cuda

using namespace epifuse;
using namespace epifuse::cuda;
using Launch = std::function<void(const Geometry&, const Tensors&, const Epilogue&, cudaStream_t)>;
// Configurations timed beside the library's TileWide and TileSmall.
using TileCb32 = TileConfig<7, 2, 8, 32, 4, 3>;
using TileTq4 = TileConfig<4, 2, 8, 16, 8, 4>;

template <int R, class Cfg>
std::pair<const char*, Launch> config(const char* name) {
  return {name, [](const Geometry& g, const Tensors& t, const Epilogue& e, cudaStream_t s) {
            launch_tile_config<__half, R, Cfg>(g, t, e, s,
                                               int64_t(g.N) * ((g.P + Cfg::TP - 1) / Cfg::TP) * ((g.Q + Cfg::QT - 1) / Cfg::QT));
          }};
}

template <int R>
std::vector<std::pair<const char*, Launch>> variants() {
  return {{"cuda_depthwise_tile", [](const Geometry& g, const Tensors& t, const Epilogue& e,
                                     cudaStream_t s) { (void)launch_tile<__half, R>(g, t, e, s); }},
          {"cuda_depthwise_strip", [](const Geometry& g, const Tensors& t, const Epilogue& e,
                                      cudaStream_t s) { (void)launch_strip<__half, R, R, 1>(g, t, e, s); }},
          config<R, TileWide>("TileWide 8x28, 2 rows/thread"), config<R, TileSmall>("TileSmall 4x28, 1 row/thread"),
          config<R, TileCb32>("8x28, 32 channels"), config<R, TileTq4>("8x32, 4 columns/thread")};
}

int main() {
  struct Shape { const char* name; int N, H, W, C, R; };
  const std::vector<Shape> shapes = {
      {"cnx.dw7x7 (anchor)", 32, 56, 56, 96, 7}, {"cnx.dw7x7 b1", 1, 56, 56, 96, 7},
      {"cnx.s3.dw7x7", 32, 14, 14, 384, 7},      {"effb0.dw5x5", 32, 28, 28, 240, 5},
      {"mbv2.dw3x3 s1", 32, 112, 112, 32, 3},    {"effb0.dw3x3", 32, 56, 56, 144, 3},
      {"odd dw7x7", 3, 17, 23, 40, 7},           {"effb0.s5 14x14 5x5", 32, 14, 14, 672, 5},
      {"effb0.s6 7x7 5x5", 32, 7, 7, 1152, 5},   {"effb0.s4 14x14 3x3", 32, 14, 14, 480, 3},
      {"mbv3 14x14 3x3", 32, 14, 14, 184, 3},    {"mbv3 7x7 5x5", 32, 7, 7, 960, 5},
      {"effb0.s6 7x7 5x5 b1", 1, 7, 7, 1152, 5}, {"mbv3 28x28 5x5", 32, 28, 28, 120, 5}};
  Epilogue e{};
  e.activation.kind = ActivationKind::kSilu;
  e.residual = Residual::kNone;
  cudaStream_t st;
  cudaStreamCreate(&st);
  int failures = 0;
  for (const Shape& sh : shapes) {
    const int pad = sh.R / 2;
    const Geometry g{sh.N, sh.H, sh.W, sh.C, sh.C, sh.R, sh.R, sh.H, sh.W, 1, 1, 1, 1, 1, pad, pad};
    const size_t nx = size_t(sh.N) * sh.H * sh.W * sh.C, nw = size_t(sh.C) * sh.R * sh.R;
    std::vector<__half> hx(nx), hw(nw), hb(sh.C);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& v : hx) v = __float2half(normal(rng));
    for (auto& v : hw) v = __float2half(normal(rng) / sh.R);
    for (auto& v : hb) v = __float2half(normal(rng));
    __half *x, *w, *b, *y;
    double* ref;
    cudaMalloc(&x, nx * 2);
    cudaMalloc(&w, nw * 2);
    cudaMalloc(&b, sh.C * 2);
    cudaMalloc(&y, nx * 2);
    cudaMalloc(&ref, nx * sizeof(double));
    cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(w, hw.data(), nw * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), sh.C * 2, cudaMemcpyHostToDevice);
    reference<<<4096, 256>>>(g, x, w, b, ref);
    std::vector<double> href(nx);
    cudaMemcpy(href.data(), ref, nx * sizeof(double), cudaMemcpyDeviceToHost);
    const Tensors t{x, w, b, nullptr, y};
    printf("%-20s N%d %dx%d C%d %dx%d  floor %.1f us\n", sh.name, sh.N, sh.H, sh.W, sh.C, sh.R, sh.R,
           2.0 * nx * 2 / 4.3e12 * 1e6);
    const auto list = sh.R == 7 ? variants<7>() : sh.R == 5 ? variants<5>() : variants<3>();
    for (const auto& [name, launch] : list) {
      const Launch& fn = launch;  // a lambda may capture it (not a structured binding before C++20)
      cudaMemset(y, 0xff, nx * 2);  // NaN: an unwritten output shows as an error
      fn(g, t, e, st);
      if (cudaError_t err = cudaStreamSynchronize(st); err != cudaSuccess) {
        printf("  %-32s CUDA error %s\n", name, cudaGetErrorString(err));
        return 1;
      }
      std::vector<__half> hy(nx);
      cudaMemcpy(hy.data(), y, nx * 2, cudaMemcpyDeviceToHost);
      double num = 0, den = 0;
      for (size_t i = 0; i < nx; ++i) {
        const double d = double(__half2float(hy[i])) - href[i];
        num += d * d;
        den += href[i] * href[i];
      }
      const double rel = std::sqrt(num / den);
      const bool ok = rel < 2e-3;  // fp16 output rounding is ~3e-4
      failures += !ok;
      printf("  %-32s %7.1f us  rel L2 %.1e%s\n", name, bench::graph_us([&](cudaStream_t s) { fn(g, t, e, s); }, st), rel, ok ? "" : "  FAIL");
    }
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(ref);
  }
  return failures ? 1 : 0;
}
