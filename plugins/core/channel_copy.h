// Copies of channel ranges of NHWC tensors on the CPU: what epifuse::ChannelConcat and ChannelSlice run, the
// Concat, Split and Slice along the channels of a channels-last region (a YOLO C2f or CSP block's). ONNX
// Runtime copies such a tensor a pixel's few channels at a time through its generic strided copy, 1.2-2.3x
// the time of the same op in NCHW (whole planes a copy); these copy each pixel's rows with vector loads
// and stores, pieces of pixels on the caller's threads.
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

// Y [pixels][count] = channels [start, start + count) of X [pixels][C], elements as above.
Status channel_slice_cpu(const void* x, int64_t C, int64_t start, int64_t count, void* y, int64_t pixels,
                         size_t element_size, const ParallelFor& parallel);

}  // namespace epifuse
