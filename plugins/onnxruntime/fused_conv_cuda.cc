// The CUDAExecutionProvider kernel of epifuse::FusedConv (float, float16, bfloat16): launches
// the kernel the tuning cache or the registry picks, on ORT's compute stream, with no
// synchronisation and no allocation per run (the workspace is reserved once per problem), so
// ORT's CUDA-graph capture works. The math lives in plugins/kernels.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "node_glue.h"
#include "ort_ops.h"
#include "select.h"

namespace epifuse::ort {
namespace {

template <class T>
struct FusedConvCudaKernel {
  FusedConvCudaKernel(const OrtApi*, const OrtKernelInfo* info) : node_(info) {}

  ~FusedConvCudaKernel() {
    for (auto& entry : chosen_)
      if (entry.second.workspace) entry.second.allocator->Free(entry.second.allocator, entry.second.workspace);
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<T>& X, const Tensor<T>& W, const Tensor<T>& B,
                      std::optional<const Tensor<T>*> Z, Tensor<T>& Y) {
    try {
      const Tensor<T>* z = node_.residual(Z);
      epifuse::ConvProblem p;
      Status s = node_.bind(X, W, B, z, &p);
      if (!s.ok()) return node_.error(s.message());
      T* y = Y.Allocate({p.N, p.P(), p.Q(), p.K});
      const Ort::KernelContext ctx(context);
      const auto stream = static_cast<cudaStream_t>(ctx.GetGPUComputeStream());
      const cuda::Tensors t{X.DataRaw(), W.DataRaw(), B.DataRaw(), z ? z->DataRaw() : nullptr, y};
      Choice* choice = nullptr;
      s = choose(ctx, p, t, stream, &choice);
      if (s.ok()) s = choice->kernel->launch(p, t, choice->workspace, choice->workspace_bytes, stream);
      if (!s.ok()) return node_.error(s.message(), ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return node_.error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  struct Choice {
    const cuda::KernelImpl* kernel = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    OrtAllocator* allocator = nullptr;
  };

  // Once per problem (shape): the kernel and its workspace, kept for every later run so that the
  // pointers a captured CUDA graph replays stay valid.
  Status choose(const Ort::KernelContext& ctx, const epifuse::ConvProblem& p, const cuda::Tensors& t,
                cudaStream_t stream, Choice** out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string key = cuda::problem_key(p);
    auto it = chosen_.find(key);
    if (it == chosen_.end()) {
      Choice c;
      EPIFUSE_RETURN_IF_ERROR(cuda::max_workspace("ort-cuda", p, &c.workspace_bytes));
      if (c.workspace_bytes > 0) {
        int device = 0;
        if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
          return Status::Error(std::string("workspace: no CUDA device: ") + cudaGetErrorString(e));
        const Ort::MemoryInfo cuda_memory("Cuda", OrtDeviceAllocator, device, OrtMemTypeDefault);
        c.allocator = ctx.GetAllocator(*static_cast<const OrtMemoryInfo*>(cuda_memory));
        c.workspace = c.allocator->Alloc(c.allocator, c.workspace_bytes);
        if (!c.workspace) return Status::Error("cannot allocate the kernel workspace");
      }
      cuda::Selection selection;
      EPIFUSE_RETURN_IF_ERROR(cuda::select_kernel("ort-cuda", p, t, c.workspace, c.workspace_bytes, stream,
                                                  &selection));
      c.kernel = selection.kernel;
      it = chosen_.emplace(key, c).first;
    }
    *out = &it->second;
    return Status::Ok();
  }

  NodeAttributes<T> node_;
  std::mutex mutex_;
  std::map<std::string, Choice> chosen_;
};

}  // namespace

void add_cuda_ops(OpList* ops) {
  add_typed_ops<FusedConvCudaKernel>(ops, "CUDAExecutionProvider");
  add_layout_cuda_ops(ops);
}

}  // namespace epifuse::ort
