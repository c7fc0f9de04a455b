"""`epifuse` command line: optimize, verify, inspect, demo, bench, tune, build-engine, export-triton."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx
from rich.console import Console

from .errors import EpifuseError
from .pipeline import PRECISIONS, TARGETS, optimize_file, optimize_model
from .report import Report
from .tensorrt import add_build_engine_command
from .triton import add_export_triton_command


def _progress(console: Console):
    status = console.status("starting")
    status.start()

    def update(name: str) -> None:
        status.update(f"[bold]epifuse[/bold]: {name}")

    update.stop = status.stop
    return update


def _run_optimize(args, console: Console, in_path: str, out_path: str) -> int:
    progress = _progress(console) if console.is_terminal else None
    try:
        report = optimize_file(in_path, out_path, target=args.target, precision=args.precision,
                               progress=progress)
        if args.verify:
            from .verify import verify  # noqa: PLC0415

            if progress:
                progress("verify")
            report.verify = verify(in_path, out_path, precision=args.precision)
    finally:
        if progress:
            progress.stop()
    report.render(console)
    console.print(f"wrote {out_path}")
    if args.report:
        with open(args.report, "w") as f:
            f.write(report.to_json())
    return 0 if report.verify is None or report.verify["passed"] else 1


def cmd_optimize(args, console: Console) -> int:
    return _run_optimize(args, console, args.model, args.output)


def cmd_verify(args, console: Console) -> int:
    from .verify import verify  # noqa: PLC0415

    for path in (args.original, args.optimized):
        if not os.path.isfile(path):
            raise EpifuseError("no such file", path=path)
    inputs = None
    if args.inputs:
        try:
            inputs = dict(np.load(args.inputs))
        except (OSError, ValueError) as e:
            raise EpifuseError(f"cannot read inputs: {e}", path=args.inputs) from None
    result = verify(args.original, args.optimized, precision=args.precision, inputs=inputs)
    report = Report(model=args.optimized, verify=result)
    console.print_json(json.dumps(result))
    if not result["passed"]:
        console.print(f"[red]FAIL[/red]: worst relative L2 {result['worst_rel_l2']:.2e} > {result['tolerance']:.0e}")
    return 0 if report.verify["passed"] else 1


def cmd_inspect(args, console: Console) -> int:
    from .passes.load import load_model  # noqa: PLC0415

    model = load_model(args.model)
    _, report = optimize_model(model, target=args.target, report=Report(model=args.model), stop_after="fuse")
    report.render(console)
    return 0


def cmd_demo(args, console: Console) -> int:
    from models import zoo  # noqa: PLC0415

    folder = args.output_dir or tempfile.mkdtemp(prefix="epifuse-demo-")
    os.makedirs(folder, exist_ok=True)
    src = os.path.join(folder, f"{zoo.DEFAULT_MODEL}.onnx")
    onnx.save(zoo.default_model(), src)
    console.print(f"embedded default model ({zoo.DEFAULT_MODEL}) written to {src}")
    args.verify = True
    return _run_optimize(args, console, src, os.path.join(folder, f"{zoo.DEFAULT_MODEL}.epifuse.onnx"))


def cmd_bench(args, console: Console) -> int:
    from rich.progress import Progress  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from .bench import run_bench  # noqa: PLC0415

    if not os.path.isfile(args.model):
        raise EpifuseError("no such file", path=args.model)
    if args.prefer_nhwc and args.backend != "ort-cuda":
        raise EpifuseError(f"--prefer-nhwc applies to --backend ort-cuda, not {args.backend}", path=args.model)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("bench", total=args.runs + args.warmup)
        result = run_bench(args.model, backend=args.backend, batch=args.batch, fp16=args.fp16, runs=args.runs,
                           warmup=args.warmup, progress=lambda *_: bar.advance(task),
                           prefer_nhwc=args.prefer_nhwc)
    table = Table(title=f"{args.model} on {args.backend}, batch {args.batch}{' fp16' if args.fp16 else ''}")
    for col in ("median ms", "p90 ms", "p99 ms", "min ms", "inputs/s"):
        table.add_column(col, justify="right")
    table.add_row(*(f"{result[k]:.3f}" for k in ("median_ms", "p90_ms", "p99_ms", "min_ms")),
                  f"{result['throughput_per_s']:.1f}")
    console.print(table)
    if args.report:
        with open(args.report, "w") as f:
            f.write(json.dumps(result, indent=2))
    return 0


def cmd_tune(args, console: Console) -> int:
    from .bench import run_tune  # noqa: PLC0415

    if not os.path.isfile(args.model):
        raise EpifuseError("no such file", path=args.model)
    console.print(f"tuned every FusedConv of {args.model}; winners cached in {run_tune(args.model, batch=args.batch)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epifuse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--target", choices=TARGETS, default="ort-cpu", help="runtime the model is made for")
        p.add_argument("--precision", choices=PRECISIONS, default="fp32")
        p.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")

    p = sub.add_parser("optimize", help="optimize a model")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--verify", action="store_true", help="compare with the original on ONNX Runtime CPU")
    common(p)
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("verify", help="compare an optimized model with its original on ONNX Runtime")
    p.add_argument("original")
    p.add_argument("optimized")
    p.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name (default: random)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="sets the error bound")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("inspect", help="what would fuse, and why not where not")
    p.add_argument("model")
    p.add_argument("--target", choices=TARGETS, default="ort-cpu")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("demo", help="optimize and verify the embedded default model")
    p.add_argument("--output-dir", help="where to write the models (default: a new temporary folder)")
    common(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="latency percentiles and throughput on ONNX Runtime")
    p.add_argument("model")
    p.add_argument("--backend", choices=("ort-cuda", "ort-cpu", "tensorrt"), default="ort-cuda",
                   help="tensorrt: MODEL is a plan built by `epifuse build-engine`")
    p.add_argument("--batch", type=int, default=1, help="value for a symbolic batch dimension")
    p.add_argument("--fp16", action="store_true", help="optimize to fp16 in memory first (epifuse --precision fp16)")
    p.add_argument("--prefer-nhwc", action="store_true",
                   help="ort-cuda: also run MaxPool, Resize etc. in NHWC (faster at large batch)")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--report", metavar="FILE.json")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="time every valid kernel of each FusedConv once on the CUDA EP and cache the winners")
    p.add_argument("model")
    p.add_argument("--batch", type=int, default=1)
    p.set_defaults(func=cmd_tune)

    add_build_engine_command(sub)
    add_export_triton_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return args.func(args, console)
    except EpifuseError as e:
        print(f"epifuse: error: {e}", file=sys.stderr)  # one line, never wrapped
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
