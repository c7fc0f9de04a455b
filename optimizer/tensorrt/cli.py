"""`epifuse build-engine`."""
from __future__ import annotations

from pathlib import Path

from ..libraries import TRT_LIBRARY
from .build import build_engine, parse_shapes


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
