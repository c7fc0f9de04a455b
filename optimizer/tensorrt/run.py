"""Running a TensorRT plan built by `epifuse build-engine`, with the plugin library loaded."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import EpifuseError
from ..libraries import TRT_LIBRARY, library_path
from .api import Logger, load_tensorrt, plugin_registry_with_library


class PlanRunner:
    """Runs a serialized engine (.plan) with the plugin library loaded: device tensors from torch,
    enqueue on a stream, synchronise. `run(feeds)` takes numpy arrays by input name and returns
    numpy outputs by name; `run_device()` replays the last bound buffers (for timing)."""

    _DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
               "BOOL": "bool", "INT8": "int8", "UINT8": "uint8"}

    def __init__(self, plan: str | os.PathLike, plugin_library: str | None = None):
        trt = load_tensorrt()
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            raise EpifuseError("running a plan needs torch with CUDA for device buffers") from None
        if not torch.cuda.is_available():
            raise EpifuseError("running a plan needs an NVIDIA GPU (no CUDA device found)")
        if not os.path.isfile(plan):
            raise EpifuseError("no such file", path=str(plan))
        self.trt, self.torch = trt, torch
        plugin_registry_with_library(trt, Path(plugin_library) if plugin_library else library_path(TRT_LIBRARY))
        self.log = Logger(trt, verbose=False)  # kept: TensorRT holds a reference to the logger
        self.runtime = trt.Runtime(self.log.logger)
        with open(plan, "rb") as f:
            self.engine = self.runtime.deserialize_cuda_engine(f.read())
        if self.engine is None:
            raise EpifuseError("TensorRT could not deserialize the plan (see the TensorRT errors above)",
                               path=str(plan))
        self.context = self.engine.create_execution_context()
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.stream = torch.cuda.Stream()
        self.buffers: dict = {}

    def _torch_dtype(self, name: str):
        return getattr(self.torch, self._DTYPES[self.engine.get_tensor_dtype(name).name])

    def bind(self, feeds: dict) -> None:
        torch = self.torch
        for name in self.inputs:
            if name not in feeds:
                raise EpifuseError(f"the plan's input '{name}' is not given")
            t = torch.from_numpy(feeds[name]).to("cuda", self._torch_dtype(name)).contiguous()
            self.context.set_input_shape(name, tuple(t.shape))
            self.buffers[name] = t
        for name in self.names:
            if name not in self.inputs:
                self.buffers[name] = torch.empty(tuple(self.context.get_tensor_shape(name)), device="cuda",
                                                 dtype=self._torch_dtype(name))
        for name, t in self.buffers.items():
            self.context.set_tensor_address(name, t.data_ptr())

    def run_device(self) -> None:
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise EpifuseError("TensorRT failed to enqueue the plan (see the TensorRT errors above)")
        self.stream.synchronize()

    def run(self, feeds: dict) -> dict:
        self.bind(feeds)
        self.run_device()
        return {n: self.buffers[n].float().cpu().numpy() for n in self.names if n not in self.inputs}
