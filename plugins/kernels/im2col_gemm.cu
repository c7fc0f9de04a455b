// im2col + GEMM for few-channel convs (RGB stems): per chunk of images, the patches are written to
// the workspace as a row-major matrix A [n*P*Q, Kg] (column (r*S + s)*C + c, zero for padding taps
// and for the columns past R*S*C), the KRSC filter is copied once as [K, Kg] with zero columns, and
// a 1x1 GEMM kernel computes Y = A x W^T with the fused epilogue. The inner kernel, the chunk size
// and the GEMM problem come from plugins/core (rules_im2col.cc), so the rule checks exactly the
// problem launched here. Chunks keep A small enough to be read back from L2.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "dtype.cuh"
#include "kernel_api.h"
#include "pad_copy.cuh"
#include "registry.h"

namespace epifuse::cuda {
namespace {

// What the im2col kernel needs of the problem. The rule keeps H + pads and W + pads within int32, so
// every input row/column a tap reads (h0 + r*dil_h, in [-pad_top, H + pad_bottom)) is an int.
struct Geometry {
  int H, W, C, S, columns, columns_padded;  // columns = R*S*C, columns_padded = Kg
  int64_t P, Q, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
};

// Where column k of A reads X, relative to the output pixel's top-left input pixel (h0, w0), as an
// int4 so that one 128-bit shared load fetches it: {dh = r*dil_h, dw = s*dil_w, offset low, high},
// offset = (dh*W + dw)*C + c. The zero columns past R*S*C get dh = dw = kOutside.
// With H + pads <= INT32_MAX, unsigned(h0) + unsigned(INT32_MIN) (mod 2^32) is >= H for every h0 in
// [-pad_top, H + pad_bottom), so those columns are never read.
constexpr int kOutside = INT32_MIN;

__device__ __forceinline__ int4 make_tap(int dh, int dw, int64_t offset) {
  return make_int4(dh, dw, int(uint32_t(uint64_t(offset))), int(uint32_t(uint64_t(offset) >> 32)));
}
__device__ __forceinline__ int64_t tap_offset(int4 t) {
  return int64_t((uint64_t(uint32_t(t.w)) << 32) | uint32_t(t.z));
}

// One thread per 16 bytes of A: kVec consecutive columns of one row, stored with one 128-bit store,
// so a warp writes 512 contiguous bytes. The column -> tap decomposition is a table in shared memory
// built once per block (the grid is capped, threads loop over vectors), which leaves a table read,
// a bounds check and a load per element. The table is column-major in the vector (entry j*vpr + v
// for column v*kVec + j), so the lanes of a warp, which read consecutive v, mostly hit distinct banks.
// Index is int32 when i + the grid stride cannot overflow it (cheaper divisions), else int64.
template <class T, class Index>
__global__ void im2col(const T* __restrict__ x, T* __restrict__ a, Index vectors, Geometry g) {
  constexpr int kVec = 16 / sizeof(T);
  extern __shared__ int4 taps[];
  const int vpr = g.columns_padded / kVec;  // vectors per row
  for (int e = threadIdx.x; e < g.columns_padded; e += blockDim.x) {
    const int j = e / vpr, v = e - j * vpr, k = v * kVec + j;
    int4 t = make_tap(kOutside, kOutside, 0);
    if (k < g.columns) {
      const int tap = k / g.C, c = k - tap * g.C, r = tap / g.S, s = tap - r * g.S;
      const int dh = int(r * g.dil_h), dw = int(s * g.dil_w);
      t = make_tap(dh, dw, (int64_t(dh) * g.W + dw) * g.C + c);
    }
    taps[e] = t;
  }
  __syncthreads();
  const Index pq = Index(g.P) * Index(g.Q);
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < vectors; i += Index(gridDim.x) * blockDim.x) {
    const Index row = i / vpr;
    const int v = int(i - row * vpr);
    const Index n = row / pq;
    const Index rem = row - n * pq;
    const Index op = rem / Index(g.Q);
    const Index oq = rem - op * Index(g.Q);
    const int h0 = int(int64_t(op) * g.stride_h - g.pad_top);
    const int w0 = int(int64_t(oq) * g.stride_w - g.pad_left);
    const int64_t pixel = ((int64_t(n) * g.H + h0) * g.W + w0) * g.C;  // may be negative: only offset, then read
    alignas(16) T out[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int4 t = taps[j * vpr + v];
      // Unsigned sums: a negative coordinate wraps past H (no signed overflow for kOutside either).
      const bool inside = unsigned(h0) + unsigned(t.x) < unsigned(g.H) && unsigned(w0) + unsigned(t.y) < unsigned(g.W);
      out[j] = inside ? x[pixel + tap_offset(t)] : from_float<T>(0.f);
    }
    reinterpret_cast<uint4*>(a)[i] = *reinterpret_cast<const uint4*>(out);
  }
}

struct Layout {
  int64_t images;  // per chunk
  size_t a_bytes, w_bytes, inner_bytes;
  size_t total() const { return a_bytes + w_bytes + inner_bytes; }
};

const KernelImpl* inner_impl(const char* name) {
  const char* inner = im2col_inner_kernel(name);
  return inner ? find_impl(inner) : nullptr;
}

bool known(const ConvProblem& p) {
  return p.N >= 0 && p.H >= 0 && p.W >= 0 && p.C >= 0 && p.K >= 0 && p.R >= 0 && p.S >= 0;
}

// [A of one full chunk | padded filter | inner workspace of the full or the last, partial chunk].
Layout layout(const char* name, const ConvProblem& p) {
  const int64_t images = std::max<int64_t>(im2col_chunk_images(p), 1);
  const ConvProblem q = im2col_gemm_problem(p, images);
  const size_t eb = element_bytes(p.dtype);
  Layout l{images, align256(size_t(q.N) * q.H * q.W * q.C * eb), align256(size_t(q.K) * q.C * eb), 0};
  if (const KernelImpl* inner = inner_impl(name)) {
    l.inner_bytes = inner->workspace_size(q);
    if (const int64_t last = p.N % images)
      l.inner_bytes = std::max(l.inner_bytes, inner->workspace_size(im2col_gemm_problem(p, last)));
  }
  return l;
}

size_t workspace_size(const char* name, const ConvProblem& p) { return known(p) ? layout(name, p).total() : 0; }

template <class T>
Status run_im2col(const char* name, const ConvProblem& p, const T* x, T* a, int64_t images, int64_t columns_padded,
                  cudaStream_t stream) {
  const auto& at = p.attr;
  for (int64_t v : {p.H, p.W, at.pad_top, at.pad_bottom, at.pad_left, at.pad_right, p.H + at.pad_top + at.pad_bottom,
                    p.W + at.pad_left + at.pad_right})
    if (v > INT32_MAX) return Status::Error(std::string(name) + ": H + pads or W + pads exceeds INT32_MAX");
  const Geometry g{int(p.H), int(p.W), int(p.C), int(p.S), int(p.R * p.S * p.C), int(columns_padded),
                   p.P(), p.Q(), at.stride_h, at.stride_w, at.dil_h, at.dil_w, at.pad_top, at.pad_left};
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vectors = images * g.P * g.Q * (columns_padded / kVec);
  // At most one wave on an H200 (132 SMs x 8 blocks of 256 threads), so each block builds the table once.
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>((vectors + 255) / 256, 1024)));
  const size_t table = size_t(columns_padded) * sizeof(int4);
  if (vectors + int64_t(blocks) * 256 <= INT32_MAX)
    im2col<T, int32_t><<<blocks, 256, table, stream>>>(x, a, int32_t(vectors), g);
  else
    im2col<T, int64_t><<<blocks, 256, table, stream>>>(x, a, vectors, g);
  return check_launch(name, cudaGetLastError());
}

Status launch(const char* name, const ConvProblem& p, const Tensors& t, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  const KernelImpl* inner = inner_impl(name);
  if (!inner)
    return Status::Error(std::string(name) + ": inner kernel " +
                         (im2col_inner_kernel(name) ? im2col_inner_kernel(name) : "(none)") + " not in this build");
  if (!known(p)) return Status::Error(std::string(name) + ": every dimension must be known at launch");
  if (p.N == 0) return Status::Ok();
  const Layout l = layout(name, p);
  if (workspace_bytes < l.total())
    return Status::Error(std::string(name) + ": workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                         std::to_string(l.total()));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return Status::Error(std::string(name) + ": workspace must be 16-byte aligned");
  auto* base = static_cast<char*>(workspace);
  char* a = base;
  char* w = base + l.a_bytes;
  void* inner_ws = base + l.a_bytes + l.w_bytes;
  const int64_t columns_padded = im2col_gemm_problem(p, l.images).C;
  const size_t eb = element_bytes(p.dtype);
  const size_t image_out_bytes = size_t(p.P()) * p.Q() * p.K * eb;
  return visit_dtype(p.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    launch_pad_channels<T>(t.w, w, p.K, int(p.R * p.S * p.C), int(columns_padded), stream);
    EPIFUSE_RETURN_IF_ERROR(check_launch(name, cudaGetLastError()));
    // The chunks share A: stream order puts each im2col after the previous chunk's GEMM.
    for (int64_t image0 = 0; image0 < p.N; image0 += l.images) {
      const int64_t images = std::min(l.images, p.N - image0);
      const T* x = static_cast<const T*>(t.x) + image0 * p.H * p.W * p.C;
      EPIFUSE_RETURN_IF_ERROR(run_im2col<T>(name, p, x, reinterpret_cast<T*>(a), images, columns_padded, stream));
      const size_t out = size_t(image0) * image_out_bytes;
      const void* z = t.z ? static_cast<const char*>(t.z) + out : nullptr;
      void* y = static_cast<char*>(t.y) + out;
      EPIFUSE_RETURN_IF_ERROR(
          inner->launch(im2col_gemm_problem(p, images), {a, w, t.b, z, y}, inner_ws, l.inner_bytes, stream));
    }
    return Status::Ok();
  });
}

}  // namespace

std::vector<KernelImpl> im2col_kernels() {
  return NamedFamily<im2col_kernel_name, workspace_size, launch, kIm2colKernelCount>::kernels();
}

}  // namespace epifuse::cuda
