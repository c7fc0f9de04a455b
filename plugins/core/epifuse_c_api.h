// C ABI of libepifuse_core.so: lets the Python optimizer (ctypes), tests and benchmarks ask the
// kernel registry and run kernels without ONNX Runtime or TensorRT. Plain C types only, so it
// loads from any Python version. Every function returns 0 on success or a non-zero code, and
// writes a NUL-terminated message into `err` (size `err_len`) on failure.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 2: epifuse_cpu_fused_conv takes the kernel to run (oneDNN or the reference kernel).
// 3: epifuse_conv_desc ends with allow_tf32.
// 4: the CPU kernel codes name oneDNN and Winograd too; epifuse_cpu_kernel_name takes one.
// 5: the CPU kernel codes name the depthwise and gemv kernels.
#define EPIFUSE_ABI_VERSION 5
#define EPIFUSE_EXPORT __attribute__((visibility("default")))

// ONNX TensorProto element types used by the op contract.
enum { EPIFUSE_FLOAT = 1, EPIFUSE_FLOAT16 = 10, EPIFUSE_BFLOAT16 = 16 };
enum { EPIFUSE_RESIDUAL_NONE = 0, EPIFUSE_RESIDUAL_PRE = 1, EPIFUSE_RESIDUAL_POST = 2 };
// Which CPU kernel runs a problem: AUTO as the ORT library does (a direct kernel (Winograd, depthwise,
// gemv) or oneDNN, whichever is faster where both can run it, oneDNN where it has an optimized
// implementation, else the reference kernel); ONEDNN, WINOGRAD, DEPTHWISE and GEMV where they can (the
// AUTO order for the rest); REFERENCE everywhere.
enum { EPIFUSE_CPU_KERNEL_AUTO = 0, EPIFUSE_CPU_KERNEL_REFERENCE = 1, EPIFUSE_CPU_KERNEL_ONEDNN = 2,
       EPIFUSE_CPU_KERNEL_WINOGRAD = 3, EPIFUSE_CPU_KERNEL_DEPTHWISE = 4, EPIFUSE_CPU_KERNEL_GEMV = 5 };

// One FusedConv problem. N/H/W may be -1 (symbolic) when asking the registry.
typedef struct epifuse_conv_desc {
  int32_t dtype;                     // EPIFUSE_FLOAT / FLOAT16 / BFLOAT16
  int64_t N, H, W, C;                // input, NHWC
  int64_t K, R, S;                   // filter, KRSC (K x R x S x C/group)
  int64_t group;
  int64_t stride_h, stride_w;
  int64_t dil_h, dil_w;
  int64_t pad_top, pad_left, pad_bottom, pad_right;
  const char* activation;            // contract name: "relu", "silu", ...
  const float* activation_params;    // may be NULL when n_activation_params == 0
  int32_t n_activation_params;       // 0 means the contract's defaults
  int32_t residual;                  // EPIFUSE_RESIDUAL_*
  int32_t allow_tf32;                // 0 or 1: the node's allow_tf32 (float may compute in TF32)
} epifuse_conv_desc;

EPIFUSE_EXPORT int32_t epifuse_abi_version(void);

// Validates attributes and shapes against the op contract (activation name and parameter count,
// group divides C and K, positive strides/dilations, non-negative pads, P and Q >= 1 when H/W known).
EPIFUSE_EXPORT int32_t epifuse_validate(const epifuse_conv_desc* d, char* err, size_t err_len);

// Number of registered kernels for `target` ("ort-cpu", "ort-cuda", "tensorrt") that can run `d`.
// 0 means none; then `err` says why (e.g. "no kernel for dtype bfloat16 with group 3").
EPIFUSE_EXPORT int32_t epifuse_kernel_count(const char* target, const epifuse_conv_desc* d,
                                            char* err, size_t err_len);

// Names of the kernels for `target` that can run `d`, best first, comma-separated in `buf`
// (NUL-terminated, truncated to `len`). Returns their count; 0 means none and `buf` says why.
EPIFUSE_EXPORT int32_t epifuse_kernel_names(const char* target, const epifuse_conv_desc* d, char* buf,
                                            size_t len);

// The same for a device of compute capability `sm` (major*10+minor; 0: any) with `sm_count` SMs (0: not
// known, the heuristics assume an H200's 132): the order the CUDA library's untuned choice follows there.
EPIFUSE_EXPORT int32_t epifuse_kernel_names_on_device(const char* target, const epifuse_conv_desc* d, int32_t sm,
                                                      int32_t sm_count, char* buf, size_t len);

// Every kernel registered for `target`, in registry order, comma-separated in `buf` (NUL-terminated,
// truncated to `len`). Returns their count; -1 for an unknown target (`buf` says so).
EPIFUSE_EXPORT int32_t epifuse_registered_kernels(const char* target, char* buf, size_t len);

// Output spatial size by the contract's rule; returns -1 for a symbolic (-1) input size.
EPIFUSE_EXPORT int64_t epifuse_output_size(int64_t in, int64_t pad_begin, int64_t pad_end,
                                           int64_t dilation, int64_t kernel, int64_t stride);

// Enumerates the contract's activation table in its order (index from 0): the name, the number
// of activation_params it takes, and their defaults (`default_params` has room for 2; unused
// entries are 0). Returns non-zero past the end of the table. Lets tests check that the Python
// copy of the contract agrees with this one.
EPIFUSE_EXPORT int32_t epifuse_activation_info(int32_t index, const char** name, int32_t* n_params,
                                               float* default_params);

// Runs the CPU kernel on host buffers (NHWC X, KRSC W, B[K], optional Z (NULL), Y). Tensors are in
// d->dtype (uint16_t storage for float16/bfloat16). `kernel`: an EPIFUSE_CPU_KERNEL_* code.
// Used by tests and benchmarks.
EPIFUSE_EXPORT int32_t epifuse_cpu_fused_conv(const epifuse_conv_desc* d, int32_t kernel, const void* x,
                                              const void* w, const void* b, const void* z, void* y,
                                              char* err, size_t err_len);

// What `kernel` (an EPIFUSE_CPU_KERNEL_* code) runs `d` on (every dimension known), NUL-terminated into
// buf: "winograd F(2x2,3x3) avx512" (or avx2; "depthwise direct ..." and "gemv direct ..." likewise),
// "onednn <its implementation>" or "reference" (AUTO times the direct kernel against oneDNN as a first
// run would); and the oneDNN version built in ("" without oneDNN). Returns
// non-zero when buf is too small.
EPIFUSE_EXPORT int32_t epifuse_cpu_kernel_name(const epifuse_conv_desc* d, int32_t kernel, char* buf,
                                               size_t len);
EPIFUSE_EXPORT const char* epifuse_onednn_version(void);

#ifdef __cplusplus
}
#endif
