// Shared implementation of the CUTLASS 2.x (sm80: cp.async + mma.sync) FusedConv kernels:
// DefaultConv2dFpropWithBroadcast with the FusedConvEpilogueOp functor (FusedConv), launched by
// FusedConvLauncher, which the grouped kernel (group_conv.cuh) shares. Each configuration is
// instantiated in its own .cu file (one translation unit each, so the build parallelises) and
// exports a KernelImpl; the matching rules (which problems each accepts) are in
// plugins/core/rules_sm80.cc and must agree with Conv::can_implement.
#pragma once
#include <cstdint>
#include <string>

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/numeric_types.h"

#include "kernel_api.h"
#include "sm80/fused_epilogue.h"

namespace epifuse::cuda::sm80 {

template <int M, int N, int K>
using Shape = cutlass::gemm::GemmShape<M, N, K>;

// The launch side of a kernel with the FusedConv epilogue: a device-level ImplicitGemmConvolution over
// `Kernel`, whose epilogue is EpilogueWithBroadcast with FusedConvEpilogueOp<Element, AlignC>.
// Name: the registry name; Element: cutlass::half_t or cutlass::bfloat16_t (float for 3xTF32).
// AlignAB: elements per global access of X and W (C / group % AlignAB == 0); AlignC: of Y, Z and B
// (K % AlignC == 0). Check::can_implement(Arguments) decides which problems it runs: the device
// operator's own, unless the kernel needs another (group_conv.cuh).
template <const char* Name, typename Element, typename Kernel, int AlignAB, int AlignC,
          typename Check = cutlass::conv::device::ImplicitGemmConvolution<Kernel>>
struct FusedConvLauncher {
  using Layout = cutlass::layout::TensorNHWC;  // X, Y, Z are NHWC; the KRSC filter is "NHWC" too
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  static_assert(Conv::UnderlyingKernel::Epilogue::OutputTileIterator::kElementsPerAccess == AlignC,
                "epilogue access width must be the rule's K alignment");

  static cutlass::conv::Conv2dProblemSize problem_size(const ConvProblem& p) {
    const ConvAttributes& a = p.attr;
    // Conv2dProblemSize has top/left padding only: bottom/right padding enters through P and Q
    // (computed with both sides); rows/columns past H/W read as zeros.
    return cutlass::conv::Conv2dProblemSize(
        int(p.N), int(p.H), int(p.W), int(p.C), int(p.K), int(p.R), int(p.S), int(p.P()), int(p.Q()),
        int(a.pad_top), int(a.pad_left), int(a.stride_h), int(a.stride_w), int(a.dil_h), int(a.dil_w),
        cutlass::conv::Mode::kCrossCorrelation,  // ONNX Conv: no filter flip
        /*split_k_slices=*/1, int(a.group));
  }

  static typename Conv::Arguments arguments(const ConvProblem& p, const Tensors& t) {
    const cutlass::conv::Conv2dProblemSize ps = problem_size(p);
    auto* x = static_cast<Element*>(const_cast<void*>(t.x));
    auto* w = static_cast<Element*>(const_cast<void*>(t.w));
    auto* b = static_cast<Element*>(const_cast<void*>(t.b));
    auto* y = static_cast<Element*>(t.y);
    // Without a residual the source is never read (is_source_needed() is false); C points at Y
    // so that the reference is still valid memory.
    auto* z = t.z ? static_cast<Element*>(const_cast<void*>(t.z)) : y;
    cutlass::TensorRef<Element, Layout> ref_x(x, Layout::packed({ps.N, ps.H, ps.W, ps.C}));
    cutlass::TensorRef<Element, Layout> ref_w(w, Layout::packed({ps.K, ps.R, ps.S, ps.C / ps.groups}));
    cutlass::TensorRef<Element, Layout> ref_z(z, Layout::packed({ps.N, ps.P, ps.Q, ps.K}));
    cutlass::TensorRef<Element, Layout> ref_y(y, Layout::packed({ps.N, ps.P, ps.Q, ps.K}));
    typename FusedConvEpilogueOp<Element, AlignC>::Params epilogue{Epilogue::of(p)};
    if (!t.z) epilogue.epilogue.residual = Residual::kNone;
    return typename Conv::Arguments(ps, ref_x, ref_w, ref_z, ref_y, epilogue, cutlass::conv::SplitKMode::kSerial,
                                    b,        // ptr_Vector: bias[K]
                                    nullptr,  // ptr_Tensor: the pre-activation tensor is not stored
                                    0,        // ldr = 0: the same bias row for every output pixel
                                    0);
  }

  static Status error(const char* what, cutlass::Status s) {
    return Status::Error(std::string(Name) + ": CUTLASS " + what + " failed: " + cutlassGetStatusString(s));
  }

  static bool aligned(const void* ptr, int elements) {
    return reinterpret_cast<std::uintptr_t>(ptr) % (size_t(elements) * sizeof(Element)) == 0;
  }

  static size_t workspace_size(const ConvProblem& p) {
    if (p.N * p.P() * p.Q() * p.K == 0) return 0;
    Tensors none{nullptr, nullptr, nullptr, nullptr, nullptr};
    return Conv::get_workspace_size(arguments(p, none));
  }

  static Status launch(const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
    if (p.N * p.P() * p.Q() * p.K == 0) return Status::Ok();
    if (!aligned(t.x, AlignAB) || !aligned(t.w, AlignAB) || !aligned(t.b, AlignC) || !aligned(t.y, AlignC) ||
        (t.z && !aligned(t.z, AlignC)))
      return Status::Error(std::string(Name) + ": a tensor's address is not aligned to its vector access (" +
                           std::to_string(AlignAB * sizeof(Element)) + " B for X/W, " +
                           std::to_string(AlignC * sizeof(Element)) + " B for B/Z/Y)");
    const typename Conv::Arguments args = arguments(p, t);
    cutlass::Status s = Check::can_implement(args);
    if (s != cutlass::Status::kSuccess) return error("can_implement", s);
    const size_t needed = Conv::get_workspace_size(args);
    if (needed > workspace_bytes)
      return Status::Error(std::string(Name) + ": workspace of " + std::to_string(workspace_bytes) +
                           " bytes, needs " + std::to_string(needed));
    Conv op;
    s = op.initialize(args, workspace, stream);
    if (s != cutlass::Status::kSuccess) return error("initialize", s);
    s = op.run(stream);
    if (s != cutlass::Status::kSuccess) return error("run", s);
    return check_launch(Name, cudaGetLastError());
  }

  static KernelImpl impl() { return {Name, workspace_size, launch}; }
};

// DefaultConv2dFpropWithBroadcast with the FusedConvEpilogueOp functor. Stages == 2 selects CUTLASS's
// pipelined (ld.global) mainloop, which allows accesses narrower than cp.async's 4 bytes; more stages
// the cp.async multistage mainloop.
template <const char* Name, typename Element, typename TileShape, typename WarpShape, typename InstShape, int Stages,
          cutlass::conv::IteratorAlgorithm Algorithm, int AlignAB, int AlignC,
          typename MathOp = cutlass::arch::OpMultiplyAdd>
struct FusedConv
    : FusedConvLauncher<
          Name, Element,
          typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<
              Element, cutlass::layout::TensorNHWC, Element, cutlass::layout::TensorNHWC, Element,
              cutlass::layout::TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, TileShape,
              WarpShape, InstShape, FusedConvEpilogueOp<Element, AlignC>,
              cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, Stages, MathOp, Algorithm,
              cutlass::conv::StrideSupport::kStrided, AlignAB, AlignAB>::Kernel,
          AlignAB, AlignC> {};

}  // namespace epifuse::cuda::sm80
