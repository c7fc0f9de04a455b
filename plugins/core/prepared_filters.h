// What the CPU kernels of their own (Winograd, depthwise) share: 64-byte aligned float buffers, and
// their filters prepared once (transformed, rearranged) and kept while the same constant filters come back.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace epifuse {

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// A 64-byte-aligned view of `n` floats into `storage` (grown as needed), so that every row of a whole
// number of vectors starts a cache line (AVX-512) or half of one (AVX2).
inline float* aligned(std::vector<float>& storage, int64_t n) {
  if (storage.size() < static_cast<size_t>(n + 16)) storage.resize(static_cast<size_t>(n + 16));
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  return reinterpret_cast<float*>(round_up(static_cast<int64_t>(address), 64));
}

// 1x1 filters, KRSC [K][C], as panels of `panel_width` output channels, each [C][its channels] (the last
// narrower, Kp - its first; the lanes past K left as they are, zeros in a fresh copy): a panel's filters
// are one stream of memory, a register tile's rows of filter vectors one after another.
template <class T>
void arrange_panels(const T* w, int64_t C, int64_t K, int64_t Kp, int64_t panel_width, T* f) {
  for (int64_t k = 0; k < K; ++k) {
    const int64_t k0 = k / panel_width * panel_width, width = std::min(panel_width, Kp - k0);
    for (int64_t c = 0; c < C; ++c) f[C * k0 + c * width + (k - k0)] = w[k * C + c];
  }
}

// One node's prepared filters, safe to use from several threads at once.
class PreparedFilters {
 public:
  struct Copy {
    std::vector<float> storage;
    const float* data = nullptr;  // aligned inside storage
  };

  // The prepared copy of `w`: the one kept, where `w_constant` and it was made from `w`; else
  // `prepare(aligned(storage, floats))` fills a new one (zeros where it writes nothing), kept where
  // `w_constant` (an initializer: the same data on every call).
  template <class Prepare>
  std::shared_ptr<const Copy> get(const void* w, bool w_constant, int64_t floats, Prepare&& prepare) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (w_constant && source_ == w && kept_) return kept_;
    }
    auto made = std::make_shared<Copy>();
    made->storage.assign(static_cast<size_t>(floats + 16), 0.f);
    float* data = aligned(made->storage, floats);
    prepare(data);
    made->data = data;
    if (w_constant) {
      std::lock_guard<std::mutex> lock(mutex_);
      kept_ = made;
      source_ = w;
    }
    return made;
  }

  // Drops the kept copy (a later call prepares it again).
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.reset();
    source_ = nullptr;
  }

 private:
  std::mutex mutex_;
  std::shared_ptr<const Copy> kept_;
  const void* source_ = nullptr;
};

}  // namespace epifuse
