// Y[r, :] = (X[r, :] - mean_r) / sqrt(var_r + epsilon) * scale + bias over rows of C floats: what
// epifuse::LayerNorm's CPU kernel runs, LayerNormalization over the last axis (ConvNeXt's norm in a
// channels-last region). ONNX Runtime's CPU LayerNormalization runs ~36 cycles a 16-float vector
// (1x56x56x96: 176 us on two Zen 4 threads, 185 on one); this takes each row in three passes while it
// sits in L1 (sum, centred squares, normalize), rows spread over the caller's threads: 47 and 75 us,
// 1.4-3.7x ORT's on ConvNeXt-T's shapes (bench/cpu_layout.py).
#pragma once
#include <cstdint>

#include "parallel.h"
#include "status.h"

namespace epifuse {

// `bias` may be null (no bias). Rows are spread with `parallel`.
Status layer_norm_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t C,
                      float epsilon, const ParallelFor& parallel);

}  // namespace epifuse
