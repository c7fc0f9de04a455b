// Y [N, C] = the mean of X [N, H, W, C] over H and W on the CPU, fp32 or bf16: what epifuse::ChannelMean's CPU
// kernel runs, the global average pool of a channels-last region (squeeze-excite blocks, classifier
// heads). ORT runs that pool there as a ReduceMean over the middle axes (a strided loop) or, written as a
// GEMV, as MLAS's SGEMM of one row plus two Reshapes; this sums the rows in vector registers.
#pragma once
#include <cstdint>

#include "float_types.h"
#include "parallel.h"
#include "status.h"

namespace epifuse {

// Pieces of rows of each image are summed with `parallel` into partial sums, which the calling thread
// adds in a fixed order: the result does not depend on the thread count.
Status channel_mean_cpu(const float* x, float* y, int64_t N, int64_t pixels, int64_t C, const ParallelFor& parallel);
// bfloat16 X and Y: summed in fp32, the mean rounded once (a bf16 model's squeeze-excite pool).
Status channel_mean_cpu(const bfloat16_t* x, bfloat16_t* y, int64_t N, int64_t pixels, int64_t C,
                        const ParallelFor& parallel);

// sums[c] = the sum of `rows` rows of C floats at column c, the rows `stride` floats apart (sums overwritten),
// on the calling thread: a piece of a conv's output summed while it is in that core's cache.
void channel_sums_cpu(const float* x, int64_t stride, float* sums, int64_t rows, int64_t C);

}  // namespace epifuse
