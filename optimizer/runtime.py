"""Opening epifuse models on ONNX Runtime (the plugin libraries are found by optimizer.libraries)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import EpifuseError
from .libraries import CORE_LIBRARY, ORT_LIBRARY, LibraryNotFound, library_path  # noqa: F401 (re-exported)


def cpu_cores() -> int:
    """The cores this process may run on (ONNX Runtime's default intra-op threads are at most these)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads(threads: int | None, target: str) -> int | None:
    """`threads` checked as an ort-cpu intra-op thread count (None: ONNX Runtime's default)."""
    if threads is not None and (target != "ort-cpu" or threads < 1):
        raise EpifuseError(f"a thread count (--threads) is for ort-cpu and at least 1: got {threads} for {target}")
    return threads


def session_options(allow_spinning: bool = True, threads: int | None = None, **opts):
    """``ort.SessionOptions`` with the epifuse custom-op library registered; keyword arguments
    set attributes of the options (e.g. ``inter_op_num_threads=2``). ``threads``: the intra-op
    threads (None: ONNX Runtime's default, one per core). ``allow_spinning=False`` keeps the thread
    pools from spinning after a run (for timing two sessions in turn)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path(ORT_LIBRARY)))
    if threads is not None:
        so.intra_op_num_threads = threads
    if not allow_spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    for key, value in opts.items():
        if not hasattr(so, key):
            raise AttributeError(f"onnxruntime.SessionOptions has no attribute {key!r}")
        setattr(so, key, value)
    return so


BACKENDS = ("ort-cpu", "ort-cuda")


def providers_for(backend: str, *, cuda_graph: bool = False, prefer_nhwc: bool = False, device_id: int = 0):
    """ONNX Runtime providers for a backend; for ort-cuda the CUDA EP (with CPU for what it lacks)."""
    if backend == "ort-cpu":
        return ["CPUExecutionProvider"]
    if backend != "ort-cuda":
        raise ValueError(f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA 13 libraries torch's or nvidia-* wheels bring
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise EpifuseError("this onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu, or use "
                           "--backend ort-cpu")
    options = {"device_id": str(device_id), "enable_cuda_graph": "1" if cuda_graph else "0",
               "prefer_nhwc": "1" if prefer_nhwc else "0"}
    return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]


def create_session(model, providers=None, backend: str | None = None, cuda_graph: bool = False,
                   prefer_nhwc: bool = False, **opts):
    """Opens an epifuse model (a path, or the serialized bytes) on ONNX Runtime with the
    custom-op library registered, on `backend` ("ort-cpu" or "ort-cuda"; default: `providers`,
    else the CPU). ``prefer_nhwc`` lets the CUDA EP run the ops between FusedConv regions (MaxPool,
    Resize) in NHWC too: faster at large batch, a few percent slower at batch 1 (docs/bench-models.md).
    ``opts`` go to :func:`session_options`."""
    import onnxruntime as ort

    if isinstance(model, Path):
        model = str(model)
    if backend is not None:
        providers = providers_for(backend, cuda_graph=cuda_graph, prefer_nhwc=prefer_nhwc)
    return ort.InferenceSession(model, session_options(**opts),
                                providers=providers or ["CPUExecutionProvider"])


def bind_torch(session, inputs: dict, outputs: dict):
    """An IOBinding that reads and writes CUDA torch tensors in place (no host copies): what
    CUDA-graph replay needs, since the graph keeps the addresses it captured."""
    import numpy as np
    import torch

    numpy_of = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32}
    binding = session.io_binding()
    for group, bind in ((inputs, binding.bind_input), (outputs, binding.bind_output)):
        for name, t in group.items():
            if not t.is_contiguous():
                raise ValueError(f"tensor '{name}' must be contiguous")
            bind(name, "cuda", t.device.index or 0, numpy_of[t.dtype], list(t.shape), t.data_ptr())
    return binding


def open_plan(plan, plugin_library: str | None = None):
    """A TensorRT engine built by `epifuse build-engine`, ready to run (`.run(feeds) -> outputs`),
    with the plugin library loaded. Needs TensorRT's Python API, torch and an NVIDIA GPU."""
    from .tensorrt import PlanRunner

    return PlanRunner(plan, plugin_library)
