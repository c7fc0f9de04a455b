// SM90 GEMM configurations for 1x1 convs (fp16, bias + SiLU) timed against each other on the anchor
// layers' shapes: µs per call from CUDA-graph replays of 20 calls (median of 15 replays), and each
// result's relative L2 error against a float32 GEMM. It compiles plugins/kernels/sm90/sm90_gemm.cuh
// into itself, so configurations the library does not ship can be timed beside those it does (add
// a line to kVariants). Build here (several minutes: one CUTLASS kernel each), run on the GPU machine:
//
//   cmake -S plugins -B build -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DEPIFUSE_BENCH=ON
//   cmake --build build --target bench_gemm1x1_variants && build/bench/bench_gemm1x1_variants
//
// `build/bench/bench_gemm1x1_variants VARIANT SHAPE` runs only the variants and shapes whose names contain those
// strings ("" = all); under ncu, `--launch-skip 1 --launch-count 1` then profiles the first timed launch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "sm90_gemm.cuh"

namespace {
using namespace epifuse;
using namespace epifuse::cuda;
using cute::_1;
using cute::_2;
using cute::_64;
using cute::_128;
using cute::_256;
using Silu = sm90::ActivationSet<ActivationKind::kIdentity, ActivationKind::kSilu>;
template <class M, class N>
using Epi = cute::Shape<M, N>;
template <class M, class N, class K>
using Tile = cute::Shape<M, N, K>;

// The library's kernel, then candidates. G<...>: fp16, Identity/SiLU epilogue, no residual (no C).
template <class T, class Cl, class Sched, class E, int kStores = 0, class Scheduler = void>
using G = sm90::GemmConfig<DType::kFloat16, T, Cl, Sched, Scheduler, Silu, E, sm90::NoResidual, kStores>;
using C11 = cute::Shape<_1, _1, _1>;
using C12 = cute::Shape<_1, _2, _1>;
using C21 = cute::Shape<_2, _1, _1>;
using C22 = cute::Shape<_2, _2, _1>;
using Library = sm90::GemmConfig<DType::kFloat16, Tile<_256, _128, _64>, C11, sm90::Cooperative, void, Silu, Epi<_128, _64>>;
using NoC = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_128, _64>>;
using NoCStores3 = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_128, _64>, 3>;
using NoCStores4 = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_128, _64>, 4>;
using NoCStores4Cluster = G<Tile<_256, _128, _64>, C12, sm90::Cooperative, Epi<_128, _64>, 4>;
// Wider epilogue sub-tiles: fewer named-barrier rounds per tile (ncu: r50.s1.1x1up stalls on barriers 3x as often as cuBLAS's kernel).
using NoCEpi128x128St2 = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_128, _128>, 2>;
using NoCEpi128x128St3 = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_128, _128>, 3>;
using NoCEpi256x64St3 = G<Tile<_256, _128, _64>, C11, sm90::Cooperative, Epi<_256, _64>, 3>;
using NoC128x256Stores4 = G<Tile<_128, _256, _64>, C11, sm90::Cooperative, Epi<_128, _64>, 4>;
using NoC128Coop = G<Tile<_128, _128, _64>, C11, sm90::Cooperative, Epi<_128, _64>>;
using NoC128CoopC12 = G<Tile<_128, _128, _64>, C12, sm90::Cooperative, Epi<_128, _64>>;
using NoC128CoopC21 = G<Tile<_128, _128, _64>, C21, sm90::Cooperative, Epi<_128, _64>>;
using NoC128CoopC22 = G<Tile<_128, _128, _64>, C22, sm90::Cooperative, Epi<_128, _64>>;
using NoC128PingpongC12 = G<Tile<_128, _128, _64>, C12, sm90::Pingpong, Epi<_64, _64>>;
using NoC128PingpongC21 = G<Tile<_128, _128, _64>, C21, sm90::Pingpong, Epi<_64, _64>>;
using NoCStores4C21 = G<Tile<_256, _128, _64>, C21, sm90::Cooperative, Epi<_128, _64>, 4>;
using NoC128Pingpong = G<Tile<_128, _128, _64>, C11, sm90::Pingpong, Epi<_64, _64>>;
using NoC128PingpongStores4 = G<Tile<_128, _128, _64>, C11, sm90::Pingpong, Epi<_64, _64>, 4>;
using NoC128StreamK = G<Tile<_128, _128, _64>, C11, sm90::Cooperative, Epi<_128, _64>, 0, cutlass::gemm::StreamKScheduler>;

// Y^T = W X^T (GEMM rows = output channels): tiles of 128 channels x 96..256 pixels, as cuBLAS's nvjet kernels.
template <class T, class Cl, class Sched = sm90::Cooperative>
using Tr = sm90::GemmConfig<DType::kFloat16, T, Cl, Sched, void, Silu, cutlass::epilogue::collective::EpilogueTileAuto,
                            sm90::NoResidual, 0, true>;
using C41 = cute::Shape<cute::_4, _1, _1>;
using _96 = cute::Int<96>;
using _192 = cute::Int<192>;
using _224 = cute::Int<224>;
using T96 = Tr<Tile<_128, _96, _64>, C11>;
using T96C12 = Tr<Tile<_128, _96, _64>, C12>;
using T128 = Tr<Tile<_128, _128, _64>, C11>;
using T192 = Tr<Tile<_128, _192, _64>, C11>;
using T224 = Tr<Tile<_128, _224, _64>, C11>;
using T224C41 = Tr<Tile<_128, _224, _64>, C41>;
using T224C21 = Tr<Tile<_128, _224, _64>, C21>;
using _112 = cute::Int<112>;
using T256x112 = Tr<Tile<_256, _112, _64>, C11>;
using T256x112C21 = Tr<Tile<_256, _112, _64>, C21>;
using T112Pingpong = Tr<Tile<_128, _112, _64>, C11, sm90::Pingpong>;
using T256C21 = Tr<Tile<_128, _256, _64>, C21>;

using Decomposition = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams::DecompositionMode;
// The stream-K scheduler with a fixed decomposition instead of CUTLASS's heuristic.
template <class Cfg, Decomposition kMode, int kSplits>
Status launch_decomposed(const char* name, const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes,
                         cudaStream_t s) {
  auto args = Cfg::arguments(p, t);
  args.scheduler.splits = kSplits;
  args.scheduler.decomposition_mode = kMode;
  return sm90::run_op<typename Cfg::Op>(name, args, ws, ws_bytes, s, [&](auto& op) { return op.run(s); });
}
size_t no_workspace(const ConvProblem&) { return 0; }

struct Variant {
  const char* name;
  size_t (*workspace)(const ConvProblem&);
  Status (*launch)(const char*, const ConvProblem&, const Tensors&, void*, size_t, cudaStream_t);
};
#define VARIANT(NAME, CFG) Variant{NAME, CFG::workspace_size, CFG::launch}
#define DECOMPOSED(NAME, CFG, MODE, SPLITS) Variant{NAME, no_workspace, launch_decomposed<CFG, Decomposition::MODE, SPLITS>}
const Variant kVariants[] = {
    VARIANT("256x128 coop (library)", Library),
    VARIANT("256x128 noC", NoC),
    VARIANT("256x128 noC st3", NoCStores3),
    VARIANT("256x128 noC st4", NoCStores4),
    VARIANT("256x128 noC st4 cl1x2", NoCStores4Cluster),
    VARIANT("256x128 noC epi128x128 st2", NoCEpi128x128St2),
    VARIANT("256x128 noC epi128x128 st3", NoCEpi128x128St3),
    VARIANT("256x128 noC epi256x64 st3", NoCEpi256x64St3),
    VARIANT("128x256 noC st4", NoC128x256Stores4),
    VARIANT("256x128 noC st4 cl2x1", NoCStores4C21),
    VARIANT("128x128 coop noC", NoC128Coop),
    VARIANT("128x128 coop noC cl1x2", NoC128CoopC12),
    VARIANT("128x128 coop noC cl2x1", NoC128CoopC21),
    VARIANT("128x128 coop noC cl2x2", NoC128CoopC22),
    VARIANT("128x128 pp noC cl1x2", NoC128PingpongC12),
    VARIANT("128x128 pp noC cl2x1", NoC128PingpongC21),
    VARIANT("128x128 pp noC", NoC128Pingpong),
    VARIANT("128x128 pp noC st4", NoC128PingpongStores4),
    VARIANT("128x128 sk-heur noC", NoC128StreamK),
    VARIANT("T 128ch x 96px", T96),
    VARIANT("T 128ch x 96px cl1x2", T96C12),
    VARIANT("T 128ch x 128px", T128),
    VARIANT("T 128ch x 192px", T192),
    VARIANT("T 128ch x 224px", T224),
    VARIANT("T 128ch x 224px cl4x1", T224C41),
    VARIANT("T 128ch x 224px cl2x1", T224C21),
    VARIANT("T 256ch x 112px", T256x112),
    VARIANT("T 256ch x 112px cl2x1", T256x112C21),
    VARIANT("T 128ch x 112px pp", T112Pingpong),
    VARIANT("T 128ch x 256px cl2x1", T256C21),
    DECOMPOSED("128x128 streamk noC", NoC128StreamK, StreamK, 1),
};

struct Shape {
  const char* name;
  int M, N, K;  // GEMM view: M = N*H*W pixels, N = output channels, K = input channels
};
const Shape kShapes[] = {
    {"r50.s1.1x1up 32x56x56 64->256", 32 * 56 * 56, 256, 64},
    {"r50.s3.1x1dn 32x14x14 1024->256", 32 * 14 * 14, 256, 1024},
    {"r50.s4.1x1up 32x7x7 512->2048", 32 * 7 * 7, 2048, 512},
    {"r50.s2.1x1up 32x28x28 128->512", 32 * 28 * 28, 512, 128},
    {"y8s.80.1x1 32x80x80 128->128", 32 * 80 * 80, 128, 128},
};

__global__ void reference(int M, int N, int K, const __half* x, const __half* w, const __half* b, float* y) {
  const int64_t total = int64_t(M) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int n = int(i % N);
    const int64_t m = i / N;
    float acc = __half2float(b[n]);
    for (int k = 0; k < K; ++k) acc += __half2float(x[m * K + k]) * __half2float(w[int64_t(n) * K + k]);
    y[i] = acc / (1.f + expf(-acc));
  }
}

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

std::vector<__half> random_half(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<__half> v(n);
  for (auto& e : v) e = __float2half(d(rng));
  return v;
}

// µs per call (bench::graph_us), or NaN when the variant cannot run the problem.
float time_us(const Variant& v, const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes, cudaStream_t s) {
  if (!v.launch(v.name, p, t, ws, ws_bytes, s).ok()) return NAN;
  CHECK(cudaStreamSynchronize(s));
  return bench::graph_us([&](cudaStream_t stream) { (void)v.launch(v.name, p, t, ws, ws_bytes, stream); }, s);
}
}  // namespace

int main(int argc, char** argv) {
  const std::string variant_filter = argc > 1 ? argv[1] : "", shape_filter = argc > 2 ? argv[2] : "";
  auto wanted = [](const char* name, const std::string& filter) { return std::string(name).find(filter) != std::string::npos; };
  std::mt19937 rng(7);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  const size_t ws_bytes = size_t(256) << 20;
  void* ws;
  CHECK(cudaMalloc(&ws, ws_bytes));
  std::printf("| shape | floor µs |");
  for (const auto& v : kVariants)
    if (wanted(v.name, variant_filter)) std::printf(" %s |", v.name);
  std::printf("\n|---|---|");
  for (const auto& v : kVariants)
    if (wanted(v.name, variant_filter)) std::printf("---|");
  std::printf("\n");
  for (const auto& sh : kShapes) {
    if (!wanted(sh.name, shape_filter)) continue;
    ConvProblem p;
    p.N = sh.M, p.H = 1, p.W = 1, p.C = sh.K, p.K = sh.N, p.R = 1, p.S = 1;
    p.dtype = DType::kFloat16;
    p.attr.activation.kind = ActivationKind::kSilu;
    const size_t nx = size_t(sh.M) * sh.K, nw = size_t(sh.N) * sh.K, ny = size_t(sh.M) * sh.N;
    auto hx = random_half(nx, rng, 1.f), hw = random_half(nw, rng, 1.f / std::sqrt(float(sh.K))),
         hb = random_half(sh.N, rng, 0.5f);
    __half *x, *w, *b, *y;
    float* ref;
    CHECK(cudaMalloc(&x, nx * 2));
    CHECK(cudaMalloc(&w, nw * 2));
    CHECK(cudaMalloc(&b, sh.N * 2));
    CHECK(cudaMalloc(&y, ny * 2));
    CHECK(cudaMalloc(&ref, ny * 4));
    CHECK(cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(w, hw.data(), nw * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, hb.data(), sh.N * 2, cudaMemcpyHostToDevice));
    reference<<<1024, 256, 0, s>>>(sh.M, sh.N, sh.K, x, w, b, ref);
    std::vector<float> href(ny);
    CHECK(cudaMemcpyAsync(href.data(), ref, ny * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    const double flops = 2.0 * sh.M * sh.N * sh.K, bytes = 2.0 * (nx + nw + ny + sh.N);
    std::printf("| %s | %.1f |", sh.name, std::max(flops / 790e12, bytes / 4.3e12) * 1e6);
    const Tensors t{x, w, b, nullptr, y};
    std::vector<__half> hy(ny);
    for (const auto& v : kVariants) {
      if (!wanted(v.name, variant_filter)) continue;
      CHECK(cudaMemset(y, 0xff, ny * 2));  // NaN poison
      const Status st = v.launch(v.name, p, t, ws, ws_bytes, s);
      if (!st.ok()) {
        std::printf(" n/a (%s) |", st.message().c_str());
        continue;
      }
      CHECK(cudaMemcpyAsync(hy.data(), y, ny * 2, cudaMemcpyDeviceToHost, s));
      CHECK(cudaStreamSynchronize(s));
      double num = 0, den = 0;
      for (size_t i = 0; i < ny; ++i) {
        const double d = double(__half2float(hy[i])) - href[i];
        num += d * d, den += double(href[i]) * href[i];
      }
      const double rel = std::sqrt(num / den);
      std::printf(" %.1f%s |", time_us(v, p, t, ws, ws_bytes, s), rel < 2e-3 ? "" : " WRONG");
    }
    std::printf("\n");
    CHECK(cudaFree(x));
    CHECK(cudaFree(w));
    CHECK(cudaFree(b));
    CHECK(cudaFree(y));
    CHECK(cudaFree(ref));
  }
  return 0;
}
