// CPU-only builds: no CUDAExecutionProvider kernels.
#include "ort_ops.h"

namespace epifuse::ort {

void add_cuda_ops(std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>*) {}

}  // namespace epifuse::ort
