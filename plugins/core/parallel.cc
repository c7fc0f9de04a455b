#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace epifuse {

int64_t hardware_threads() {
  static const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  return threads;
}

void parallel_for_threads(int64_t n, const std::function<void(int64_t)>& body) {
  const int64_t threads = std::min(n, hardware_threads());
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads is slower, not wrong
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
}

void parallel_for_serial(int64_t n, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace epifuse
