// The reference CPU FusedConv: NHWC X, KRSC W, fp32/fp16/bf16 (16-bit types computed in fp32). It runs
// what oneDNN refuses (cpu_fused_conv.h), and EPIFUSE_CPU_KERNEL=reference selects it everywhere; plain loops and
// an Eigen GEMM, far slower than oneDNN or ONNX Runtime's own convolutions.
#pragma once
#include "conv_problem.h"
#include "parallel.h"
#include "status.h"

namespace epifuse {

// Y = act(conv(X, W) + B [+ Z]) or act(conv(X, W) + B) + Z, per p.attr.residual. Every
// dimension of `p` must be known. Tensors are in p.dtype (uint16_t storage for the 16-bit
// types); `z` is null exactly when the residual mode is none.
// The checks every CPU kernel makes before touching data; *empty is set for a batch of 0, where
// there is nothing to read or write (and the data pointers may be null).
Status check_cpu_problem(const ConvProblem& p, const void* x, const void* w, const void* b, const void* z,
                         const void* y, bool* empty);

Status reference_fused_conv(const ConvProblem& p, const void* x, const void* w, const void* b,
                            const void* z, void* y, const ParallelFor& parallel_for);

}  // namespace epifuse
