// Rules of the im2col + GEMM kernels (plugins/kernels/im2col_gemm.cu) for few-channel convs such as
// RGB stems (C = 3): a chunk of images is unrolled into a row-major matrix A [n*P*Q, Kg] (column
// (r*S + s)*C + c, Kg = R*S*C rounded up to 8), the KRSC filter is already a [K, R*S*C] matrix, and
// a 1x1 GEMM kernel runs A x W^T with the fused epilogue. The GEMM's reduction is R*S*C long, so a
// 7x7 C = 3 stem wastes 5 of 152 columns, where the pad8_ kernels (a K tile of 64 channels per
// filter tap) waste 7/8 of the math. The rule is the inner kernel's rule on the GEMM problem of one
// chunk, the largest problem it is launched on.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "registry.h"
#include "wrapper_family.h"

namespace epifuse {
namespace {

// The im2col matrix holds about R*S/(stride_h*stride_w) copies of X; past 1024 columns the copy
// outgrows the work it saves (such a conv is no stem), so the direct kernels keep those problems.
constexpr int64_t kMaxColumns = 1024;
// One chunk's matrix stays in the H200's 50 MB L2 between the im2col write and the GEMM's read,
// and the workspace stays bounded for any batch.
constexpr int64_t kChunkBytes = int64_t(16) << 20;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Best first: the SM90 GEMMs (128x64 ping-pong: stems have K = 16-64 output channels, where a 128-wide
// N tile is half padding), then the sm80 GEMM that also runs on later GPUs.
constexpr WrapperEntry kEntries[] = {
    {"im2col_sm90_f16_gemm1x1_128x64_pingpong", "sm90_f16_gemm1x1_128x64_pingpong", 90, 90},
    {"im2col_sm90_bf16_gemm1x1_128x64_pingpong", "sm90_bf16_gemm1x1_128x64_pingpong", 90, 90},
    {"im2col_sm90_f16_gemm1x1_128x128_coop", "sm90_f16_gemm1x1_128x128_coop", 90, 90},
    {"im2col_sm90_bf16_gemm1x1_128x128_coop", "sm90_bf16_gemm1x1_128x128_coop", 90, 90},
    {"im2col_sm80_f16_64x64x64_4st", "sm80_f16_64x64x64_4st", 80, 1209},
    {"im2col_sm80_bf16_64x64x64_4st", "sm80_bf16_64x64x64_4st", 80, 1209},
};

int64_t element_bytes(DType t) { return t == DType::kFloat ? 4 : 2; }

// Kg = R*S*C rounded up to 8: 16-byte rows for the GEMM's vector loads; -1 when unknown.
int64_t gemm_columns(const ConvProblem& p) {
  if (p.R < 0 || p.S < 0 || p.C < 0) return -1;
  const int64_t columns = saturating_product({p.R, p.S, p.C});
  return columns > std::numeric_limits<int64_t>::max() - 7 ? columns : (columns + 7) / 8 * 8;
}

bool im2col_can_implement(const char* inner_name, const ConvProblem& p, std::string* why) {
  if (p.attr.group != 1) return reject(why, "group " + std::to_string(p.attr.group) + " (needs 1)");
  if (p.C < 0 || p.R < 0 || p.S < 0) return reject(why, "C, R and S must be known");
  if (p.C % 8 == 0) return reject(why, "C is a multiple of 8 (the implicit-GEMM kernels read X directly)");
  const int64_t columns = saturating_product({p.R, p.S, p.C});
  if (columns > kMaxColumns)
    return reject(why, "R*S*C = " + std::to_string(columns) + " > " + std::to_string(kMaxColumns) +
                           " (bounds the im2col matrix, ~R*S/(stride_h*stride_w) copies of X)");
  // Each term is checked first, so the sum cannot overflow.
  auto int32_extent = [](int64_t in, int64_t pad_begin, int64_t pad_end) {
    return in < 0 || (in <= kInt32Max && pad_begin <= kInt32Max && pad_end <= kInt32Max &&
                      in + pad_begin + pad_end <= kInt32Max);
  };
  const ConvAttributes& a = p.attr;
  if (!int32_extent(p.H, a.pad_top, a.pad_bottom) || !int32_extent(p.W, a.pad_left, a.pad_right))
    return reject(why, "H + pads or W + pads exceeds INT32_MAX (the im2col kernel's int32 input coordinates)");
  const ConvProblem q = im2col_gemm_problem(p, im2col_chunk_images(p));
  return inner_kernel_can_implement(
      inner_name, q, "as a 1x1 GEMM over one chunk (C = R*S*C rounded up to 8 = " + std::to_string(q.C) + ")", why);
}

using Family = WrapperFamily<kEntries, im2col_can_implement>;
static_assert(Family::kCount == kIm2colKernelCount, "registry.h's count");

}  // namespace

std::vector<KernelDescriptor> im2col_kernel_rules() { return Family::descriptors(); }
const char* im2col_kernel_name(int i) { return Family::name(i); }
const char* im2col_inner_kernel(const char* name) { return Family::inner(name); }

int64_t im2col_chunk_images(const ConvProblem& p) {
  const int64_t P = p.P(), Q = p.Q();
  const int64_t columns = gemm_columns(p);
  if (p.N < 0 || P < 0 || Q < 0 || columns < 0) return -1;
  const int64_t image_bytes = saturating_product({P, Q, columns, element_bytes(p.dtype)});
  return std::min(p.N, std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(image_bytes, 1)));
}

ConvProblem im2col_gemm_problem(const ConvProblem& p, int64_t images) {
  ConvProblem q;  // 1x1, stride 1, no padding, dilation 1, group 1
  q.dtype = p.dtype;
  q.N = images;
  q.H = p.P();
  q.W = p.Q();
  q.C = gemm_columns(p);
  q.K = p.K;
  q.R = q.S = 1;
  q.attr.activation = p.attr.activation;
  q.attr.residual = p.attr.residual;
  return q;
}

}  // namespace epifuse
