#include "select.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <vector>

#include "registry.h"
#include "tuning_cache.h"

namespace epifuse::cuda {
namespace {

struct Device {
  int sm = 0;
  int sm_count = 0;
  std::string name;
};

Status current_device(Device* d) {
  int id = 0;
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDevice(&id);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, id);
  if (e != cudaSuccess) return Status::Error(std::string("no CUDA device: ") + cudaGetErrorString(e));
  d->sm = prop.major * 10 + prop.minor;
  d->sm_count = prop.multiProcessorCount;
  d->name = prop.name;
  return Status::Ok();
}

Status candidates(const char* target, const ConvProblem& p, const Device& d, std::vector<const KernelImpl*>* out) {
  std::string why;
  for (const auto* k : find_kernels(target, p, &why, DeviceInfo{d.sm, d.sm_count}))
    if (const KernelImpl* impl = find_impl(k->name)) out->push_back(impl);
  if (out->empty()) return Status::Error(why.empty() ? "no kernel in this build runs the problem" : why);
  return Status::Ok();
}

// A pair of CUDA events, destroyed on every return path. Any CUDA error makes a reading +inf (a
// candidate that cannot be timed cannot win), with the error cleared: it is not the caller's.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = false;
  EventPair() { ok = cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess; }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaGetLastError();
  }
  bool record(cudaEvent_t e, cudaStream_t stream) { return ok && cudaEventRecord(e, stream) == cudaSuccess; }
  float elapsed_ms() {
    float ms = 0;
    if (!ok || cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      cudaGetLastError();
      return 1e30f;
    }
    return ms;
  }
};

// `per_sample` back-to-back launches of `k`, captured into a CUDA graph (nullptr when the launches cannot
// be captured). Replaying it times the kernels without the host work between launches, as a model's
// CUDA graph runs them: an SM90 kernel's host setup (TMA descriptors, CUTLASS argument checks) takes
// about as long as a batch-1 launch runs, so timing direct launches measured the host at batch 1.
struct CapturedLaunches {
  cudaGraphExec_t exec = nullptr;
  CapturedLaunches(const KernelImpl& k, const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes,
                   cudaStream_t stream, int per_sample) {
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    bool launched = true;
    for (int j = 0; j < per_sample && launched; ++j) launched = k.launch(p, t, ws, ws_bytes, stream).ok();
    cudaGraph_t graph = nullptr;
    const bool captured = cudaStreamEndCapture(stream, &graph) == cudaSuccess && launched;
    if (!captured || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture falls back to direct launches; its error is not the caller's
  }
  ~CapturedLaunches() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// ms per launch: the median of kSamples samples, each a run of back-to-back launches between two
// events, replayed from a CUDA graph (direct launches where capture fails). Timing single launches with
// a sync between (the first way) left batch-1 kernels of 5-15 µs within launch and event noise of each
// other: the picks for 14 of YOLOv8s's batch-1 problems changed from one tuning run to the next, and
// the model's time by ±10%. A sample lasts ~kSampleMs (at most kMaxPerSample launches); a kernel
// whose warm launch takes longer than `give_up_ms` cannot win and is not timed further. Failing to
// launch gets +inf.
float time_kernel(const KernelImpl& k, const ConvProblem& p, const Tensors& t, void* ws, size_t ws_bytes,
                  cudaStream_t stream, float give_up_ms) {
  constexpr int kWarmup = 2, kSamples = 7, kMaxPerSample = 16;
  constexpr float kSampleMs = 0.2f;
  EventPair events;
  float single = 1e30f;
  for (int i = 0; i < kWarmup; ++i) {
    if (!events.record(events.start, stream) || !k.launch(p, t, ws, ws_bytes, stream).ok() ||
        !events.record(events.stop, stream))
      return 1e30f;
    single = events.elapsed_ms();
  }
  if (single > give_up_ms) return single;
  const int per_sample = std::clamp(static_cast<int>(kSampleMs / std::max(single, 1e-4f)), 1, kMaxPerSample);
  CapturedLaunches graph(k, p, t, ws, ws_bytes, stream, per_sample);
  std::vector<float> ms;
  for (int i = 0; i < kSamples; ++i) {
    if (!events.record(events.start, stream)) return 1e30f;
    if (graph.exec) {
      if (cudaGraphLaunch(graph.exec, stream) != cudaSuccess) return 1e30f;
    } else {
      for (int j = 0; j < per_sample; ++j)
        if (!k.launch(p, t, ws, ws_bytes, stream).ok()) return 1e30f;
    }
    if (!events.record(events.stop, stream)) return 1e30f;
    ms.push_back(events.elapsed_ms() / per_sample);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::string problem_key(const ConvProblem& p) {
  const ConvAttributes& a = p.attr;
  std::ostringstream s;
  s << dtype_name(p.dtype) << " N" << p.N << " H" << p.H << " W" << p.W << " C" << p.C << " K" << p.K << " R" << p.R
    << " S" << p.S << " g" << a.group << " s" << a.stride_h << 'x' << a.stride_w << " d" << a.dil_h << 'x' << a.dil_w
    << " p" << a.pad_top << ',' << a.pad_left << ',' << a.pad_bottom << ',' << a.pad_right << " act"
    << static_cast<int>(a.activation.kind) << " res" << residual_name(a.residual) << (a.allow_tf32 ? " tf32" : "");
  return s.str();
}

Status max_workspace(const char* target, const ConvProblem& p, size_t* bytes) {
  Device d;
  EPIFUSE_RETURN_IF_ERROR(current_device(&d));
  std::vector<const KernelImpl*> ks;
  EPIFUSE_RETURN_IF_ERROR(candidates(target, p, d, &ks));
  *bytes = 0;
  for (const KernelImpl* k : ks) *bytes = std::max(*bytes, k->workspace_size(p));
  return Status::Ok();
}

Status select_kernel(const char* target, const ConvProblem& p, const Tensors& t, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream, Selection* out) {
  Device d;
  EPIFUSE_RETURN_IF_ERROR(current_device(&d));
  std::vector<const KernelImpl*> ks;
  EPIFUSE_RETURN_IF_ERROR(candidates(target, p, d, &ks));
  const std::string key = d.name + " sm" + std::to_string(d.sm) + ", " + kernels_build() + '\t' + problem_key(p);
  const std::string cached = TuningCache::instance().find(key);
  for (const KernelImpl* k : ks)
    if (cached == k->name) {
      *out = {k, "cache"};
      return Status::Ok();
    }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {  // unknown: do not time inside a capture
    cudaGetLastError();
    capturing = cudaStreamCaptureStatusActive;
  }
  if (ks.size() == 1 || !tuning_enabled() || capturing != cudaStreamCaptureStatusNone) {
    *out = {ks.front(), "heuristic"};
    return Status::Ok();
  }
  // Candidates come in the registry's order (its heuristic's choice first); a later one must be 2%
  // faster to take over, so near-ties resolve the same way from one tuning run to the next.
  // A warm single launch includes launch overhead that back-to-back timing does not, so only kernels
  // slower than kHopeless x the best and than kHopelessMs are dropped after their warm-up.
  constexpr float kTakeOver = 0.98f, kHopeless = 3.f, kHopelessMs = 0.1f;
  const KernelImpl* best = nullptr;
  float best_ms = 1e30f;
  for (const KernelImpl* k : ks) {
    if (k->workspace_size(p) > workspace_bytes) continue;
    const float ms = time_kernel(*k, p, t, workspace, workspace_bytes, stream,
                                 std::max(kHopeless * best_ms, kHopelessMs));
    if (ms < (best ? kTakeOver * best_ms : 1e30f)) best_ms = ms, best = k;
  }
  if (!best) {  // nothing could be timed: the heuristic's choice, whose launch reports its own error
    *out = {ks.front(), "heuristic"};
    return Status::Ok();
  }
  TuningCache::instance().store(key, best->name);
  *out = {best, "tuned"};
  return Status::Ok();
}

}  // namespace epifuse::cuda
