"""TensorRT: building an engine (plan) of an epifuse model with the FusedConv plugin (`build`), running
one (`run`) and `epifuse build-engine` (`cli`). Uses TensorRT's Python API: ``tensorrt`` (TensorRT
10/11), else the TensorRT-RTX pip bindings (``tensorrt_rtx_bindings``, which also build on a machine
without a GPU)."""
from ..libraries import TRT_LIBRARY
from .api import load_tensorrt
from .build import EngineReport, _profile_shapes, build_engine, parse_shapes
from .cli import add_build_engine_command
from .run import PlanRunner

__all__ = ["TRT_LIBRARY", "load_tensorrt", "EngineReport", "build_engine", "parse_shapes", "_profile_shapes",
           "add_build_engine_command", "PlanRunner"]
