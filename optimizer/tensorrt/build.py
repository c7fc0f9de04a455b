"""Building a TensorRT engine (plan) of an epifuse model, with the FusedConv plugin.

The network is strongly typed, so precision comes from the model (TensorRT 11 has no fp16 flag);
dynamic inputs get one optimization profile from ``--min/--opt/--max``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from ..contract import OP_TYPE
from ..errors import EpifuseError
from ..libraries import TRT_LIBRARY, library_path
from .api import Logger, check_rtx_parser_can_load, is_rtx, load_tensorrt, plugin_registry_with_library


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


def build_engine(model: str | os.PathLike, output: str | os.PathLike, *, min_shapes: dict | None = None,
                 opt_shapes: dict | None = None, max_shapes: dict | None = None, timing_cache: str | None = None,
                 plugin_library: str | None = None, verbose: bool = False) -> EngineReport:
    """Parses `model` (an epifuse .onnx) with the plugin library loaded and writes the plan to `output`."""
    trt = load_tensorrt()
    if is_rtx(trt):
        check_rtx_parser_can_load(trt)
    if not os.path.isfile(model):
        raise EpifuseError("no such file", path=str(model))
    library = Path(plugin_library) if plugin_library else library_path(TRT_LIBRARY)
    log = Logger(trt, verbose)
    builder = trt.Builder(log.logger)
    plugin_registry_with_library(trt, library)

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
