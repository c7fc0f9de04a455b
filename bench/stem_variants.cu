// The tensor-core stem kernel (plugins/kernels/stem_fused_conv.cu) on the RGB stems of ResNet-50 and
// YOLOv8s (fp16, SiLU): µs per call from CUDA-graph replays of 20 calls (median of 15), and each result's
// relative L2 error against a float64 direct conv. It compiles the kernel's source into itself, so
// variants the library does not use (another kBlockN, ...) can be timed beside the one it does. Build
// here, run on the GPU machine (also under ncu: --kernel-name regex:stem_fused_conv):
//
//   cmake -S plugins -B build -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DEPIFUSE_BENCH=ON
//   cmake --build build --target bench_stem_variants && build/bench/bench_stem_variants
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "stem_fused_conv.cu"
#include "harness.cuh"

namespace epifuse::cuda {
namespace {
__global__ void reference(ConvProblem p, const __half* x, const __half* w, const __half* b, double* y) {
  const int64_t P = (p.H + p.attr.pad_top + p.attr.pad_bottom - p.R) / p.attr.stride_h + 1;
  const int64_t Q = (p.W + p.attr.pad_left + p.attr.pad_right - p.S) / p.attr.stride_w + 1;
  const int64_t total = p.N * P * Q * p.K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i % p.K, pixel = i / p.K;
    const int64_t q = pixel % Q, pp = pixel / Q % P, n = pixel / Q / P;
    double acc = __half2float(b[k]);
    for (int64_t r = 0; r < p.R; ++r)
      for (int64_t s = 0; s < p.S; ++s) {
        const int64_t h = pp * p.attr.stride_h - p.attr.pad_top + r, wi = q * p.attr.stride_w - p.attr.pad_left + s;
        if (h < 0 || h >= p.H || wi < 0 || wi >= p.W) continue;
        for (int64_t c = 0; c < p.C; ++c)
          acc += double(__half2float(x[((n * p.H + h) * p.W + wi) * p.C + c])) *
                 __half2float(w[((k * p.R + r) * p.S + s) * p.C + c]);
      }
    y[i] = acc / (1.0 + exp(-acc));
  }
}
}  // namespace
}  // namespace epifuse::cuda

using namespace epifuse;
using namespace epifuse::cuda;
using Launch = std::function<Status(const ConvProblem&, const Tensors&, cudaStream_t)>;

std::vector<std::pair<const char*, Launch>> variants() {
  return {{"library", [](const ConvProblem& p, const Tensors& t, cudaStream_t s) { return launch(p, t, nullptr, 0, s); }}};
}

int main(int argc, char** argv) {
  const bool once = argc > 1 && std::string(argv[1]) == "--once";  // one launch per variant (for ncu)
  struct Shape {
    const char* name;
    int N, H, W, C, K, R, stride, pad;
  };
  const std::vector<Shape> shapes = {{"r50.stem7x7", 32, 224, 224, 3, 64, 7, 2, 3},
                                     {"y8s.b1.stem", 1, 640, 640, 3, 16, 3, 2, 1},
                                     {"y8s.b32.stem", 32, 640, 640, 3, 32, 3, 2, 1}};
  cudaStream_t st;
  cudaStreamCreate(&st);
  int failures = 0;
  for (const Shape& sh : shapes) {
    ConvProblem p;
    p.dtype = DType::kFloat16;
    p.N = sh.N, p.H = sh.H, p.W = sh.W, p.C = sh.C, p.K = sh.K, p.R = p.S = sh.R;
    p.attr.stride_h = p.attr.stride_w = sh.stride;
    p.attr.pad_top = p.attr.pad_left = p.attr.pad_bottom = p.attr.pad_right = sh.pad;
    p.attr.activation.kind = ActivationKind::kSilu;
    const int64_t P = p.P(), Q = p.Q();
    const size_t nx = size_t(sh.N) * sh.H * sh.W * sh.C, nw = size_t(sh.K) * sh.R * sh.R * sh.C,
                 ny = size_t(sh.N) * P * Q * sh.K;
    std::vector<__half> hx(nx), hw(nw), hb(sh.K);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& v : hx) v = __float2half(normal(rng));
    for (auto& v : hw) v = __float2half(normal(rng) / std::sqrt(float(sh.R * sh.R * sh.C)));
    for (auto& v : hb) v = __float2half(normal(rng));
    __half *x, *w, *b, *y;
    double* ref;
    cudaMalloc(&x, nx * 2);
    cudaMalloc(&w, nw * 2);
    cudaMalloc(&b, sh.K * 2);
    cudaMalloc(&y, ny * 2);
    cudaMalloc(&ref, ny * sizeof(double));
    cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(w, hw.data(), nw * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), sh.K * 2, cudaMemcpyHostToDevice);
    std::vector<double> href;
    if (!once) {
      reference<<<4096, 256>>>(p, x, w, b, ref);
      href.resize(ny);
      cudaMemcpy(href.data(), ref, ny * sizeof(double), cudaMemcpyDeviceToHost);
    }
    const Tensors t{x, w, b, nullptr, y};
    const double floor_us = std::max(2.0 * ny * sh.R * sh.R * sh.C / 790e12, 2.0 * (nx + ny) / 4.3e12) * 1e6;
    printf("%-14s N%d %dx%d %d->%d %dx%d s%d  floor %.1f us\n", sh.name, sh.N, sh.H, sh.W, sh.C, sh.K, sh.R, sh.R,
           sh.stride, floor_us);
    for (const auto& [name, launch] : variants()) {
      const Launch& fn = launch;  // a lambda may capture it (not a structured binding before C++20)
      cudaMemset(y, 0xff, ny * 2);  // NaN: an unwritten output shows as an error
      const Status s = fn(p, t, st);
      cudaError_t err = cudaStreamSynchronize(st);
      if (!s.ok() || err != cudaSuccess) {
        printf("  %-36s failed: %s %s\n", name, s.message().c_str(), cudaGetErrorString(err));
        return 1;
      }
      if (once) continue;
      std::vector<__half> hy(ny);
      cudaMemcpy(hy.data(), y, ny * 2, cudaMemcpyDeviceToHost);
      double num = 0, den = 0;
      for (size_t i = 0; i < ny; ++i) {
        const double d = double(__half2float(hy[i])) - href[i];
        num += d * d;
        den += href[i] * href[i];
      }
      const double rel = std::sqrt(num / den);
      const bool ok = rel < 2e-3;  // fp16 output rounding is ~3e-4
      failures += !ok;
      printf("  %-36s %7.1f us  rel L2 %.1e%s\n", name, bench::graph_us([&](cudaStream_t s) { (void)fn(p, t, s); }, st), rel, ok ? "" : "  FAIL");
    }
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(ref);
  }
  return failures ? 1 : 0;
}
