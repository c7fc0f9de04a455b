"""TensorRT's Python API, whichever is installed (TensorRT 10/11 or the TensorRT-RTX bindings), its
logger and the plugin registry with the epifuse plugin library loaded: what building and running share."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from ..contract import OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION
from ..errors import EpifuseError


def load_tensorrt():
    """TensorRT's Python module, or EpifuseError saying what to install."""
    for name in ("tensorrt", "tensorrt_rtx_bindings"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        # a folder of that name on sys.path imports as an empty namespace package: not TensorRT
        if hasattr(module, "Builder"):
            return module
    raise EpifuseError("TensorRT's Python API is not installed: `pip install tensorrt` (TensorRT 10/11, "
                       "building needs an NVIDIA GPU) or `pip install tensorrt-rtx-cu13-bindings "
                       "tensorrt-rtx-cu13-libs` (TensorRT-RTX)")


def is_rtx(trt) -> bool:
    return trt.__name__.startswith("tensorrt_rtx")


def check_rtx_parser_can_load(trt) -> None:
    """TensorRT-RTX's ONNX parser dlopen()s the unversioned libtensorrt_rtx.so for plugin layers and
    aborts the process when it is missing; the pip wheel ships only libtensorrt_rtx.so.1."""
    try:
        ctypes.CDLL("libtensorrt_rtx.so")
    except OSError:
        import tensorrt_rtx_libs  # noqa: PLC0415

        libs = Path(tensorrt_rtx_libs.__file__).parent
        raise EpifuseError(
            "TensorRT-RTX's ONNX parser needs an unversioned libtensorrt_rtx.so on LD_LIBRARY_PATH when the "
            f"process starts: mkdir DIR && ln -s {libs}/libtensorrt_rtx.so.1 DIR/libtensorrt_rtx.so && "
            "export LD_LIBRARY_PATH=DIR:$LD_LIBRARY_PATH") from None


class Logger:
    """A TensorRT logger that keeps errors (for the exception) and prints warnings and worse."""

    def __init__(self, trt, verbose: bool):
        outer = self
        self.errors: list[str] = []

        class Logger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                if int(severity) <= int(trt.ILogger.Severity.ERROR):
                    outer.errors.append(msg)
                if verbose or int(severity) <= int(trt.ILogger.Severity.WARNING):
                    print(f"[TensorRT {str(severity).rsplit('.', 1)[-1]}] {msg}", file=sys.stderr)

        self.logger = Logger()


def plugin_registry_with_library(trt, library: Path):
    registry = trt.get_plugin_registry()
    found = any(c.name == OP_TYPE and c.plugin_namespace == PLUGIN_NAMESPACE and c.plugin_version == PLUGIN_VERSION
                for c in registry.all_creators)
    if not found and registry.load_library(str(library)) is None:
        raise EpifuseError("TensorRT could not load the plugin library (see the TensorRT errors above)",
                           path=str(library))
    return registry
