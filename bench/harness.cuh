// Shared by the kernel harnesses (bench/*.cu, built with -DEPIFUSE_BENCH=ON), which compile a
// kernel's source into themselves and link launch_support.cu for the helpers the kernels use: the one
// way all of them time a kernel.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernel_api.h"

namespace epifuse::bench {
// µs per call: the median over 15 replays (after one warm-up replay) of a CUDA graph holding 20 calls
// of launch(stream), so host dispatch is not in the figure (bench/kernels.py times the same way).
template <class Launch>
float graph_us(Launch&& launch, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < 20; ++i) launch(stream);
  cudaStreamEndCapture(stream, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, stream);
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  std::vector<float> us;
  for (int rep = 0; rep < 15; ++rep) {
    float ms = 0;
    cudaEventRecord(begin, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(end, stream);
    cudaEventSynchronize(end);
    cudaEventElapsedTime(&ms, begin, end);
    us.push_back(ms * 1000 / 20);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
}  // namespace epifuse::bench
