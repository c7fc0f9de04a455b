// Y [N, H, W, C] = X [N, H, W, C] * S [N or 1, 1, 1, C] on the CPU, fp32 or bf16: what epifuse::ChannelScale's
// CPU kernel runs, the squeeze-excite scale of a channels-last region. ORT's broadcasting Mul takes a
// vector along the last axis a row at a time, 2-4x slower than its NCHW form of the same product
// (1x112x112x32: 196 against 47 us on one Zen 4 thread); this streams each row against the scale
// vector in registers, 1.1-3.4x ORT's Mul (bench/cpu_layout.py).
#pragma once
#include <cstdint>

#include "float_types.h"
#include "parallel.h"
#include "status.h"

namespace epifuse {

// `scales_per_image`: S holds a vector of C for each of the N images, else one for all. Pixels
// (n, h, w) are spread with `parallel`.
Status channel_scale_cpu(const float* x, const float* s, float* y, int64_t N, int64_t pixels, int64_t C,
                         bool scales_per_image, const ParallelFor& parallel);
// bfloat16 X, S and Y: each product computed in fp32 and rounded once (a bf16 model's squeeze-excite scale).
Status channel_scale_cpu(const bfloat16_t* x, const bfloat16_t* s, bfloat16_t* y, int64_t N, int64_t pixels,
                         int64_t C, bool scales_per_image, const ParallelFor& parallel);

}  // namespace epifuse
