// CUTLASS 2.x epilogue thread functor of FusedConv, for EpilogueWithBroadcast (the epilogue of
// cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast):
//   none: Y = act(acc + B)      pre: Y = act(acc + B + Z)      post: Y = act(acc + B) + Z
// B is the broadcast vector (ptr_Vector, ldr = 0), Z comes in as the source operand C and is read
// only when the residual mode is not `none` (is_source_needed). The activation and the residual
// mode are run-time values (epifuse::cuda::Epilogue), so one instantiation per tile configuration
// serves every activation of the contract. Math in fp32, output rounded to nearest.
#pragma once
#include "cutlass/array.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/scale_type.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"

#include "epilogue.cuh"

namespace epifuse::cuda::sm80 {

template <typename Element_, int Count>
class FusedConvEpilogueOp {
 public:
  using ElementOutput = Element_;
  using ElementD = Element_;
  using ElementC = Element_;  // the residual Z
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementZ = Element_;  // EpilogueWithBroadcast's "Z" is what we store as Y
  using ElementT = Element_;  // pre-activation tensor: never stored
  using ElementVector = Element_;  // the bias
  static int const kElementsPerAccess = Count;
  static int const kCount = Count;

  static bool const kIsSingleSource = true;
  static bool const kIsHeavy = true;  // a run-time switch over 14 activations: do not over-unroll
  static bool const kStoreZ = true;
  static bool const kStoreT = false;
  static cutlass::epilogue::thread::ScaleType::Kind const kScale = cutlass::epilogue::thread::ScaleType::Default;

  using FragmentAccumulator = cutlass::Array<ElementAccumulator, kCount>;
  using FragmentCompute = cutlass::Array<ElementCompute, kCount>;
  using FragmentC = cutlass::Array<ElementC, kCount>;
  using FragmentZ = cutlass::Array<ElementZ, kCount>;
  using FragmentT = cutlass::Array<ElementT, kCount>;
  using FragmentSource = FragmentC;
  using FragmentOutput = FragmentZ;

  struct Params {
    Epilogue epilogue;
  };

  CUTLASS_HOST_DEVICE
  explicit FusedConvEpilogueOp(Params const& params) : epilogue_(params.epilogue) {}

  CUTLASS_HOST_DEVICE
  bool is_source_needed() const { return epilogue_.residual != Residual::kNone; }

  // Only split-k == 1 is ever launched, so there is no partial reduction to account for.
  CUTLASS_HOST_DEVICE
  void set_k_partition(int, int) {}

  // Residual present (pre or post): Z arrives as the source fragment.
  CUTLASS_DEVICE
  void operator()(FragmentZ& frag_Z, FragmentT&, FragmentAccumulator const& acc, FragmentC const& frag_C,
                  FragmentCompute const& bias) const {
    cutlass::NumericArrayConverter<ElementCompute, ElementC, kCount> to_compute;
    FragmentCompute z = to_compute(frag_C);
    FragmentCompute y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) y[i] = epilogue_(acc[i], bias[i], z[i]);
    cutlass::NumericArrayConverter<ElementZ, ElementCompute, kCount, cutlass::FloatRoundStyle::round_to_nearest> out;
    frag_Z = out(y);
  }

  // No residual: the source is never loaded.
  CUTLASS_DEVICE
  void operator()(FragmentZ& frag_Z, FragmentT&, FragmentAccumulator const& acc, FragmentCompute const& bias) const {
    FragmentCompute y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) y[i] = epilogue_.activation(acc[i] + bias[i]);
    cutlass::NumericArrayConverter<ElementZ, ElementCompute, kCount, cutlass::FloatRoundStyle::round_to_nearest> out;
    frag_Z = out(y);
  }

 private:
  Epilogue epilogue_;
};

}  // namespace epifuse::cuda::sm80
