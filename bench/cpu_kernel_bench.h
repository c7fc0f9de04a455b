// What bench/cpu_depthwise.cc and bench/cpu_pointwise.cc share: 64-byte aligned buffers of a fixed pattern
// (as ONNX Runtime allocates them; a kernel's speed does not depend on the values), and the best time of a
// call over several rounds.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "status.h"

namespace epifuse_bench {

struct Aligned {
  explicit Aligned(size_t n) : data(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  float* data;
};

// data[i] = (i % period) / period - 0.5
inline void fill_pattern(float* data, size_t n, int period) {
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % period) / static_cast<float>(period) - 0.5f;
}

// The best of `rounds` rounds of `calls` calls of `call` (returning an epifuse::Status), in µs a call; -1
// after printing the message of a call that failed.
template <class Call>
double best_call_us(int rounds, int calls, Call&& call) {
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      const epifuse::Status status = call();
      if (!status.ok()) {
        std::fprintf(stderr, "%s\n", status.message().c_str());
        return -1;
      }
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls * 1e6);
  }
  return best;
}

}  // namespace epifuse_bench
