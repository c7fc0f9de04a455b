// Y [N, H, W, C_1 + ... + C_n] = X_1 [N, H, W, C_1] ... X_n [N, H, W, C_n] concatenated along the channels on
// the CPU: what epifuse::ChannelConcat's kernel runs, the Concat of a channels-last region (a YOLO C2f or
// CSP block's). ONNX Runtime's Concat copies such a tensor a pixel's C_i elements at a time through its
// generic strided copy, 1.2-2.3x the time of the same concat in NCHW (whole planes a copy); this copies each
// pixel's rows with vector loads and stores, the output written in order.
#pragma once
#include <cstddef>
#include <cstdint>

#include "parallel.h"
#include "status.h"

namespace epifuse {

// x[i]: input i, `channels[i]` elements a pixel; y: `pixels` (N * H * W) rows of their sum. Elements of
// `element_size` bytes (2 or 4: the copy does not look at them). Pixels are spread with `parallel`.
Status channel_concat_cpu(const void* const* x, const int64_t* channels, int64_t inputs, void* y, int64_t pixels,
                          size_t element_size, const ParallelFor& parallel);

}  // namespace epifuse
