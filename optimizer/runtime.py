"""Locating the epifuse plugin libraries and opening epifuse models on ONNX Runtime.

Search order for a library: $EPIFUSE_LIB_DIR, the installed package's ``optimizer/lib``, then a
local CMake build in ``build/`` at the repository root.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

ORT_LIBRARY = "libepifuse_ort.so"
CORE_LIBRARY = "libepifuse_core.so"

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _candidates(name: str) -> list[Path]:
    found = []
    if os.environ.get("EPIFUSE_LIB_DIR"):
        found.append(Path(os.environ["EPIFUSE_LIB_DIR"]) / name)
    # When the repository root is on sys.path, `optimizer` is the source tree, which has no
    # lib/; the installed distribution's copy is then found through its metadata.
    found.append(Path(__file__).resolve().parent / "lib" / name)
    try:
        found.append(Path(importlib.metadata.distribution("epifuse").locate_file(f"optimizer/lib/{name}")))
    except importlib.metadata.PackageNotFoundError:
        pass
    found.append(_REPO_ROOT / "build" / name)
    return found


def library_path(name: str = ORT_LIBRARY) -> Path:
    """Absolute path of an epifuse plugin library (``libepifuse_ort.so`` or ``libepifuse_core.so``)."""
    candidates = _candidates(name)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    searched = "\n  ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"{name} not found. Build it with `pip install .` in the repository (or "
        f"`cmake -S plugins -B build && cmake --build build`), or set EPIFUSE_LIB_DIR. Searched:\n  {searched}"
    )


def session_options(**opts):
    """``ort.SessionOptions`` with the epifuse custom-op library registered; keyword arguments
    set attributes of the options (e.g. ``intra_op_num_threads=2``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path(ORT_LIBRARY)))
    for key, value in opts.items():
        if not hasattr(so, key):
            raise AttributeError(f"onnxruntime.SessionOptions has no attribute {key!r}")
        setattr(so, key, value)
    return so


def create_session(model, providers=None, **opts):
    """Opens an epifuse model (a path, or the serialized bytes) on ONNX Runtime with the
    custom-op library registered. ``opts`` go to :func:`session_options`."""
    import onnxruntime as ort

    if isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, session_options(**opts),
                                providers=providers or ["CPUExecutionProvider"])
