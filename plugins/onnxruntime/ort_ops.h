// The custom ops each part of the library registers under the "epifuse" domain: FusedConv,
// NchwToNhwc and (CPU) FusedConvMean, FusedConvScaled, ChannelScale, ChannelMean, ChannelConcat, ChannelSlice, LayerNorm and
// FusedPointwiseDepthwise.
#pragma once
#include <memory>
#include <vector>

#include "node_glue.h"

namespace epifuse::ort {

using OpList = std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>;

// Registers Kernel<T> as FusedConv on `provider` for every element type of the op contract.
template <template <class> class Kernel>
void add_typed_ops(OpList* ops, const char* provider) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<float>>("FusedConv", provider));
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::Float16_t>>("FusedConv", provider));
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::BFloat16_t>>("FusedConv", provider));
}

// Lets ORT's memory planner give an op's output 0 the buffer of its input 0 where nothing reads that input
// later (for kernels that read each element before writing the same element): no fresh output buffer
// to pull into the cache. The lite API leaves GetMayInplace unset; it is a field of the OrtCustomOp.
inline void may_write_over_input_0(Ort::Custom::OrtLiteCustomOp* op) {
  op->GetMayInplace = [](int** input_index, int** output_index) -> size_t {
    *input_index = new int[1]{0};
    *output_index = new int[1]{0};
    return 1;
  };
  op->ReleaseMayInplace = [](int* input_index, int* output_index) {
    delete[] input_index;
    delete[] output_index;
  };
}

void add_cpu_ops(OpList* ops);
// CUDA builds register the CUDAExecutionProvider kernels; CPU-only builds register none.
void add_cuda_ops(OpList* ops);
// epifuse::NchwToNhwc (nchw_to_nhwc_op.h).
void add_layout_cpu_ops(OpList* ops);
void add_layout_cuda_ops(OpList* ops);
// epifuse::ChannelScale (channel_scale_cpu.cc).
void add_channel_scale_cpu_ops(OpList* ops);
// epifuse::ChannelMean (channel_mean_cpu.cc).
void add_channel_mean_cpu_ops(OpList* ops);
// epifuse::ChannelConcat and ChannelSlice (channel_copy_cpu.cc).
void add_channel_copy_cpu_ops(OpList* ops);
// epifuse::LayerNorm (layer_norm_cpu.cc).
void add_layer_norm_cpu_ops(OpList* ops);
// epifuse::FusedPointwiseDepthwise (pointwise_depthwise_cpu.cc).
void add_pointwise_depthwise_cpu_ops(OpList* ops);

}  // namespace epifuse::ort
