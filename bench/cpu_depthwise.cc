// The CPU depthwise kernel alone on MobileNetV3-Large's depthwise layers (and any others given), fp32,
// batch 1, inputs hot in cache, 64-byte aligned as ONNX Runtime allocates them: a markdown table of the
// best time per call against the FMA-bound floor. Built from the library's sources, no ONNX Runtime:
//
//   g++ -std=c++17 -O3 -DNDEBUG -Iplugins/core bench/cpu_depthwise.cc
//       plugins/core/{depthwise_fused_conv,conv_problem,parallel,cpu_epilogue}.cc -o /tmp/cpu_depthwise -lpthread
//   (one command line, from the repository root)
//   /tmp/cpu_depthwise [--threads 1|2] [--peak-gfma 8.1] [--activation NAME] [--shape H,C,R,stride,pooled ...]
//
// --activation: every layer's (contract names; clip as ReLU6, leaky_relu with slope 0.1).
// --threads 2: a second thread spinning for pieces, as ONNX Runtime's default pool does. --peak-gfma: one
// core's 16-lane multiply-adds a second (8.1 G on the Zen 5 of docs/bench-cpu.md). Two builds compare by
// running their binaries alternately, several times, and taking each layer's best.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cpu_kernel_bench.h"
#include "depthwise_fused_conv.h"

using namespace epifuse;
using namespace epifuse_bench;

namespace {

struct Layer {
  int H, C, R, stride;
  std::string activation;
  bool pooled;  // a squeeze-excite pool summed by the kernel (FusedConvMean)
};

// MobileNetV3-Large's depthwise layers at 224x224
const Layer kLayers[] = {
    {112, 16, 3, 1, "relu", false},      {112, 64, 3, 2, "relu", false},       {56, 72, 3, 1, "relu", false},
    {56, 72, 5, 2, "relu", true},        {28, 120, 5, 1, "relu", true},        {28, 240, 3, 2, "hardswish", false},
    {14, 200, 3, 1, "hardswish", false}, {14, 480, 3, 1, "hardswish", true},   {14, 672, 3, 1, "hardswish", true},
    {14, 672, 5, 2, "hardswish", true},  {7, 960, 5, 1, "hardswish", true}};

// A pool of one spinning helper: the caller and the helper pull piece indices from one counter.
class SpinPool {
 public:
  SpinPool() : helper_([this] { serve(); }) {}
  ~SpinPool() {
    quit_ = true;
    helper_.join();
  }
  void run(int64_t n, const std::function<void(int64_t)>& body) {
    n_ = n;
    body_ = &body;
    done_ = 0;
    next_ = 0;
    generation_.fetch_add(1);
    work();
    while (done_.load() < n) {
    }
  }

 private:
  void work() {
    for (int64_t i; (i = next_.fetch_add(1)) < n_; done_.fetch_add(1)) (*body_)(i);
  }
  void serve() {
    for (int seen = 0; !quit_;)
      if (generation_.load() != seen) {
        seen = generation_.load();
        work();
      }
  }
  std::atomic<int64_t> next_{0}, done_{0};
  std::atomic<int> generation_{0};
  std::atomic<bool> quit_{false};
  int64_t n_ = 0;
  const std::function<void(int64_t)>* body_ = nullptr;
  std::thread helper_;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double peak_gfma = 8.1;
  std::string activation;
  std::vector<Layer> layers;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--peak-gfma") && i + 1 < argc) {
      peak_gfma = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--activation") && i + 1 < argc) {
      activation = argv[++i];
    } else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      Layer l{0, 0, 0, 0, "relu", false};
      int pooled = 0;
      if (std::sscanf(argv[++i], "%d,%d,%d,%d,%d", &l.H, &l.C, &l.R, &l.stride, &pooled) < 4) {
        std::fprintf(stderr, "--shape H,C,R,stride[,pooled]\n");
        return 2;
      }
      l.pooled = pooled != 0;
      layers.push_back(l);
    } else {
      std::fprintf(stderr, "usage: %s [--threads 1|2] [--peak-gfma G] [--activation NAME] [--shape H,C,R,stride,pooled ...]\n", argv[0]);
      return 2;
    }
  }
  if (layers.empty()) layers.assign(std::begin(kLayers), std::end(kLayers));
  if (threads != 1 && threads != 2) {
    std::fprintf(stderr, "--threads: 1 or 2\n");
    return 2;
  }
  SpinPool* pool = threads == 2 ? new SpinPool : nullptr;
  const ParallelFor parallel_for = [pool](int64_t n, const std::function<void(int64_t)>& body) {
    if (pool) {
      pool->run(n, body);
    } else {
      parallel_for_serial(n, body);
    }
  };
  std::printf("| depthwise layer | activation | pool | µs | FMA floor µs | of peak |\n|---|---|---|---:|---:|---:|\n");
  double total = 0, total_floor = 0;
  for (Layer l : layers) {
    if (!activation.empty()) l.activation = activation;
    const float relu6[2] = {0.f, 6.f}, slope[1] = {0.1f};
    const float* params = l.activation == "clip" ? relu6 : l.activation == "leaky_relu" ? slope : nullptr;
    const int64_t n_params = l.activation == "clip" ? 2 : l.activation == "leaky_relu" ? 1 : 0;
    ConvProblem p;
    p.N = 1;
    p.H = p.W = l.H;
    p.C = p.K = l.C;
    p.R = p.S = l.R;
    p.attr.group = l.C;
    p.attr.stride_h = p.attr.stride_w = l.stride;
    p.attr.pad_top = p.attr.pad_left = p.attr.pad_bottom = p.attr.pad_right = l.R / 2;
    Status status = parse_activation(l.activation, params, n_params, &p.attr.activation);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.message().c_str());
      return 1;
    }
    const size_t in = static_cast<size_t>(l.H) * l.H * l.C, out = static_cast<size_t>(p.P() * p.Q() * l.C);
    Aligned x(in), w(static_cast<size_t>(l.C * l.R * l.R)), b(l.C), y(out), mean(l.C);
    fill_pattern(x.data, in, 97);
    fill_pattern(w.data, static_cast<size_t>(l.C * l.R * l.R), 13);
    std::fill(b.data, b.data + l.C, 0.1f);
    DepthwiseConv conv;
    const double best = best_call_us(7, 50, [&] {
      return conv.run_with_mean(p, x.data, w.data, true, b.data, nullptr, y.data, l.pooled ? mean.data : nullptr,
                                parallel_for);
    });
    if (best < 0) return 1;
    const double fmas = static_cast<double>(out) * l.R * l.R / 16;  // 16-lane multiply-adds
    const double floor = fmas / (peak_gfma * 1e3 * threads);
    total += best;
    total_floor += floor;
    std::printf("| %dx%d s%d, %d ch @ %dx%d | %s | %s | %.2f | %.2f | %.0f%% |\n", l.R, l.R, l.stride, l.C, l.H, l.H,
                l.activation.c_str(), l.pooled ? "yes" : "no", best, floor, 100 * floor / best);
  }
  std::printf("| total | | | %.1f | %.1f | %.0f%% |\n", total, total_floor, 100 * total_floor / total);
  delete pool;
  return 0;
}
