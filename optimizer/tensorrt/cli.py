"""`epifuse build-engine`."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..contract import OP_TYPE, PRECISIONS
from ..errors import EpifuseError
from ..libraries import TRT_LIBRARY
from .build import EngineReport, build_engine, parse_shapes


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
    p.add_argument("--original", metavar="ORIG.onnx",
                   help="the model before `epifuse optimize`: also build it (TensorRT fusing convs itself), time "
                        "both engines here and keep the faster")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="with --original: the precision MODEL was optimized for, which ORIG is converted to "
                        "(default: read from MODEL's FusedConv filters)")
    p.add_argument("--rounds", type=int, default=20, help="with --original: interleaved timing rounds")
    p.set_defaults(func=_cmd_build_engine)


def _cmd_build_engine(args, console) -> int:
    output = args.output or str(Path(args.model).with_suffix(".plan"))
    options = dict(min_shapes=parse_shapes(args.min), opt_shapes=parse_shapes(args.opt), max_shapes=parse_shapes(args.max),
                   timing_cache=args.timing_cache, plugin_library=args.plugin, verbose=args.verbose)
    if args.original:
        report = _build_faster(args, output, options, console)
    else:
        report = build_engine(args.model, output, **options)
    console.print(f"{report.tensorrt}: {report.plugin_layers} FusedConv plugin layers "
                  f"({report.fused_conv_nodes} FusedConv nodes), {len(report.layers)} layers")
    console.print(f"wrote {report.plan} ({report.plan_bytes} bytes)")
    if args.report:
        Path(args.report).write_text(report.to_json())
    return 0 if report.plugin_layers == report.fused_conv_nodes else 1


def _model_precision(path: str) -> str | None:
    """The precision an epifuse model was optimized for: its FusedConv filters' type (None without one)."""
    import onnx  # noqa: PLC0415

    model = onnx.load(path, load_external_data=False)
    types = {t.name: t.data_type for t in model.graph.initializer}
    codes = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}
    for node in model.graph.node:
        if node.op_type == OP_TYPE and len(node.input) > 1 and types.get(node.input[1]) in codes:
            return codes[types[node.input[1]]]
    return None


def _build_faster(args, output: str, options: dict, console) -> EngineReport:
    """--original: ORIG in MODEL's precision (the precision pass alone, nothing fused) against MODEL."""
    from ..passes.load import load_model  # noqa: PLC0415
    from ..passes.save import same_file, save_model  # noqa: PLC0415
    from ..pipeline import unfused_model  # noqa: PLC0415
    from .faster import build_faster_engine  # noqa: PLC0415

    if args.rounds < 2:
        raise EpifuseError(f"--rounds must be at least 2, got {args.rounds}")
    for given in (args.model, args.original):
        if same_file(output, given):
            raise EpifuseError("the plan would overwrite a model; choose another -o", path=output)
    original = load_model(args.original)  # a clear error naming the file where it is not a model
    found = _model_precision(args.model)
    precision = args.precision or found or "fp32"
    if found is not None and precision != found:
        raise EpifuseError(f"--precision {precision}, but its FusedConv filters are {found}: both engines must "
                           "run in one precision", path=args.model)
    with tempfile.TemporaryDirectory(dir=Path(output).resolve().parent, prefix=".epifuse-original-") as tmp:
        path = os.path.join(tmp, "original.onnx")
        save_model(unfused_model(original, "tensorrt", precision), path)
        del original
        choice = build_faster_engine(args.model, path, output, rounds=args.rounds, **options)
    console.print(choice.summary())
    return choice.report
