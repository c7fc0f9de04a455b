#include "cpu_fused_conv.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "channel_mean.h"
#include "cpu_isa.h"
#include "prepared_filters.h"
#include "tuning_cache.h"

namespace epifuse {
namespace {

constexpr const char* kOnednnChoice = "onednn";

// Everything the kernels' speeds depend on.
std::vector<int64_t> shape_key(const ConvProblem& p) {
  const ConvAttributes& a = p.attr;
  std::vector<int64_t> key = {p.N, p.H, p.W, p.C, p.K, p.R, p.S, a.stride_h, a.stride_w, a.group, a.pad_top,
                              a.pad_left, a.pad_bottom, a.pad_right, static_cast<int64_t>(a.activation.kind),
                              static_cast<int64_t>(a.residual)};
  if (p.dtype != DType::kFloat) key.push_back(100 + static_cast<int64_t>(p.dtype));  // fp32 keys as they were
  return key;
}

// This machine and build in the tuning cache: the CPU's model name, the thread count, the kernels' build.
const std::string& cpu_device() {
  static const std::string device = [] {
    std::string name = "unknown CPU", line;
    std::ifstream in("/proc/cpuinfo");
    while (std::getline(in, line)) {
      const size_t colon = line.find(':');
      if (line.rfind("model name", 0) == 0 && colon != std::string::npos && colon + 2 <= line.size()) {
        name = line.substr(colon + 2);
        break;
      }
    }
    return "cpu " + name + ", " + std::to_string(hardware_threads()) + " threads, " + kernels_build();
  }();
  return device;
}

// The tuning cache's key of the choice between `direct` and oneDNN for `p`; its value names the winner.
std::string tuning_key(const ConvProblem& p, const DirectConv& direct) {
  std::string key = cpu_device() + '\t' + direct.name() + " or " + kOnednnChoice + ":";
  for (int64_t v : shape_key(p)) key += ' ' + std::to_string(v);
  return key;
}

// The best of `runs` timed calls, after one untimed (primitive creation, filter transform).
template <class Run>
Status best_seconds(Run&& run, int runs, double* best) {
  *best = 1e30;
  for (int i = 0; i <= runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    EPIFUSE_RETURN_IF_ERROR(run());
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) *best = std::min(*best, took);
  }
  return Status::Ok();
}

}  // namespace

CpuKernel cpu_kernel_from_environment() {
  const char* choice = std::getenv("EPIFUSE_CPU_KERNEL");
  if (choice == nullptr) return CpuKernel::kAuto;
  if (std::strcmp(choice, "reference") == 0) return CpuKernel::kReference;
  if (std::strcmp(choice, "onednn") == 0) return CpuKernel::kOnednn;
  if (std::strcmp(choice, "winograd") == 0) return CpuKernel::kWinograd;
  if (std::strcmp(choice, "depthwise") == 0) return CpuKernel::kDepthwise;
  if (std::strcmp(choice, "gemv") == 0) return CpuKernel::kGemv;
  return CpuKernel::kAuto;
}

DirectConv* CpuFusedConv::direct_for(const ConvProblem& p) {
  for (DirectConv* d : {static_cast<DirectConv*>(&winograd_), static_cast<DirectConv*>(&depthwise_),
                        static_cast<DirectConv*>(&gemv_)})
    if (d->supports(p)) return d;
  return nullptr;
}

Status CpuFusedConv::choose(const ConvProblem& p, const ParallelFor& parallel_for, bool pooled,
                            DirectConv** chosen) {
  DirectConv* const d = direct_for(p);
  *chosen = nullptr;
  if (d == nullptr || kernel_ == CpuKernel::kOnednn) return Status::Ok();
  if (kernel_ == CpuKernel::kWinograd || kernel_ == CpuKernel::kDepthwise || kernel_ == CpuKernel::kGemv) {
    // forced: that one, else oneDNN
    const DirectConv* forced = kernel_ == CpuKernel::kWinograd    ? static_cast<DirectConv*>(&winograd_)
                               : kernel_ == CpuKernel::kDepthwise ? static_cast<DirectConv*>(&depthwise_)
                                                                  : &gemv_;
    if (d == forced) *chosen = d;
    return Status::Ok();
  }
  // Depthwise layers with AVX-512 and a filter width the direct kernel unrolls: chosen by rule, untimed,
  // since a first-run timing, warm and in a loop, picked oneDNN for about half of the layers the direct
  // kernel ran faster in whole models. On the Xeon it did on every depthwise layer of MobileNetV3-Large,
  // EfficientNet-B0 and ConvNeXt-T (49 layers; their sums 0.57-0.72x oneDNN's). On Zen 5 oneDNN's ran
  // chains of MobileNetV3's 3x3 layers 1.18-1.25x faster and MobileNetV2 fused throughout 1.14-1.15x
  // (1.06x against the direct kernel's faster version, with ReLU6 in registers), while a layer that sums
  // a squeeze-excite pool keeps the direct kernel, which sums it in registers (on oneDNN, its pieces
  // summing their output: MobileNetV3-Large 0.96x, EfficientNet-B0 0.98x). Other
  // widths (MixNet's merged 9x9 groups), which the direct kernel runs a column at a time, are timed.
  if (d == &depthwise_ && d->isa() == VectorIsa::kAvx512 && DepthwiseConv::unrolled(p)) {
    const bool onednn = cpu_is_amd_zen5() && p.dtype == DType::kFloat && !pooled;
    return *chosen = onednn ? nullptr : d, Status::Ok();
  }
  const std::vector<int64_t> key = shape_key(p);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = direct_chosen_.find(key);
    if (it != direct_chosen_.end()) return *chosen = it->second ? d : nullptr, Status::Ok();
  }
  // A choice made before, by this process or one that tuned on this machine: the model runs the
  // kernels it was measured with when `epifuse optimize` or `epifuse tune` kept them.
  const std::string tuning = tuning_key(p, *d);
  const std::string kept = TuningCache::instance().find(tuning);
  if (kept == d->name() || kept == kOnednnChoice) {
    std::lock_guard<std::mutex> lock(mutex_);
    direct_chosen_[key] = kept == d->name();
    *chosen = kept == d->name() ? d : nullptr;
    return Status::Ok();
  }
  // Zeros: neither kernel's speed depends on the values. The filters count as constant, so the
  // transform or reorder of these scratch ones stays out of the timing (a real call, with other
  // filters, makes its own).
  const int64_t out = p.N * p.P() * p.Q() * p.K;
  std::vector<float> x, w, b, z, y;
  try {
    x.resize(static_cast<size_t>(p.N * p.H * p.W * p.C));
    w.resize(static_cast<size_t>(p.K * p.R * p.S * (p.C / p.attr.group)));
    b.resize(static_cast<size_t>(p.K));
    z.resize(p.attr.residual == Residual::kNone ? 0 : static_cast<size_t>(out));
    y.resize(static_cast<size_t>(out));
  } catch (const std::bad_alloc&) {
    return Status::Ok();  // no room for a second copy of the tensors: oneDNN, untimed, this once
  }
  const float* zp = z.empty() ? nullptr : z.data();
  bool refused = false;
  // A choice kept for later processes (EPIFUSE_TUNE=1) takes the best reading of three alternating
  // rounds, so that one slow spell on a busy machine does not decide it for good.
  const int rounds = tuning_enabled() ? 3 : 1;
  double onednn_s = 1e30, direct_s = 1e30;
  for (int round = 0; round < rounds; ++round) {
    double seconds = 0;
    EPIFUSE_RETURN_IF_ERROR(best_seconds(
        [&] { return onednn_.run(p, x.data(), w.data(), true, b.data(), zp, y.data(), parallel_for, &refused); },
        3, &seconds));
    onednn_s = std::min(onednn_s, seconds);
    EPIFUSE_RETURN_IF_ERROR(best_seconds(
        [&] { return d->run(p, x.data(), w.data(), true, b.data(), zp, y.data(), parallel_for); }, 3, &seconds));
    direct_s = std::min(direct_s, seconds);
  }
  const bool direct = refused || direct_s < onednn_s;
  // Both kept their copy of the scratch filters: the loser never runs this shape, so its copy (up to
  // 16/9 of the filters' size) would only take memory; the winner's is replaced at the first real run.
  if (direct) {
    onednn_.release_filters();
  } else {
    d->release_filters();
  }
  TuningCache::instance().store(tuning, direct ? d->name() : kOnednnChoice);
  std::lock_guard<std::mutex> lock(mutex_);
  direct_chosen_[key] = direct;
  *chosen = direct ? d : nullptr;
  return Status::Ok();
}

namespace {

// The mean of y over its rows and columns into `mean`: the pass of a kernel that does not sum its output.
Status channel_mean_of(const ConvProblem& p, const void* y, void* mean, const ParallelFor& parallel_for) {
  const int64_t pixels = p.P() * p.Q();
  if (p.dtype == DType::kFloat)
    return channel_mean_cpu(static_cast<const float*>(y), static_cast<float*>(mean), p.N, pixels, p.K, parallel_for);
  return channel_mean_cpu(static_cast<const bfloat16_t*>(y), static_cast<bfloat16_t*>(mean), p.N, pixels, p.K,
                          parallel_for);
}

}  // namespace

Status CpuFusedConv::run(const ConvProblem& p, const void* x, const void* w, bool w_constant, const void* b,
                         const void* z, void* y, const ParallelFor& parallel_for, void* mean) {
  if (mean != nullptr && p.dtype != DType::kFloat && p.dtype != DType::kBFloat16)
    return Status::Error(std::string("the channel mean has no ") + dtype_name(p.dtype) + " kernel");
  const auto with_mean = [&](Status conv) {
    return conv.ok() && mean != nullptr ? channel_mean_of(p, y, mean, parallel_for) : conv;
  };
  if (kernel_ != CpuKernel::kReference) {
    bool empty = false;
    EPIFUSE_RETURN_IF_ERROR(check_cpu_problem(p, x, w, b, z, y, &empty));
    if (empty) return with_mean(Status::Ok());
    DirectConv* direct = nullptr;
    EPIFUSE_RETURN_IF_ERROR(choose(p, parallel_for, mean != nullptr, &direct));
    if (direct == &depthwise_)  // sums its output in registers where `mean` asks
      return depthwise_.run_with_mean(p, x, w, w_constant, b, z, y, mean, parallel_for);
    if (direct != nullptr) return with_mean(direct->run(p, x, w, w_constant, b, z, y, parallel_for));
    bool refused = true, mean_done = false;
    EPIFUSE_RETURN_IF_ERROR(onednn_.run(p, x, w, w_constant, b, z, y, parallel_for, &refused, nullptr,
                                        static_cast<float*>(mean), &mean_done));
    if (!refused) return mean_done ? Status::Ok() : with_mean(Status::Ok());
  }
  return with_mean(reference_fused_conv(p, x, w, b, z, y, parallel_for));
}

namespace {

// A 64-byte aligned buffer of at least `bytes` for one call on the calling thread, kept for its next call: a
// fresh block of hundreds of KB on every call is an mmap whose pages fault in again each time. `slot`: 0 or 1.
void* call_buffer(int slot, size_t bytes) {
  thread_local std::vector<float> buffers[2];
  return aligned(buffers[slot], static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)));
}

template <class T>
Status scale_rows(const void* x, const void* s, void* y, int64_t N, int64_t pixels, int64_t C, bool per_image,
                  const ParallelFor& parallel_for) {
  return channel_scale_cpu(static_cast<const T*>(x), static_cast<const T*>(s), static_cast<T*>(y), N, pixels, C,
                           per_image, parallel_for);
}

// KRSC filters w ([K][R][S][C / group]) with each tap's input channel times s ([C]) into `scaled`.
template <class T>
Status scale_filters(const ConvProblem& p, const void* w, const void* s, void* scaled,
                     const ParallelFor& parallel_for) {
  const int64_t group = p.attr.group, cg = p.C / group, rows = p.K / group * p.R * p.S;
  for (int64_t g = 0; g < group; ++g)  // a group's filters: rows of cg channels, each times the group's scales
    EPIFUSE_RETURN_IF_ERROR(scale_rows<T>(static_cast<const T*>(w) + g * rows * cg, static_cast<const T*>(s) + g * cg,
                                          static_cast<T*>(scaled) + g * rows * cg, 1, rows, cg, false, parallel_for));
  return Status::Ok();
}

}  // namespace

Status CpuFusedConv::run_scaled(const ConvProblem& p, const void* x, const void* x_scale, bool scales_per_image,
                                const void* w, bool w_constant, const void* b, const void* z, void* y,
                                const ParallelFor& parallel_for) {
  if (p.dtype != DType::kFloat && p.dtype != DType::kBFloat16)
    return Status::Error(std::string("the scaled conv has no ") + dtype_name(p.dtype) + " kernel");
  bool empty = false;
  EPIFUSE_RETURN_IF_ERROR(check_cpu_problem(p, x, w, b, z, y, &empty));
  if (empty) return Status::Ok();
  if (x_scale == nullptr) return Status::Error("the input scale is missing");
  const bool bf16 = p.dtype == DType::kBFloat16;
  const size_t element = bf16 ? 2 : 4;
  const int64_t filters = p.K * p.R * p.S * (p.C / p.attr.group), image = p.H * p.W * p.C;
  const bool each_image = scales_per_image && p.N > 1;
  ConvProblem one = p;
  if (each_image) one.N = 1;
  DirectConv* direct = nullptr;
  if (kernel_ != CpuKernel::kReference) EPIFUSE_RETURN_IF_ERROR(choose(one, parallel_for, false, &direct));
  // Where the filters are the smaller tensor: oneDNN with constant filters has each thread scale the filters
  // of its piece in the layout they were reordered into once, just before its conv reads them; another
  // kernel takes scaled plain filters. (Larger filters scaled cost more than the map's pass on one thread:
  // 7x7x1152 -> 192 0.87x the two nodes, though 1.11x on two.) Elsewhere, and where oneDNN refuses (filters
  // in runs of a channel or a pair shorter than a vector), x is scaled.
  const int64_t y_image = p.P() * p.Q() * p.K;
  const auto image_n = [&](int64_t n, const void* t, int64_t elements) {  // image n of t, null for null
    return t ? static_cast<const char*>(t) + n * elements * static_cast<int64_t>(element) : nullptr;
  };
  const auto y_n = [&](int64_t n) { return static_cast<char*>(y) + n * y_image * static_cast<int64_t>(element); };
  if (filters <= image && kernel_ != CpuKernel::kReference && direct == nullptr && w_constant) {
    bool refused = false;
    for (int64_t n = 0; n < (each_image ? p.N : 1) && !refused; ++n)  // refused, then at the first image
      EPIFUSE_RETURN_IF_ERROR(onednn_.run(one, image_n(n, x, image), w, true, b, image_n(n, z, y_image), y_n(n),
                                          parallel_for, &refused, image_n(n, x_scale, p.C)));
    if (!refused) return Status::Ok();
  } else if (filters <= image) {
    void* scaled = call_buffer(0, static_cast<size_t>(filters) * element);
    for (int64_t n = 0; n < (each_image ? p.N : 1); ++n) {
      const void* s = image_n(n, x_scale, p.C);
      EPIFUSE_RETURN_IF_ERROR(bf16 ? scale_filters<bfloat16_t>(p, w, s, scaled, parallel_for)
                                   : scale_filters<float>(p, w, s, scaled, parallel_for));
      EPIFUSE_RETURN_IF_ERROR(run(one, image_n(n, x, image), scaled, false, b, image_n(n, z, y_image), y_n(n),
                                  parallel_for));
    }
    return Status::Ok();
  }
  void* gated = call_buffer(1, static_cast<size_t>(p.N * image) * element);
  const int64_t pixels = p.H * p.W;
  const auto scale_x = bf16 ? scale_rows<bfloat16_t> : scale_rows<float>;
  EPIFUSE_RETURN_IF_ERROR(scale_x(x, x_scale, gated, p.N, pixels, p.C, scales_per_image, parallel_for));
  return run(p, gated, w, w_constant, b, z, y, parallel_for);
}

Status CpuFusedConv::kernel_name(const ConvProblem& p, std::string* name) {
  *name = "reference";
  if (kernel_ == CpuKernel::kReference || p.N <= 0) return Status::Ok();
  DirectConv* direct = nullptr;
  EPIFUSE_RETURN_IF_ERROR(choose(p, parallel_for_threads, false, &direct));
  const std::string impl = onednn_.implementation(p);
  if (direct != nullptr) {
    *name = direct->name();
  } else if (!impl.empty()) {
    *name = "onednn " + impl;
  }
  return Status::Ok();
}

}  // namespace epifuse
