"""Where the epifuse plugin libraries are: $EPIFUSE_LIB_DIR, the installed package's ``optimizer/lib``,
then a local CMake build in ``build/`` at the repository root. A leaf module: everything that loads a
library (runtime, registry, cuda, tensorrt) asks here."""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
from pathlib import Path

from .errors import EpifuseError

ORT_LIBRARY = "libepifuse_ort.so"
CORE_LIBRARY = "libepifuse_core.so"
CUDA_LIBRARY = "libepifuse_cuda.so"
TRT_LIBRARY = "libepifuse_trt.so"  # the loadLibrary variant (getCreators/setLoggerFinder)

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


class LibraryNotFound(EpifuseError, FileNotFoundError):
    """A plugin library is missing: one line from the CLI (an EpifuseError), a FileNotFoundError to code."""


@functools.cache
def preload_onednn() -> Path | None:
    """Loads the onednn-cpu-gomp wheel's libdnnl.so.3 into the process, so the plugin libraries that need
    it resolve it by name wherever pip put it (their RUNPATH covers only the usual <prefix>/lib layout).
    Returns its path, or None where the package is absent (a build without oneDNN needs none)."""
    try:
        files = importlib.metadata.distribution("onednn-cpu-gomp").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libdnnl.so.3":
            path = Path(f.locate()).resolve()
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return None
            return path
    return None


def library_path(name: str = ORT_LIBRARY) -> Path:
    """Absolute path of an epifuse plugin library (``libepifuse_ort.so`` or ``libepifuse_core.so``); oneDNN,
    which they link, is loaded first."""
    candidates = _candidates(name)
    for path in candidates:
        if path.is_file():
            preload_onednn()
            return path.resolve()
    searched = "; ".join(str(p) for p in candidates)
    raise LibraryNotFound(
        f"{name} not found: build it with `pip install .` in the repository (or `cmake -S plugins -B build "
        f"&& cmake --build build`), or set EPIFUSE_LIB_DIR (searched: {searched})")
