// C ABI of libepifuse_cuda.so: run the registry's CUDA kernels on device pointers without ONNX
// Runtime or TensorRT (tests, benchmarks, other hosts). Same conventions as epifuse_c_api.h:
// 0 on success, else non-zero with a NUL-terminated message in `err`.
#pragma once
#include "epifuse_c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// Kernels of `target` ("ort-cuda" or "tensorrt") that can run `d` on the current device and are
// compiled into this library, best first, as a comma-separated list in `names`. Returns the count
// (0: none, reason in `err`), or -1 on an error.
EPIFUSE_EXPORT int32_t epifuse_cuda_kernels(const char* target, const epifuse_conv_desc* d, char* names,
                                            size_t names_len, char* err, size_t err_len);

// Every kernel implementation compiled into this library (with or without a GPU), comma-separated
// in `names`. Returns their count, or -1 when `names` is too small (`err` says so).
EPIFUSE_EXPORT int32_t epifuse_cuda_compiled_kernels(char* names, size_t names_len, char* err, size_t err_len);

// Workspace bytes kernel `kernel` needs for `d` (-1 with `err` set for an unknown kernel).
EPIFUSE_EXPORT int64_t epifuse_cuda_workspace_size(const char* kernel, const epifuse_conv_desc* d, char* err,
                                                   size_t err_len);

// Runs `kernel` (NULL: the registry's first choice) on `stream` (a cudaStream_t; NULL for the
// default stream). z is NULL when d->residual is none. Asynchronous: returns after the launch.
EPIFUSE_EXPORT int32_t epifuse_cuda_fused_conv(const char* kernel, const epifuse_conv_desc* d, const void* x,
                                               const void* w, const void* b, const void* z, void* y,
                                               void* workspace, size_t workspace_bytes, void* stream,
                                               char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
