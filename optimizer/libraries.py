"""Where the epifuse plugin libraries are: $EPIFUSE_LIB_DIR, the installed package's ``optimizer/lib``,
then a local CMake build in ``build/`` at the repository root. A leaf module: everything that loads a
library (runtime, registry, cuda, tensorrt) asks here."""
from __future__ import annotations

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


def library_path(name: str = ORT_LIBRARY) -> Path:
    """Absolute path of an epifuse plugin library (``libepifuse_ort.so`` or ``libepifuse_core.so``)."""
    candidates = _candidates(name)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    searched = "; ".join(str(p) for p in candidates)
    raise LibraryNotFound(
        f"{name} not found: build it with `pip install .` in the repository (or `cmake -S plugins -B build "
        f"&& cmake --build build`), or set EPIFUSE_LIB_DIR (searched: {searched})")
