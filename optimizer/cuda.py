"""ctypes wrapper of libepifuse_cuda.so: list the registry's CUDA kernels for a problem on the
current device and run one on device pointers (torch tensors, cupy arrays, ...). Used by the GPU
tests and benchmarks; the ORT and TensorRT adapters call the same kernels in C++."""
from __future__ import annotations

import ctypes
import functools

from . import registry
from .libraries import CUDA_LIBRARY, library_path

_ERR_LEN = 2048


class CudaKernelError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path(CUDA_LIBRARY)))
    desc_p = ctypes.POINTER(registry._CDesc)
    lib.epifuse_cuda_kernels.argtypes = [ctypes.c_char_p, desc_p, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_cuda_kernels.restype = ctypes.c_int32
    lib.epifuse_cuda_compiled_kernels.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_cuda_compiled_kernels.restype = ctypes.c_int32
    lib.epifuse_cuda_workspace_size.argtypes = [ctypes.c_char_p, desc_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_cuda_workspace_size.restype = ctypes.c_int64
    lib.epifuse_cuda_fused_conv.argtypes = [ctypes.c_char_p, desc_p, *[ctypes.c_void_p] * 6,  # x w b z y workspace
                                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_cuda_fused_conv.restype = ctypes.c_int32
    return lib


def kernels(desc: registry.ConvDesc, target: str = "ort-cuda") -> list[str]:
    """Kernels in this build that run `desc` on the current device, best first."""
    names, err = ctypes.create_string_buffer(8192), ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    n = _lib().epifuse_cuda_kernels(target.encode(), ctypes.byref(c), names, len(names), err, _ERR_LEN)
    if n < 0:
        raise CudaKernelError(err.value.decode())
    return names.value.decode().split(",") if n > 0 else []


def compiled_kernels() -> list[str]:
    """Every kernel implementation in this build of libepifuse_cuda.so (no GPU needed)."""
    names, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(_ERR_LEN)
    n = _lib().epifuse_cuda_compiled_kernels(names, len(names), err, _ERR_LEN)
    if n < 0:
        raise CudaKernelError(err.value.decode())
    return names.value.decode().split(",") if n > 0 else []


def workspace_size(kernel: str, desc: registry.ConvDesc) -> int:
    err = ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    n = _lib().epifuse_cuda_workspace_size(kernel.encode(), ctypes.byref(c), err, _ERR_LEN)
    if n < 0:
        raise CudaKernelError(err.value.decode())
    return n


def fused_conv(desc: registry.ConvDesc, x: int, w: int, b: int, z: int | None, y: int, *, kernel: str | None = None,
               workspace: int | None = None, workspace_bytes: int = 0, stream: int | None = None) -> None:
    """Launches `kernel` (None: the registry's choice) on device pointers; asynchronous."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    rc = _lib().epifuse_cuda_fused_conv(kernel.encode() if kernel else None, ctypes.byref(c), x, w, b, z, y,
                                        workspace, workspace_bytes, stream, err, _ERR_LEN)
    if rc != 0:
        raise CudaKernelError(err.value.decode())
