"""Shared test helpers: tiny graphs, ORT runs of standard-ONNX models, error measures."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from models.builder import GraphBuilder
from tests.conv_reference import output_size


def any_kernel(target, desc):
    """A kernel query that accepts everything: for pass tests that are not about the registry."""
    return 1, ""


def run_ort(model: onnx.ModelProto, feeds: dict, library: bool = False) -> list[np.ndarray]:
    so = ort.SessionOptions()
    if library:
        from optimizer.runtime import session_options

        so = session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def conv_net(build, *, channels=8, size=12, opset=17, batch=1, seed=0) -> onnx.ModelProto:
    """Model with one input [batch, channels, size, size]; `build(g, x) -> output name`."""
    g = GraphBuilder("test", opset=opset, seed=seed)
    x = g.input("x", channels, size, size, batch=batch)
    g.output(build(g, x), "y")
    return g.build()


def feeds_for(model: onnx.ModelProto, seed=0, batch=2) -> dict:
    from optimizer.verify import random_inputs

    return random_inputs(model, seed=seed)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# Where an ort-cpu library op (fp32 and bf16 only) must not reach: (target, precision).
OTHER_TARGETS = [("ort-cuda", "fp32"), ("ort-cpu", "fp16"), ("tensorrt", "fp32")]


def assert_op_stays_out(model: onnx.ModelProto, op_type: str, target: str, precision: str) -> None:
    """`model` optimized for `target` in `precision`, every candidate fused, has no `op_type` node and its
    report no rewrite into one."""
    from optimizer.pipeline import FusionPolicy, optimize_model

    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(model), target=target, precision=precision,
                                       policy=FusionPolicy(mode="always"))
    assert op_type not in ops(optimized) and not any(op_type in k for k in report.canonicalized)


def gs_graph(model: onnx.ModelProto) -> gs.Graph:
    return gs.import_onnx(onnx.shape_inference.infer_shapes(model))


def run_pass(graph_pass, model: onnx.ModelProto, *args):
    """`graph_pass(graph, report, *args)` on `model`: (the rewritten model, checked by onnx.checker, the report)."""
    from optimizer.report import Report

    report = Report()
    out = gs.export_onnx(graph_pass(gs.import_onnx(model), report, *args))
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out, report


KERNELS_DIR = Path(__file__).resolve().parents[1] / "plugins" / "kernels"
_MANIFEST_COLUMNS = {
    "SM90_GEMM": ("name", "tu", "dtypes", "tile_m", "tile_n", "tile_k", "schedule", "scheduler", "acts", "residual",
                  "epilogue_tile", "store_stages", "rows", "prefer"),
    "SM90_CONV": ("name", "tu", "dtypes", "tile_m", "tile_n", "tile_k", "cluster_m", "schedule", "acts", "prefer"),
    "SM80_CONV": ("name", "kind", "dtypes", "tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k", "stages"),
}


def kernel_manifest(family: str) -> list[dict]:
    """The lines of plugins/kernels/<family>/kernels.def as dicts: "macro" (SM90_GEMM, ...) and the
    columns the file's header names."""
    entries = []
    for line in (KERNELS_DIR / family / "kernels.def").read_text().splitlines():
        m = re.fullmatch(r"(SM\d+_[A-Z]+)\((.*)\)\s*", line)
        if m:
            values = [v.strip() for v in m.group(2).split(",")]
            columns = _MANIFEST_COLUMNS[m.group(1)]
            assert len(values) == len(columns), f"{family}/kernels.def: {len(values)} columns in {line!r}"
            entries.append({"macro": m.group(1), **dict(zip(columns, values))})
    return entries


def sm90_manifest() -> list[dict]:
    """plugins/kernels/sm90/kernels.def, each line with its "kind" (GEMM or CONV)."""
    return [{**e, "kind": e["macro"].split("_")[1]} for e in kernel_manifest("sm90")]


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def conv_inputs(dtype, shape, group=1, residual="none", seed=0, **attrs):
    """Random X [N,H,W,C], W [K,R,S,C/group] (scaled to unit output variance), B [K] and, for a residual,
    Z [N,P,Q,K] in `dtype`, for shape (N, H, W, C, K, R, S) and the op's attributes."""
    n, h, w, c, k, r, s = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c)).astype(dtype)
    wt = (rng.standard_normal((k, r, s, c // group)) / np.sqrt(r * s * c // group)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    pads, strides, dil = attrs.get("pads", (0,) * 4), attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1))
    p = output_size(h, pads[0], pads[2], dil[0], r, strides[0])
    q = output_size(w, pads[1], pads[3], dil[1], s, strides[1])
    z = rng.standard_normal((n, p, q, k)).astype(dtype) if residual != "none" else None
    return x, wt, b, z
