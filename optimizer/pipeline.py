"""The optimizer pipeline: load → canonicalize → fold BN → fuse → layout → precision → cleanup → save."""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager

import onnx
import onnx_graphsurgeon as gs

from .passes.canonicalize import canonicalize
from .passes.cleanup import cleanup
from .passes.fold_batchnorm import fold_batchnorm
from .passes.fuse_conv import fuse_conv
from .passes.layout import layout
from .passes.load import load_model, validate
from .passes.precision import precision as convert_precision
from .passes.save import check_output_path, save_model
from .report import Report

TARGETS = ("ort-cpu", "ort-cuda", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16")


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def _registry_query(target: str, desc: dict) -> tuple[int, str]:
    from . import registry  # noqa: PLC0415 (loads the native library on first use)

    return registry.kernel_count(target, registry.ConvDesc(**desc))


@contextmanager
def _timed(report: Report, name: str, progress=None):
    if progress is not None:
        progress(name)
    start = time.perf_counter()
    yield
    report.pass_seconds[name] = report.pass_seconds.get(name, 0.0) + time.perf_counter() - start


def optimize_model(model: onnx.ModelProto, *, target: str = "ort-cpu", precision: str = "fp32",
                   report: Report | None = None, kernel_query=None, progress=None,
                   stop_after: str | None = None) -> tuple[onnx.ModelProto, Report]:
    """Runs every pass on a validated model. `kernel_query(target, desc) -> (count, reason)`
    defaults to the kernel registry in libepifuse_core; `stop_after="fuse"` is what `inspect` uses."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
    if kernel_query is None:
        kernel_query = _registry_query
    report = report or Report()
    report.target, report.precision = target, precision
    report.nodes_before = len(model.graph.node)
    report.ops_before = _op_counts(model)
    with _timed(report, "import", progress):
        graph = gs.import_onnx(model)
    with _timed(report, "canonicalize", progress):
        graph = canonicalize(graph, report)
    with _timed(report, "fold_batchnorm", progress):
        graph = fold_batchnorm(graph, report)
    with _timed(report, "fuse_conv", progress):
        graph = fuse_conv(graph, report, target, kernel_query)
    if stop_after != "fuse":
        with _timed(report, "layout", progress):
            graph = layout(graph, report)
        with _timed(report, "precision", progress):  # after layout: Casts only where regions end
            graph = convert_precision(graph, report, precision, target)
    with _timed(report, "cleanup", progress):
        out = cleanup(graph, report, model)
    report.nodes_after = len(out.graph.node)
    report.ops_after = _op_counts(out)
    return out, report


def optimize_file(in_path: str, out_path: str, *, target: str = "ort-cpu", precision: str = "fp32",
                  progress=None, kernel_query=None) -> tuple[onnx.ModelProto, Report]:
    check_output_path(out_path, in_path)
    report = Report(model=in_path)
    with _timed(report, "load", progress):
        model = load_model(in_path)
    optimized, report = optimize_model(model, target=target, precision=precision, report=report,
                                       progress=progress, kernel_query=kernel_query)
    with _timed(report, "save", progress):
        save_model(optimized, out_path, in_path)
    return optimized, report


__all__ = ["optimize_model", "optimize_file", "validate", "TARGETS", "PRECISIONS"]
