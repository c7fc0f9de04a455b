// Parallel split-K FusedConv for layers with few output tiles and a long reduction (batch 1, late
// stages: ResNet-50's 7x7x512 3x3 conv has 8 output tiles of 64x64 and R*S*C = 4608, so a plain
// implicit GEMM runs 8 CTAs on 132 SMs). CUTLASS 2.x ImplicitGemmConvolution in kParallel mode
// splits the R*S*C loop over `slices` CTAs per output tile, each writing fp32 partial sums to its
// own slice of the workspace; split_reduce then sums the slices and applies the FusedConv epilogue
// (bias, activation, residual) once, on full fp32 sums. The fused epilogue cannot run inside the
// split kernel: it is not linear, so it must see the whole sum.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

#include "dtype.cuh"
#include "epilogue.cuh"
#include "kernel_api.h"

namespace epifuse::cuda::sm80 {

// Sums `slices` fp32 partials of [rows, K] and writes Y = epilogue(sum, bias, Z), 4 channels a thread.
template <class T>
__global__ void split_reduce(const float* __restrict__ partial, int slices, int64_t slice_elems, int k,
                             const T* __restrict__ bias, const T* __restrict__ z, T* __restrict__ y, Epilogue e) {
  const int64_t quads = slice_elems / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    float4 acc = reinterpret_cast<const float4*>(partial)[i];
    for (int s = 1; s < slices; ++s) {
      const float4 v = reinterpret_cast<const float4*>(partial + s * slice_elems)[i];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    const int64_t at = i * 4;
    const int c = int(at % k);  // K % 4 == 0 (the rule's alignment), so the 4 lanes share a row
    const float sums[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      y[at + j] = from_float<T>(e(sums[j], to_float(bias[c + j]), z ? to_float(z[at + j]) : 0.f));
  }
}

template <const char* Name, typename Element, typename TileShape, typename WarpShape, typename InstShape, int Stages>
struct SplitKConv {
  using Layout = cutlass::layout::TensorNHWC;
  // 128-bit accesses of X and W; float operands run as TF32 (one mma.sync, as the F32_TF32 lines).
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  // Partials: D = acc (alpha 1, beta 0: the source is never read).
  using PartialOp = cutlass::epilogue::thread::LinearCombination<float, 4, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
      Element, Layout, Element, Layout, float, Layout, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      TileShape, WarpShape, InstShape, PartialOp, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, Stages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided,
      kAlign, kAlign>::Kernel;
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

  // Enough CTAs for two waves, but every slice keeps >= 4 iterations of the K loop (its pipeline
  // prologue would dominate otherwise) and at most 16 slices (the reduction reads each one).
  static int slices(const ConvProblem& p) {
    const int64_t tiles = ((p.N * p.P() * p.Q() + TileShape::kM - 1) / TileShape::kM) *
                          ((p.K + TileShape::kN - 1) / TileShape::kN);
    const int64_t k_iters = p.R * p.S * ((p.C + TileShape::kK - 1) / TileShape::kK);
    int device = 0, sms = 0;
    if (!current_device_sms(&device, &sms)) sms = 108;  // an A100's count: sets the slice count, never correctness
    const int64_t want = (2 * int64_t(sms) + tiles - 1) / std::max<int64_t>(tiles, 1);
    return int(std::max<int64_t>(1, std::min<int64_t>({want, k_iters / 4, 16})));
  }

  static cutlass::conv::Conv2dProblemSize problem_size(const ConvProblem& p, int slices) {
    const ConvAttributes& a = p.attr;
    return cutlass::conv::Conv2dProblemSize(
        int(p.N), int(p.H), int(p.W), int(p.C), int(p.K), int(p.R), int(p.S), int(p.P()), int(p.Q()),
        int(a.pad_top), int(a.pad_left), int(a.stride_h), int(a.stride_w), int(a.dil_h), int(a.dil_w),
        cutlass::conv::Mode::kCrossCorrelation, slices, /*groups=*/1);
  }

  static size_t partial_bytes(const ConvProblem& p) {
    return (size_t(p.N * p.P() * p.Q() * p.K) * sizeof(float) * size_t(slices(p)) + 255) / 256 * 256;
  }

  static size_t workspace_size(const ConvProblem& p) { return p.N * p.P() * p.Q() * p.K == 0 ? 0 : partial_bytes(p); }

  static Status launch(const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
    if (p.N * p.P() * p.Q() * p.K == 0) return Status::Ok();
    if (workspace_bytes < partial_bytes(p))
      return Status::Error(std::string(Name) + ": workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                           std::to_string(partial_bytes(p)));
    const int s = slices(p);
    const cutlass::conv::Conv2dProblemSize ps = problem_size(p, s);
    auto* partial = static_cast<float*>(workspace);
    cutlass::TensorRef<Element, Layout> ref_x(static_cast<Element*>(const_cast<void*>(t.x)),
                                              Layout::packed({ps.N, ps.H, ps.W, ps.C}));
    cutlass::TensorRef<Element, Layout> ref_w(static_cast<Element*>(const_cast<void*>(t.w)),
                                              Layout::packed({ps.K, ps.R, ps.S, ps.C}));
    cutlass::TensorRef<float, Layout> ref_d(partial, Layout::packed({ps.N, ps.P, ps.Q, ps.K}));
    typename Conv::Arguments args(ps, ref_x, ref_w, ref_d, ref_d, {1.f, 0.f}, cutlass::conv::SplitKMode::kParallel);
    cutlass::Status st = Conv::can_implement(args);
    if (st != cutlass::Status::kSuccess)
      return Status::Error(std::string(Name) + ": CUTLASS can_implement failed: " + cutlassGetStatusString(st));
    // In kParallel mode CUTLASS's "workspace" is the partial buffer itself (it zeroes it first).
    if (Conv::get_workspace_size(args) > workspace_bytes)
      return Status::Error(std::string(Name) + ": CUTLASS needs a larger workspace");
    Conv op;
    st = op.initialize(args, workspace, stream);
    if (st == cutlass::Status::kSuccess) st = op.run(stream);
    if (st != cutlass::Status::kSuccess)
      return Status::Error(std::string(Name) + ": CUTLASS run failed: " + cutlassGetStatusString(st));
    const int64_t elems = p.N * p.P() * p.Q() * p.K;
    const int blocks = int(std::min<int64_t>((elems / 4 + 255) / 256, 4096));
    Epilogue e = Epilogue::of(p);
    if (!t.z) e.residual = Residual::kNone;
    // A local alias: nvcc's host stub cannot name a kernel instantiated on a class member type.
    using T = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, __half,
                                 std::conditional_t<std::is_same_v<Element, float>, float, __nv_bfloat16>>;
    split_reduce<T><<<blocks, 256, 0, stream>>>(partial, s, elems, int(p.K), static_cast<const T*>(t.b),
                                                static_cast<const T*>(t.z), static_cast<T*>(t.y), e);
    return check_launch(Name, cudaGetLastError());
  }

  static KernelImpl impl() { return {Name, workspace_size, launch}; }
};

}  // namespace epifuse::cuda::sm80
