// NCHW -> NHWC for few-channel tensors (the image at a graph input) on the CPU: what
// epifuse::NchwToNhwc's CPU kernel runs. ORT's CPU Transpose moves a 1x3x224x224 float image in
// 0.06-0.35 ms on 2 threads (an element at a time); interleaving a row of every plane at a time, with
// the channel count a compile-time constant, took 0.05 ms, and with AVX-512 permutes for three 4-byte
// planes 0.02 ms, a plain copy's time (bench/cpu_layout.py).
#pragma once
#include <cstddef>
#include <cstdint>

#include "parallel.h"
#include "status.h"

namespace epifuse {

// y [N, H, W, C] = x [N, C, H, W] for elements of `element_size` bytes (2 or 4); rows (n, h) are
// spread with `parallel`. Any C works; C <= 8 takes the unrolled path.
Status nchw_to_nhwc_cpu(const void* x, void* y, int64_t N, int64_t C, int64_t H, int64_t W, size_t element_size,
                        const ParallelFor& parallel);

}  // namespace epifuse
