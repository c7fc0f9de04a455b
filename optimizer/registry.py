"""ctypes wrapper of libepifuse_core.so: the kernel registry ("is there a kernel for this
case on this target?"), the contract's validation and shape rule, and the CPU kernel.

The fuse pass calls :func:`kernel_count` once per candidate node, so the library is loaded once.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .contract import BFLOAT16, FLOAT, FLOAT16, TARGETS  # noqa: F401 (re-exported: the ABI's values)
from .contract import RESIDUAL_MODES as _RESIDUALS
from .libraries import CORE_LIBRARY, LibraryNotFound, library_path

RESIDUAL_MODES = {mode: i for i, mode in enumerate(_RESIDUALS)}
_ERR_LEN = 1024


class _CDesc(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        *[(f, ctypes.c_int64) for f in ("N", "H", "W", "C", "K", "R", "S", "group", "stride_h", "stride_w",
                                         "dil_h", "dil_w", "pad_top", "pad_left", "pad_bottom", "pad_right")],
        ("activation", ctypes.c_char_p),
        ("activation_params", ctypes.POINTER(ctypes.c_float)),
        ("n_activation_params", ctypes.c_int32),
        ("residual", ctypes.c_int32),
        ("allow_tf32", ctypes.c_int32),
    ]


def _dim(v) -> int:
    """-1 for a symbolic or unknown dimension (None, a name, or a negative number)."""
    return int(v) if isinstance(v, (int, np.integer)) and v >= 0 else -1


@dataclass(frozen=True)
class ConvDesc:
    """One FusedConv problem, mirroring ``epifuse_conv_desc``. Dimensions are -1 when unknown."""

    dtype: int = FLOAT
    N: int = -1
    H: int = -1
    W: int = -1
    C: int = -1
    K: int = -1
    R: int = -1
    S: int = -1
    group: int = 1
    stride_h: int = 1
    stride_w: int = 1
    dil_h: int = 1
    dil_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    pad_bottom: int = 0
    pad_right: int = 0
    activation: str = "identity"
    activation_params: tuple[float, ...] = ()  # empty: the contract's defaults
    residual: str = "none"
    allow_tf32: int = 0  # 1: a float problem may compute in TF32 on the tensor cores

    @classmethod
    def from_attributes(cls, dtype: int, x_shape: Sequence, w_shape: Sequence, *, strides=(1, 1),
                        pads=(0, 0, 0, 0), dilations=(1, 1), group=1, activation="identity",
                        activation_params=(), residual="none", allow_tf32=0) -> "ConvDesc":
        """From FusedConv node attributes and the NHWC input / KRSC filter shapes (entries may
        be symbolic: None or a name)."""
        n, h, w, c = (_dim(v) for v in x_shape)
        k, r, s = (_dim(v) for v in w_shape[:3])
        return cls(dtype, n, h, w, c, k, r, s, int(group), int(strides[0]), int(strides[1]),
                   int(dilations[0]), int(dilations[1]), *(int(p) for p in pads),
                   activation, tuple(float(a) for a in activation_params), residual, int(allow_tf32))

    def output_nhwc(self) -> tuple[int, int, int, int]:
        """Y's shape [N, P, Q, K], by the contract's output size rule."""
        p = output_size(self.H, self.pad_top, self.pad_bottom, self.dil_h, self.R, self.stride_h)
        q = output_size(self.W, self.pad_left, self.pad_right, self.dil_w, self.S, self.stride_w)
        return self.N, p, q, self.K

    def _to_c(self) -> _CDesc:
        if self.residual not in RESIDUAL_MODES:
            raise ValueError(f"unknown residual {self.residual!r} (expected none, pre or post)")
        params = (ctypes.c_float * max(1, len(self.activation_params)))(*self.activation_params)
        c = _CDesc(self.dtype, self.N, self.H, self.W, self.C, self.K, self.R, self.S, self.group,
                   self.stride_h, self.stride_w, self.dil_h, self.dil_w, self.pad_top, self.pad_left,
                   self.pad_bottom, self.pad_right, self.activation.encode(),
                   ctypes.cast(params, ctypes.POINTER(ctypes.c_float)), len(self.activation_params),
                   RESIDUAL_MODES[self.residual], self.allow_tf32)
        c._keep = params  # the struct points into it
        return c


ABI_VERSION = 5  # plugins/core/epifuse_c_api.h's EPIFUSE_ABI_VERSION, which these bindings are written for


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    path = library_path(CORE_LIBRARY)
    lib = ctypes.CDLL(str(path))
    desc_p, err = ctypes.POINTER(_CDesc), (ctypes.c_char_p, ctypes.c_size_t)
    lib.epifuse_abi_version.restype = ctypes.c_int32
    if lib.epifuse_abi_version() != ABI_VERSION:  # a call with the wrong signature could crash the process
        raise LibraryNotFound(f"{path} has C ABI {lib.epifuse_abi_version()}, this epifuse needs {ABI_VERSION}: "
                              "rebuild it (`pip install .`, or cmake --build your build folder)")
    lib.epifuse_validate.argtypes = [desc_p, *err]
    lib.epifuse_validate.restype = ctypes.c_int32
    lib.epifuse_kernel_count.argtypes = [ctypes.c_char_p, desc_p, *err]
    lib.epifuse_kernel_count.restype = ctypes.c_int32
    lib.epifuse_kernel_names.argtypes = [ctypes.c_char_p, desc_p, *err]
    lib.epifuse_kernel_names.restype = ctypes.c_int32
    lib.epifuse_kernel_names_on_device.argtypes = [ctypes.c_char_p, desc_p, ctypes.c_int32, ctypes.c_int32,
                                                    ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_kernel_names_on_device.restype = ctypes.c_int32
    lib.epifuse_registered_kernels.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_registered_kernels.restype = ctypes.c_int32
    lib.epifuse_output_size.argtypes = [ctypes.c_int64] * 6
    lib.epifuse_output_size.restype = ctypes.c_int64
    lib.epifuse_activation_info.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p),
                                            ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)]
    lib.epifuse_activation_info.restype = ctypes.c_int32
    lib.epifuse_cpu_fused_conv.argtypes = [desc_p, ctypes.c_int32, *[ctypes.c_void_p] * 5, *err]
    lib.epifuse_cpu_fused_conv.restype = ctypes.c_int32
    lib.epifuse_cpu_kernel_name.argtypes = [desc_p, ctypes.c_int32, *err]
    lib.epifuse_cpu_kernel_name.restype = ctypes.c_int32
    lib.epifuse_onednn_version.argtypes = []
    lib.epifuse_onednn_version.restype = ctypes.c_char_p
    return lib


def abi_version() -> int:
    return _lib().epifuse_abi_version()


def kernel_count(target: str, desc: ConvDesc) -> tuple[int, str]:
    """How many kernels on `target` ("ort-cpu", "ort-cuda", "tensorrt") can run `desc`;
    when none, the reason."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    n = _lib().epifuse_kernel_count(target.encode(), ctypes.byref(c), err, _ERR_LEN)
    return n, err.value.decode() if n == 0 else ""


def kernel_names(target: str, desc: ConvDesc, sm: int = 0, sm_count: int = 0) -> list[str]:
    """Names of the kernels on `target` that can run `desc`, best first (empty when none); `sm` and
    `sm_count`: the device's compute capability (major*10+minor) and SM count, 0 where not known."""
    buf = ctypes.create_string_buffer(1 << 16)
    c = desc._to_c()
    n = _lib().epifuse_kernel_names_on_device(target.encode(), ctypes.byref(c), sm, sm_count, buf, len(buf))
    return buf.value.decode().split(",") if n > 0 else []


def registered_kernels(target: str) -> list[str]:
    """Every kernel the registry has for `target`, in registry order (problem or no problem)."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = _lib().epifuse_registered_kernels(target.encode(), buf, len(buf))
    if n < 0:
        raise ValueError(buf.value.decode())
    return buf.value.decode().split(",") if n > 0 else []


def validate(desc: ConvDesc) -> None:
    """Raises ValueError with the contract violation, if any."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    if _lib().epifuse_validate(ctypes.byref(c), err, _ERR_LEN) != 0:
        raise ValueError(err.value.decode())


def output_size(size: int, pad_begin: int, pad_end: int, dilation: int, kernel: int, stride: int) -> int:
    """The contract's output size rule; -1 for a symbolic (-1) input size."""
    return _lib().epifuse_output_size(size, pad_begin, pad_end, dilation, kernel, stride)


def activations() -> dict[str, tuple[float, ...]]:
    """The library's activation table: name -> default parameters (their count is fixed)."""
    table = {}
    name, count, defaults = ctypes.c_char_p(), ctypes.c_int32(), (ctypes.c_float * 2)()
    i = 0
    while _lib().epifuse_activation_info(i, ctypes.byref(name), ctypes.byref(count), defaults) == 0:
        table[name.value.decode()] = tuple(float(defaults[j]) for j in range(count.value))
        i += 1
    return table


def _onnx_dtype(dtype: np.dtype) -> int:
    if dtype == np.float32:
        return FLOAT
    if dtype == np.float16:
        return FLOAT16
    if dtype.name == "bfloat16":  # ml_dtypes.bfloat16, without importing it here
        return BFLOAT16
    raise TypeError(f"unsupported dtype {dtype} (expected float32, float16 or bfloat16)")


CPU_KERNELS = ("auto", "reference", "onednn", "winograd", "depthwise", "gemv")  # epifuse_c_api.h's EPIFUSE_CPU_KERNEL_* order


def cpu_kernel_name(desc: ConvDesc, kernel: str = "auto") -> str:
    """What the CPU kernel runs `desc` on: "winograd F(2x2,3x3) avx512", "depthwise direct avx512",
    "gemv direct avx512", "onednn <oneDNN's implementation>" or "reference". `kernel` as for cpu_fused_conv;
    "auto" times the direct kernel (Winograd, depthwise or gemv) against oneDNN where both can run `desc`, as
    the first run does."""
    if kernel not in CPU_KERNELS:
        raise ValueError(f"kernel must be one of {CPU_KERNELS}, got {kernel!r}")
    buf = ctypes.create_string_buffer(_ERR_LEN)
    if _lib().epifuse_cpu_kernel_name(ctypes.byref(desc._to_c()), CPU_KERNELS.index(kernel), buf, _ERR_LEN) != 0:
        raise ValueError(buf.value.decode())
    return buf.value.decode()


def onednn_version() -> str:
    """The oneDNN version the library was built with ("" for a build without oneDNN)."""
    return _lib().epifuse_onednn_version().decode()


def cpu_fused_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, z: np.ndarray | None = None, *,
                   strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
                   activation="identity", activation_params=(), residual="none", kernel: str = "auto") -> np.ndarray:
    """Runs the library's CPU kernel: X [N,H,W,C], W [K,R,S,C/group], B [K], Z [N,P,Q,K] (all
    of one dtype: float32, float16 or ml_dtypes.bfloat16) -> Y [N,P,Q,K]. `kernel`: "auto" as the ORT
    library runs it (a direct kernel — Winograd for 3x3 stride-1 convs, depthwise for depthwise ones, gemv
    for 1x1 convs on a few pixels — or oneDNN, whichever is faster where both can, oneDNN where it has an
    optimized implementation, else the reference kernel); "onednn", "winograd", "depthwise" or "gemv" that
    kernel where it can run the problem (as "auto" elsewhere); "reference" the reference kernel."""
    if kernel not in CPU_KERNELS:
        raise ValueError(f"kernel must be one of {CPU_KERNELS}, got {kernel!r}")
    dtype = _onnx_dtype(x.dtype)
    arrays = [np.ascontiguousarray(a) for a in (x, w, b)] + ([np.ascontiguousarray(z)] if z is not None else [])
    if any(a.dtype != x.dtype for a in arrays):
        raise TypeError("X, W, B and Z must share one dtype")
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"X and W must be 4-D, got {x.shape} and {w.shape}")
    desc = ConvDesc.from_attributes(dtype, x.shape, w.shape, strides=strides, pads=pads, dilations=dilations,
                                    group=group, activation=activation, activation_params=activation_params,
                                    residual=residual)
    validate(desc)
    if w.shape[3] * group != x.shape[3] or b.shape != (w.shape[0],):
        raise ValueError(f"W {w.shape} / B {b.shape} do not match X {x.shape} with group {group}")
    y_shape = desc.output_nhwc()
    if z is not None and z.shape != y_shape:
        raise ValueError(f"Z must have shape {y_shape}, got {z.shape}")
    y = np.empty(y_shape, dtype=x.dtype)
    err = ctypes.create_string_buffer(_ERR_LEN)
    c = desc._to_c()
    ptrs = [a.ctypes.data for a in arrays[:3]] + [arrays[3].ctypes.data if z is not None else None]
    if _lib().epifuse_cpu_fused_conv(ctypes.byref(c), CPU_KERNELS.index(kernel), *ptrs, y.ctypes.data, err,
                                     _ERR_LEN) != 0:
        raise ValueError(err.value.decode())
    return y
