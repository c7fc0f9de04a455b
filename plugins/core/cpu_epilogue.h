// Activations applied by a vectorized pass over a convolution's output instead of oneDNN's eltwise
// post-op, where that is faster: oneDNN's SiLU (swish) post-op costs ~22 cycles a 16-float vector
// on top of a 1x1 convolution (measured on Zen 4, oneDNN 3.2's brgconv_1x1: +40-60% on 32-64
// channel layers), a pass over the output just written, still in cache, about half of that. On
// AVX2 (Zen 3) the 8-lane pass took YOLOv8n fused everywhere from 85-110 ms to 80-83 ms. GELU (erf)
// likewise: oneDNN's post-op ~29 cycles a vector (a divide and e^x), the pass's polynomial pieces fewer.
// The pass runs on the widest ISA best_vector_isa() allows (EPIFUSE_CPU_ISA=avx2 tests the AVX2 one),
// read when the kernel is made, not on every call.
#pragma once

#include <cstdint>

#include "conv_problem.h"
#include "cpu_isa.h"

namespace epifuse {

// True where `a`'s activation on fp32 outputs runs as the pass on this CPU (AVX-512F, or AVX2 and FMA).
bool activation_in_pass(DType dtype, const ConvAttributes& a);

// y[i] = act(y[i]) (+ z[i] where `z` is not null: the residual added after the activation), for
// `n` contiguous floats, on `isa` (best_vector_isa() as the caller read it once; not kNone). Only for
// an `a` that activation_in_pass accepts.
void activation_pass(const ConvAttributes& a, VectorIsa isa, float* y, const float* z, int64_t n);

}  // namespace epifuse
