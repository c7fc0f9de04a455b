"""`epifuse build-engine`: a TensorRT engine (plan) of an epifuse model, with the FusedConv plugin.

Uses TensorRT's Python API: ``tensorrt`` (TensorRT 10/11), else the TensorRT-RTX pip bindings
(``tensorrt_rtx_bindings``, which also build on a machine without a GPU). The network is strongly
typed, so precision comes from the model (TensorRT 11 has no fp16 flag); dynamic inputs get one
optimization profile from ``--min/--opt/--max``.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from . import runtime
from .contract import OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION
from .errors import EpifuseError

TRT_LIBRARY = "libepifuse_trt.so"  # the loadLibrary variant (getCreators/setLoggerFinder)


def load_tensorrt():
    """TensorRT's Python module, or EpifuseError saying what to install."""
    try:
        import tensorrt  # noqa: PLC0415

        return tensorrt
    except ImportError:
        pass
    try:
        import tensorrt_rtx_bindings  # noqa: PLC0415

        return tensorrt_rtx_bindings
    except ImportError:
        pass
    raise EpifuseError("TensorRT's Python API is not installed: `pip install tensorrt` (TensorRT 10/11, "
                       "building needs an NVIDIA GPU) or `pip install tensorrt-rtx-cu13-bindings "
                       "tensorrt-rtx-cu13-libs` (TensorRT-RTX)")


def is_rtx(trt) -> bool:
    return trt.__name__.startswith("tensorrt_rtx")


def _check_rtx_parser_can_load(trt) -> None:
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


class _Logger:
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


Shape = tuple[int, ...]


def parse_shapes(text: str | None) -> dict[str, Shape]:
    """``name:1x3x224x224,other:4x16`` (trtexec's spelling) -> {name: shape}."""
    shapes: dict[str, Shape] = {}
    for item in filter(None, (text or "").split(",")):
        name, sep, dims = item.rpartition(":")
        if not sep or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise EpifuseError(f"bad shape {item!r} (expected NAME:DxDx..., e.g. input:1x3x224x224)")
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes


def _profile_shapes(inputs: dict[str, Shape], min_s, opt_s, max_s) -> dict[str, tuple[Shape, Shape, Shape]]:
    """min/opt/max per dynamic input; a missing one of the three takes opt's (or the given) value."""
    for name in {*min_s, *opt_s, *max_s} - set(inputs):
        raise EpifuseError(f"--min/--opt/--max name input '{name}', which the network does not have "
                           f"(inputs: {', '.join(inputs)})")
    profile = {}
    for name, shape in inputs.items():
        given = [s.get(name) for s in (min_s, opt_s, max_s)]
        if all(d >= 0 for d in shape):
            for s in filter(None, given):
                if s != shape:
                    raise EpifuseError(f"input '{name}' has the fixed shape {shape}, not {s}")
            continue
        if not any(given):
            raise EpifuseError(f"input '{name}' has dynamic shape {shape}: give its shapes with "
                               f"--min/--opt/--max {name}:{'x'.join(str(max(d, 1)) for d in shape)}")
        opt = given[1] or given[2] or given[0]
        lo, hi = given[0] or opt, given[2] or opt
        for s in (lo, opt, hi):
            if len(s) != len(shape) or any(d >= 0 and d != v for d, v in zip(shape, s)):
                raise EpifuseError(f"shape {s} does not fit input '{name}' of shape {shape}")
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise EpifuseError(f"input '{name}': need min <= opt <= max, got {lo}, {opt}, {hi}")
        profile[name] = (lo, opt, hi)
    return profile


@dataclass
class EngineReport:
    plan: str
    plan_bytes: int
    tensorrt: str
    fused_conv_nodes: int
    plugin_layers: int
    profile: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)  # the network's: [[name, shape, dtype]]
    layers: list = field(default_factory=list)  # [{name, type, inputs: [...], outputs: [...]}]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _plugin_registry_with_library(trt, library: Path):
    registry = trt.get_plugin_registry()
    found = any(c.name == OP_TYPE and c.plugin_namespace == PLUGIN_NAMESPACE and c.plugin_version == PLUGIN_VERSION
                for c in registry.all_creators)
    if not found and registry.load_library(str(library)) is None:
        raise EpifuseError("TensorRT could not load the plugin library (see the TensorRT errors above)",
                           path=str(library))
    return registry


def build_engine(model: str | os.PathLike, output: str | os.PathLike, *, min_shapes: dict | None = None,
                 opt_shapes: dict | None = None, max_shapes: dict | None = None, timing_cache: str | None = None,
                 plugin_library: str | None = None, verbose: bool = False) -> EngineReport:
    """Parses `model` (an epifuse .onnx) with the plugin library loaded and writes the plan to `output`."""
    trt = load_tensorrt()
    if is_rtx(trt):
        _check_rtx_parser_can_load(trt)
    if not os.path.isfile(model):
        raise EpifuseError("no such file", path=str(model))
    library = Path(plugin_library) if plugin_library else runtime.library_path(TRT_LIBRARY)
    log = _Logger(trt, verbose)
    builder = trt.Builder(log.logger)
    _plugin_registry_with_library(trt, library)

    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # the only mode in TensorRT 11
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, log.logger)
    if not parser.parse_from_file(str(model)):
        errors = "; ".join(f"node '{parser.get_error(i).node_name()}': {parser.get_error(i).desc()}"
                           for i in range(parser.num_errors))
        raise EpifuseError(f"TensorRT's ONNX parser failed: {errors}", path=str(model))

    config = builder.create_builder_config()
    inputs = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
    profile = _profile_shapes(inputs, min_shapes or {}, opt_shapes or {}, max_shapes or {})
    if profile:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    if timing_cache:
        data = Path(timing_cache).read_bytes() if os.path.isfile(timing_cache) else b""
        cache = config.create_timing_cache(data)
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            raise EpifuseError("TensorRT refused the timing cache (another TensorRT version or device?)",
                               path=timing_cache)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EpifuseError("TensorRT could not build the engine: " + ("; ".join(log.errors) or "no reason logged"),
                           path=str(model))
    Path(output).write_bytes(bytes(plan))
    if timing_cache:
        Path(timing_cache).write_bytes(bytes(config.get_timing_cache().serialize()))

    def describe(t):
        return [t.name, list(t.shape), str(t.dtype).rsplit(".", 1)[-1]]

    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        ins = [layer.get_input(j) for j in range(layer.num_inputs)]
        layers.append(dict(name=layer.name, type=str(layer.type).rsplit(".", 1)[-1],
                           inputs=[describe(t) for t in ins if t is not None],
                           outputs=[describe(layer.get_output(j)) for j in range(layer.num_outputs)]))
    fused = sum(n.op_type == OP_TYPE for n in onnx.load(str(model), load_external_data=False).graph.node)
    return EngineReport(plan=str(output), plan_bytes=plan.nbytes, tensorrt=f"{trt.__name__} {trt.__version__}",
                        fused_conv_nodes=fused, plugin_layers=sum(lay["type"] == "PLUGIN_V3" for lay in layers),
                        profile={k: [list(s) for s in v] for k, v in profile.items()},
                        outputs=[describe(network.get_output(i)) for i in range(network.num_outputs)], layers=layers)


# ------------------------------------------------------------------------------------- CLI
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
        _plugin_registry_with_library(trt, Path(plugin_library) if plugin_library else
                                      runtime.library_path(TRT_LIBRARY))
        self.log = _Logger(trt, verbose=False)  # kept: TensorRT holds a reference to the logger
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


def add_build_engine_command(sub) -> None:
    p = sub.add_parser("build-engine", help="build a TensorRT engine (plan) of an epifuse model")
    p.add_argument("model")
    p.add_argument("-o", "--output", help="plan file (default: MODEL with .plan)")
    for bound in ("min", "opt", "max"):
        p.add_argument(f"--{bound}", metavar="NAME:DxD...[,...]", help=f"{bound} shapes of dynamic inputs")
    p.add_argument("--timing-cache", metavar="FILE", help="read (when present) and update this timing cache")
    p.add_argument("--plugin", metavar="LIB.so", help=f"plugin library (default: {TRT_LIBRARY} found like the others)")
    p.add_argument("--report", metavar="FILE.json", help="also write the layer list as JSON")
    p.add_argument("--verbose", action="store_true", help="print TensorRT's info messages too")
    p.set_defaults(func=_cmd_build_engine)


def _cmd_build_engine(args, console) -> int:
    output = args.output or str(Path(args.model).with_suffix(".plan"))
    report = build_engine(args.model, output, min_shapes=parse_shapes(args.min), opt_shapes=parse_shapes(args.opt),
                          max_shapes=parse_shapes(args.max), timing_cache=args.timing_cache,
                          plugin_library=args.plugin, verbose=args.verbose)
    console.print(f"{report.tensorrt}: {report.plugin_layers} FusedConv plugin layers "
                  f"({report.fused_conv_nodes} FusedConv nodes), {len(report.layers)} layers")
    console.print(f"wrote {report.plan} ({report.plan_bytes} bytes)")
    if args.report:
        Path(args.report).write_text(report.to_json())
    return 0 if report.plugin_layers == report.fused_conv_nodes else 1
