"""The optimizer pipeline: load → canonicalize → fold BN → fuse → layout → GPU pools (ort-cuda fp16) → precision →
input layout (ort-cuda) → cleanup → save."""
from __future__ import annotations

import gc
import time
from collections import Counter
from contextlib import contextmanager

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from .passes.canonicalize import canonicalize
from .passes.cleanup import cleanup
from .passes.fc_as_conv import fc_as_conv
from .passes.fold_batchnorm import fold_batchnorm
from .passes.fuse_conv import fuse_conv
from .passes.gpu_pools import gpu_pools
from .passes.input_layout import input_layout
from .passes.layout import layout
from .passes.load import load_model_split, validate
from .passes.pool_as_conv import pool_as_conv
from .passes.precision import precision as convert_precision
from .passes.save import check_output_path, save_model
from .proto import SplitModel, skeleton
from .report import Report

G_LOGGER.severity = G_LOGGER.ERROR  # gs warns about optional colour output on first use
TARGETS = ("ort-cpu", "ort-cuda", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16")


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def _registry_query(target: str, desc: dict) -> tuple[int, str]:
    from . import registry  # noqa: PLC0415 (loads the native library on first use)

    return registry.kernel_count(target, registry.ConvDesc(**desc))


@contextmanager
def _timed(report: Report, name: str, progress=None, free_memory: bool = False):
    if progress is not None:
        progress(name)
    start = time.perf_counter()
    yield
    if free_memory:
        gc.collect()  # gs tensors reference themselves: replaced weights die only in a cycle collection
    report.pass_seconds[name] = report.pass_seconds.get(name, 0.0) + time.perf_counter() - start


def optimize_model(model: onnx.ModelProto, *, target: str = "ort-cpu", precision: str = "fp32",
                   report: Report | None = None, kernel_query=None, progress=None,
                   stop_after: str | None = None) -> tuple[onnx.ModelProto, Report]:
    """Runs every pass on a validated model, in memory. `kernel_query(target, desc) -> (count, reason)`
    defaults to the kernel registry in libepifuse_core; `stop_after="fuse"` is what `inspect` uses."""
    report = report or Report()
    with _timed(report, "import", progress):
        graph = gs.import_onnx(model)
    split, report = optimize_graph(graph, skeleton(model, keep_small=False, weights_as_inputs=False),
                                   target=target, precision=precision, report=report, kernel_query=kernel_query,
                                   progress=progress, stop_after=stop_after)
    return split.to_model(), report


def optimize_graph(graph: gs.Graph, template: onnx.ModelProto, *, target: str, precision: str, report: Report,
                   kernel_query=None, progress=None, stop_after: str | None = None,
                   free_memory: bool = False) -> tuple[SplitModel, Report]:
    """The passes on an imported graph; `template` is the original model's skeleton. With
    `free_memory`, replaced weights are collected after every pass (large models)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
    if kernel_query is None:
        kernel_query = _registry_query
    report.target, report.precision = target, precision
    report.nodes_before = len(template.graph.node)
    report.ops_before = _op_counts(template)
    with _timed(report, "canonicalize", progress, free_memory):
        graph = canonicalize(graph, report)
    with _timed(report, "fc_as_conv", progress, free_memory):  # before fusion: the convs it writes fuse
        graph = fc_as_conv(graph, report, target)
    with _timed(report, "pool_as_conv", progress, free_memory):
        graph = pool_as_conv(graph, report, target)
    with _timed(report, "fold_batchnorm", progress, free_memory):
        graph = fold_batchnorm(graph, report)
    with _timed(report, "fuse_conv", progress, free_memory):
        graph = fuse_conv(graph, report, target, kernel_query)
    if stop_after != "fuse":
        with _timed(report, "layout", progress, free_memory):
            graph = layout(graph, report)
        with _timed(report, "gpu_pools", progress, free_memory):  # on the NHWC pools layout leaves
            graph = gpu_pools(graph, report, target, precision)
        with _timed(report, "precision", progress, free_memory):  # after layout: Casts only where regions end
            graph = convert_precision(graph, report, precision, target)
        with _timed(report, "input_layout", progress, free_memory):  # after precision: moves 16-bit data
            graph = input_layout(graph, report, target)
    with _timed(report, "cleanup", progress, free_memory):
        out = cleanup(graph, report, template)
    report.nodes_after = len(out.structure.graph.node)
    report.ops_after = _op_counts(out.structure)
    return out, report


def optimize_file(in_path: str, out_path: str, *, target: str = "ort-cpu", precision: str = "fp32",
                  progress=None, kernel_query=None) -> Report:
    """Optimizes the file `in_path` into `out_path` holding one copy of the weights at a time:
    the parsed protobuf until the graph has them as arrays, then the arrays, streamed to disk."""
    check_output_path(out_path, in_path)
    report = Report(model=in_path)
    with _timed(report, "load", progress):
        model, weights = load_model_split(in_path)
    with _timed(report, "import", progress):
        graph = gs.import_onnx(model)
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Constant):
                tensor.values = weights.pop(tensor.name) if tensor.name in weights else tensor.values
        template = skeleton(model, keep_small=False, weights_as_inputs=False)
        del model
    optimized, report = optimize_graph(graph, template, target=target, precision=precision, report=report,
                                       progress=progress, kernel_query=kernel_query, free_memory=True)
    del graph
    with _timed(report, "save", progress):
        save_model(optimized, out_path, in_path)
    return report


__all__ = ["optimize_model", "optimize_file", "validate", "TARGETS", "PRECISIONS"]
