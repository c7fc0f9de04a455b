// The custom ops each part of the library registers under the "epifuse" domain.
#pragma once
#include <memory>
#include <vector>

#include "node_glue.h"

namespace epifuse::ort {

void add_cpu_ops(std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>* ops);
// CUDA builds register the CUDAExecutionProvider kernels; CPU-only builds register none.
void add_cuda_ops(std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>* ops);

}  // namespace epifuse::ort
