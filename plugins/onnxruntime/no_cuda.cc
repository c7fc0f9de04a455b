// CPU-only builds: no CUDAExecutionProvider kernels.
#include "ort_ops.h"

namespace epifuse::ort {

void add_cuda_ops(OpList*) {}

}  // namespace epifuse::ort
