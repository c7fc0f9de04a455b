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

from .contract import STRICT_FP32
from .errors import EpifuseError
from .passes.save import same_file
from .pipeline import PRECISIONS, TARGETS, FusionPolicy, optimize_file, optimize_model, unfused_model
from .report import Report
from .runtime import cpu_threads
from .tensorrt import add_build_engine_command
from .triton import add_export_triton_command


def _progress(console: Console):
    status = console.status("starting")
    status.start()

    def update(name: str) -> None:
        status.update(f"[bold]epifuse[/bold]: {name}")

    update.stop = status.stop
    return update


def _batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in text.split(","))
    except ValueError:
        batches = ()
    if not batches or any(b < 1 for b in batches):
        raise EpifuseError(f"--batch takes positive integers separated by commas, got {text!r}")
    return batches


def _policy(args) -> FusionPolicy:
    if args.measure_budget is not None and args.measure_budget < 0:
        raise EpifuseError(f"--measure-budget must not be negative, got {args.measure_budget}")
    return FusionPolicy(mode=args.fuse, costs_file=args.costs, costs_device=args.costs_device,
                        measure_budget_s=args.measure_budget, batches=_batches(args.batch),
                        threads=cpu_threads(args.threads, args.target),
                        model_check=False if args.no_model_check else None,
                        allow_tf32=getattr(args, "allow_tf32", True))


def _remove_output(path: str) -> None:
    for p in (path, path + ".data"):
        if os.path.isfile(p):
            os.unlink(p)


def _run_optimize(args, console: Console, in_path: str, out_path: str, bench: bool = False) -> int:
    """Optimizes, then verifies and times where asked; a failed check removes the output again."""
    _check_report_path(args.report, in_path, out_path)
    progress = _progress(console) if console.is_terminal else None
    written = False
    try:
        report = optimize_file(in_path, out_path, target=args.target, precision=args.precision,
                               progress=progress, policy=_policy(args))
        written = True
        if args.verify:
            from .verify import verify  # noqa: PLC0415

            if progress:
                progress("verify")
            report.verify = verify(in_path, out_path, precision=args.precision,
                                   baseline=_precision_baseline(in_path, args.target, args.precision))
        if bench and report.original_kept:  # the input written back: timed against itself it reads only noise
            report.bench = {"same_model": True, "slower": False}
        elif bench and (report.verify is None or report.verify["passed"]):
            if progress:
                progress("compare original and optimized")
            report.bench = _compare_files(in_path, out_path, backend=_bench_backend(args.target),
                                          batch=_batches(args.batch)[0], precision=args.precision, rounds=args.runs,
                                          threads=cpu_threads(args.threads, args.target))
    except BaseException:
        if written:  # never a file this run did not write (an output path refused as the input, say)
            _remove_output(out_path)
        raise
    finally:
        if progress:
            progress.stop()
    report.render(console)
    if args.report:
        _write_report(args.report, report.to_json(), in_path, out_path)
    if report.verify is not None and not report.verify["passed"]:
        _remove_output(out_path)
        console.print(f"verification failed: {out_path} not written")
        return 1
    if report.bench is not None:
        from .compare import summary  # noqa: PLC0415

        console.print("speed: the original kept as it is, nothing to time" if report.bench.get("same_model")
                      else f"speed: {summary(report.bench)}", highlight=False)
        if report.bench["slower"] and getattr(args, "require_faster", False):
            _remove_output(out_path)
            console.print(f"--require-faster: the optimized model is slower; {out_path} not written")
            return 3
    console.print(f"wrote {out_path}")
    return 0


def _check_report_path(path: str | None, *models: str) -> None:
    """Before any work: the report may not take a model's place, and its folder must exist."""
    if not path:
        return
    if any(same_file(path, m) for m in models):
        raise EpifuseError("--report would overwrite a model; choose another file", path=path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise EpifuseError("--report: folder does not exist", path=path)


def _write_report(path: str, text: str, *models: str) -> None:
    _check_report_path(path, *models)
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise EpifuseError(f"cannot write the report: {e.strerror}", path=path) from None


def _bench_backend(target: str) -> str:
    if target == "tensorrt":
        raise EpifuseError("--bench times ONNX Runtime models; for TensorRT use `epifuse build-engine` and "
                           "`epifuse bench PLAN --backend tensorrt`")
    return target


def _compare_files(original: str, optimized: str, **kwargs) -> dict:
    from .compare import compare  # noqa: PLC0415
    from .passes.load import load_model_split  # noqa: PLC0415

    for path in (original, optimized):
        load_model_split(path)  # a clear error naming the file and what is wrong, before ONNX Runtime reads it
    return compare(original, optimized, **kwargs)


def cmd_optimize(args, console: Console) -> int:
    if args.require_faster and not args.bench:
        raise EpifuseError("--require-faster needs --bench")
    return _run_optimize(args, console, args.model, args.output, bench=args.bench)


def cmd_compare(args, console: Console) -> int:
    from rich.progress import Progress  # noqa: PLC0415

    from .compare import summary  # noqa: PLC0415

    for path in (args.original, args.optimized):
        if not os.path.isfile(path):
            raise EpifuseError("no such file", path=path)
    backend = args.backend or _available_backend(console)
    if args.by_op and backend != "ort-cpu":
        raise EpifuseError(f"--by-op reads ONNX Runtime's CPU profiler: it needs --backend ort-cpu, not {backend}")
    if args.spinning and backend != "ort-cpu":
        raise EpifuseError(f"--spinning times ONNX Runtime's CPU thread pools: it needs --backend ort-cpu, not {backend}")
    threads = cpu_threads(args.threads, backend)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("compare", total=args.runs)
        result = _compare_files(args.original, args.optimized, backend=backend, batch=args.batch,
                                precision=args.precision, rounds=args.runs, threads=threads, spinning=args.spinning,
                                progress=lambda done, total: bar.update(task, completed=done))
    console.print(summary(result), highlight=False)
    if args.by_op:
        from .compare import compare_by_op  # noqa: PLC0415

        result["by_op_ms"] = compare_by_op(args.original, args.optimized, batch=args.batch, threads=threads)
        console.print(_by_op_table(result["by_op_ms"]))
    if args.report:
        _write_report(args.report, json.dumps(result, indent=2), args.original, args.optimized)
    if result["slower"] and args.require_faster:
        console.print("--require-faster: the optimized model is slower")
        return 3
    return 0


def _by_op_table(by_op: dict):
    from rich.table import Table  # noqa: PLC0415

    original, optimized = by_op["original"], by_op["optimized"]
    table = Table(title="kernel time by op type, ms a run (ORT's profiler)", title_justify="left")
    for column in ("op", "original", "optimized"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for op in sorted(set(original) | set(optimized), key=lambda o: -max(original.get(o, 0), optimized.get(o, 0))):
        table.add_row(op, *(f"{side[op]:.3f}" if op in side else "" for side in (original, optimized)))
    table.add_row("total", f"{sum(original.values()):.3f}", f"{sum(optimized.values()):.3f}", style="bold")
    return table


def _available_backend(console: Console) -> str:
    """ort-cuda where onnxruntime has the CUDA EP and a GPU is present, else ort-cpu (said in one line)."""
    from .measure import cuda_device_name  # noqa: PLC0415

    try:
        import onnxruntime as ort  # noqa: PLC0415

        if "CUDAExecutionProvider" in ort.get_available_providers() and cuda_device_name():
            return "ort-cuda"
    except ImportError:
        pass
    console.print("no CUDA device or onnxruntime-gpu here: using --backend ort-cpu", highlight=False)
    return "ort-cpu"


def _precision_baseline(original: str, target: str, precision: str):
    """For fp16/bf16: the original converted to that precision alone, for the target (the error
    the precision makes by itself widens the verify bound); None for fp32."""
    if precision == "fp32":
        return None
    from .passes.load import load_model  # noqa: PLC0415

    return unfused_model(load_model(original), target, precision)


def cmd_verify(args, console: Console) -> int:
    from .passes.load import load_model  # noqa: PLC0415
    from .verify import verify  # noqa: PLC0415

    for path in (args.original, args.optimized):
        if not os.path.isfile(path):
            raise EpifuseError("no such file", path=path)
        load_model(path)  # a truncated or corrupt file: one clear line, not a parser's traceback
    inputs = None
    if args.inputs:
        try:
            inputs = dict(np.load(args.inputs))
        except (OSError, ValueError) as e:
            raise EpifuseError(f"cannot read inputs: {e}", path=args.inputs) from None
    result = verify(args.original, args.optimized, precision=args.precision, inputs=inputs,
                    baseline=_precision_baseline(args.original, args.target, args.precision))
    report = Report(model=args.optimized, verify=result)
    console.print_json(json.dumps(result))
    if not result["passed"]:
        for name, err in result["rel_l2"].items():
            bound = result.get("bounds", {}).get(name, result["tolerance"])
            if not err <= bound:
                console.print(f"[red]FAIL[/red]: output '{name}': relative L2 {err:.2e} > {bound:.1e}", highlight=False)
    return 0 if report.verify["passed"] else 1


def cmd_inspect(args, console: Console) -> int:
    from .passes.load import load_model  # noqa: PLC0415

    model = load_model(args.model)
    _, report = optimize_model(model, target=args.target, precision=args.precision, report=Report(model=args.model),
                               stop_after="fuse", policy=_policy(args))
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
    if args.target == "ort-cpu":  # the speed-up on this machine's CPU, next to the verify line
        args.runs = 20
        return _run_optimize(args, console, src, os.path.join(folder, f"{zoo.DEFAULT_MODEL}.epifuse.onnx"),
                             bench=True)
    return _run_optimize(args, console, src, os.path.join(folder, f"{zoo.DEFAULT_MODEL}.epifuse.onnx"))


def cmd_bench(args, console: Console) -> int:
    from rich.progress import Progress  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from .bench import run_bench  # noqa: PLC0415

    if not os.path.isfile(args.model):
        raise EpifuseError("no such file", path=args.model)
    if args.backend is None:
        args.backend = _available_backend(console)
    if args.runs < 1 or args.warmup < 0:
        raise EpifuseError(f"--runs must be at least 1 and --warmup not negative (got {args.runs}, {args.warmup})")
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
        _write_report(args.report, json.dumps(result, indent=2), args.model)
    return 0


def cmd_tune(args, console: Console) -> int:
    from .bench import run_tune  # noqa: PLC0415

    if not os.path.isfile(args.model):
        raise EpifuseError("no such file", path=args.model)
    if args.export_costs:
        return _export_costs(args, console)
    console.print(f"tuned every FusedConv of {args.model} on {args.target}; winners cached in "
                  f"{run_tune(args.model, batch=_batches(args.batch)[0], target=args.target)}")
    return 0


def _export_costs(args, console: Console) -> int:
    """Measures every fusion candidate of an original model on this machine's target and writes the
    times as a costs file, for `epifuse optimize --costs FILE` on a machine without this target."""
    from .passes.load import load_model  # noqa: PLC0415

    model = load_model(args.model)
    if any(n.domain == "epifuse" for n in model.graph.node):
        raise EpifuseError("--export-costs measures the candidates of an original model; this one is already "
                           "optimized", path=args.model)
    policy = FusionPolicy(mode="auto", measure_budget_s=args.measure_budget, batches=_batches(args.batch),
                          export_costs=args.export_costs, allow_tf32=args.allow_tf32)
    _, report = optimize_model(model, target=args.target, precision=args.precision, report=Report(model=args.model),
                               stop_after="fuse", policy=policy)
    report.render(console)
    return 0


class _Precision(argparse.Action):
    """--precision with fp32-strict: fp32 whose fused convs keep allow_tf32 = 0 (args.allow_tf32), the
    precision everywhere else being fp32."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.allow_tf32 = values != STRICT_FP32
        setattr(namespace, self.dest, "fp32" if values == STRICT_FP32 else values)


PRECISION_HELP = ("fp32 (default): on ort-cuda and tensorrt, fused convs may compute in TF32 on the tensor cores, "
                  "as cuDNN and ONNX Runtime do by default; fp32-strict: fp32-level accuracy (3xTF32 or FP32 "
                  "math); fp16, bf16: the model converted")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epifuse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--target", choices=TARGETS, default="ort-cpu", help="runtime the model is made for")
        p.add_argument("--precision", choices=PRECISIONS + (STRICT_FP32,), default="fp32", action=_Precision,
                       help=PRECISION_HELP)
        p.set_defaults(allow_tf32=True)
        p.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
        decisions(p)

    def decisions(p):
        p.add_argument("--fuse", choices=("auto", "static", "always"), default=None,
                       help="auto (default, or $EPIFUSE_FUSE): fuse where measured faster than the runtime's own "
                            "nodes, else by the static policy; static: the static policy only; always: wherever "
                            "a kernel exists (may be slower)")
        p.add_argument("--costs", metavar="FILE.json",
                       help="times measured on the target by `epifuse tune --export-costs` (instead of measuring here)")
        p.add_argument("--costs-device", metavar="NAME", help="which device of a costs file holding several")
        p.add_argument("--measure-budget", type=float, default=None, metavar="SECONDS",
                       help="at most this long measuring candidates (default 30 on ort-cpu, 300 on ort-cuda; "
                            "the cache makes reruns free)")
        p.add_argument("--batch", default="1", metavar="N[,N...]",
                       help="batch sizes to decide for where the batch dimension is symbolic (default 1)")
        p.add_argument("--threads", type=int, default=None, metavar="N",
                       help="ort-cpu: the intra-op threads the model will run with, to measure and check with "
                            "(default: measured on ONNX Runtime's, one per core, checked there and on one)")
        p.add_argument("--no-model-check", action="store_true",
                       help="skip the whole-model check (the optimized model run against the original on the "
                            "target, where fusions were measured here; it holds both models in memory)")

    p = sub.add_parser("optimize", help="optimize a model")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--verify", action="store_true", help="compare with the original on ONNX Runtime CPU")
    p.add_argument("--bench", action="store_true",
                   help="time original and optimized on the target in one process, interleaved, and print the speed-up")
    p.add_argument("--require-faster", action="store_true",
                   help="with --bench: exit 3 and write nothing when the optimized model is slower")
    p.add_argument("--runs", type=int, default=30, help="--bench rounds (default 30)")
    common(p)
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("compare", help="time an original and its optimized model in one process, interleaved")
    p.add_argument("original")
    p.add_argument("optimized")
    p.add_argument("--backend", choices=("ort-cpu", "ort-cuda"), default=None,
                   help="default: ort-cuda where a GPU and onnxruntime-gpu are present, else ort-cpu")
    p.add_argument("--batch", type=int, default=1, help="value for a symbolic batch dimension")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp16/bf16: compare with the original in that precision (epifuse's precision pass alone)")
    p.add_argument("--runs", type=int, default=30, help="interleaved rounds (default 30)")
    p.add_argument("--require-faster", action="store_true", help="exit 3 when the optimized model is slower")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="ort-cpu: ONNX Runtime's intra-op threads (default: its own, one per core)")
    p.add_argument("--by-op", action="store_true",
                   help="ort-cpu: also where each model's time goes, by op type (ONNX Runtime's profiler)")
    p.add_argument("--spinning", action="store_true",
                   help="ort-cpu: the thread pools as ONNX Runtime's defaults leave them, spinning between runs "
                        "(rounds of 0.3 s), as a process running one model back to back has them; default: "
                        "pools that sleep when idle, in 20 ms rounds")
    p.add_argument("--report", metavar="FILE.json")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("verify", help="compare an optimized model with its original on ONNX Runtime")
    p.add_argument("original")
    p.add_argument("optimized")
    p.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name (default: random)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="sets the error bound")
    p.add_argument("--target", choices=TARGETS, default="ort-cpu",
                   help="what the model was optimized for: with fp16/bf16 the original is converted as for it, "
                        "and twice that conversion's own error is also allowed")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("inspect", help="what would fuse, and why not where not")
    p.add_argument("model")
    p.add_argument("--target", choices=TARGETS, default="ort-cpu")
    p.add_argument("--precision", choices=PRECISIONS + (STRICT_FP32,), default="fp32", action=_Precision,
                   help=PRECISION_HELP)
    decisions(p)
    p.set_defaults(func=cmd_inspect, allow_tf32=True)

    p = sub.add_parser("demo", help="optimize and verify the embedded default model")
    p.add_argument("--output-dir", help="where to write the models (default: a new temporary folder)")
    common(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="latency percentiles and throughput on ONNX Runtime")
    p.add_argument("model")
    p.add_argument("--backend", choices=("ort-cuda", "ort-cpu", "tensorrt"), default=None,
                   help="default: ort-cuda where a GPU and onnxruntime-gpu are present, else ort-cpu; "
                        "tensorrt: MODEL is a plan built by `epifuse build-engine`")
    p.add_argument("--batch", type=int, default=1, help="value for a symbolic batch dimension")
    p.add_argument("--fp16", action="store_true", help="optimize to fp16 in memory first (epifuse --precision fp16)")
    p.add_argument("--prefer-nhwc", action="store_true",
                   help="ort-cuda: also run MaxPool, Resize etc. in NHWC (faster at large batch)")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--report", metavar="FILE.json")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="time the kernels of each FusedConv once on the target and cache the winners "
                                    "for later sessions on this machine; with --export-costs, measure an original "
                                    "model's fusion candidates")
    p.add_argument("model")
    p.add_argument("--batch", default="1", metavar="N[,N...]")
    p.add_argument("--export-costs", metavar="FILE.json",
                   help="write the measured times of MODEL's (original) fusion candidates on this machine, for "
                        "`epifuse optimize --costs FILE` elsewhere")
    p.add_argument("--target", choices=("ort-cuda", "ort-cpu"), default="ort-cuda",
                   help="the runtime to tune for (or, with --export-costs, to measure on)")
    p.add_argument("--precision", choices=PRECISIONS + (STRICT_FP32,), default="fp16", action=_Precision,
                   help="with --export-costs")
    p.set_defaults(allow_tf32=True)
    p.add_argument("--measure-budget", type=float, default=600.0, metavar="SECONDS", help="with --export-costs")
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
