"""3x3 and 1x1 convolution layers on ONNX Runtime's CPU EP: ORT's own Conv (+ its activation, NCHW)
against the FusedConv on each CPU kernel (Winograd F(2x2, 3x3), oneDNN, and `auto`, which times the two
at the first run and keeps the faster), one layer a micro-model, fp32, batch 1. Prints a markdown table
with the FMA-bound floor of the direct convolution beside each time.

    python bench/cpu_layers.py [--runs 30] [--peak-gmacs 118]

Times are kernel times from ORT's profiler, each session's median run, the NCHWc reorders ORT puts
around a lone conv left out (in a model they sit at region edges only), as the optimizer's decisions
measure them (docs/fusion-decisions.md). --peak-gmacs: the machine's fp32 multiply-adds a second on all
threads (2 cores x 16 a cycle x 3.7 GHz for the 2-core Zen 4 of docs/bench-cpu.md).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from optimizer import __version__, registry
from optimizer.measure import _cpu_name
from optimizer.runtime import session_options

# (name, H, C, K, kernel size, activation): YOLOv8n's (640x640 input), ResNet-50's and EfficientNet-B0's (224)
LAYERS = [
    ("yolov8n C2f 3x3 @160", 160, 16, 16, 3, "silu"),
    ("yolov8n C2f 3x3 @80", 80, 32, 32, 3, "silu"),
    ("yolov8n C2f 3x3 @40", 40, 64, 64, 3, "silu"),
    ("yolov8n C2f 3x3 @20", 20, 128, 128, 3, "silu"),
    ("yolov8n head box 3x3 @80", 80, 64, 64, 3, "silu"),
    ("yolov8n head cls 3x3 @80", 80, 80, 80, 3, "silu"),
    ("resnet50 layer1 3x3", 56, 64, 64, 3, "relu"),
    ("resnet50 layer2 3x3", 28, 128, 128, 3, "relu"),
    ("resnet50 layer3 3x3", 14, 256, 256, 3, "relu"),
    ("resnet50 layer4 3x3", 7, 512, 512, 3, "relu"),
    ("yolov8n C2f 1x1 @160", 160, 48, 32, 1, "silu"),
    ("resnet50 layer1 1x1 expand", 56, 64, 256, 1, "relu"),
    ("efficientnet-b0 1x1 expand @7", 7, 192, 1152, 1, "silu"),
]


def _ort_model(h, c, k, r, activation, w, b) -> onnx.ModelProto:
    """Conv + the activation as an exporter writes it (SiLU as Sigmoid and Mul), NCHW."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[r // 2] * 4)]
    if activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["conv"], ["s"]), helper.make_node("Mul", ["conv", "s"], ["y"])]
    else:
        nodes.append(helper.make_node("Relu", ["conv"], ["y"]))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k, h, h])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _fused_model(h, c, k, r, activation, w, b) -> onnx.ModelProto:
    node = helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="epifuse", pads=[r // 2] * 4,
                            activation=activation)
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, h, h, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, h, h, k])],
                              [numpy_helper.from_array(w.transpose(0, 2, 3, 1).copy(), "w"),
                               numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


_SESSION_NUMBERS = itertools.count()


def _session(model: onnx.ModelProto, kernel: str | None, work: Path) -> ort.InferenceSession:
    """A profiling session; `kernel` sets EPIFUSE_CPU_KERNEL, read when the session creates its kernels."""
    if kernel:
        os.environ["EPIFUSE_CPU_KERNEL"] = kernel
    try:
        so = session_options(allow_spinning=False)  # an idle session's spinning pool would take a core
        so.enable_profiling = True
        so.profile_file_prefix = str(work / f"session{next(_SESSION_NUMBERS)}")  # a file each: names carry ms only
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    finally:
        os.environ.pop("EPIFUSE_CPU_KERNEL", None)


def _median_us(session: ort.InferenceSession, skip: int) -> float:
    """Median over the session's runs after the first `skip` of the summed kernel times, reorders left out."""
    trace = Path(session.end_profiling())
    per_run: dict[int, float] = {}
    run = -1
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Session" and event["name"] == "model_run":
            run += 1
        elif event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            if event["args"].get("op_name") not in ("ReorderInput", "ReorderOutput"):
                per_run[run] = per_run.get(run, 0.0) + event["dur"]
    trace.unlink()
    return float(np.median([per_run[i] for i in sorted(per_run)][skip:]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--peak-gmacs", type=float, default=118.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="epifuse-cpu-layers-"))
    rng = np.random.default_rng(0)
    rows = []
    for name, h, c, k, r, activation in LAYERS:
        w = (rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32)
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        x_nhwc = x.transpose(0, 2, 3, 1).copy()
        fused = _fused_model(h, c, k, r, activation, w, b)
        sides = {"ort": (_session(_ort_model(h, c, k, r, activation, w, b), None, work), x)}
        for kernel in ("onednn", "winograd", None):  # None: auto
            sides[kernel or "auto"] = (_session(fused, kernel, work), x_nhwc)
        warmup = 3  # the first runs build the kernels' plans and time Winograd against oneDNN
        for _ in range(warmup + args.runs):  # interleaved, so a slow spell of the shared machine hits all
            for session, feed in sides.values():
                session.run(None, {"x": feed})
        us = {side: _median_us(session, warmup) for side, (session, _) in sides.items()}
        ort_us, auto_us, kernels = us["ort"], us["auto"], us
        floor_us = h * h * c * k * r * r / (args.peak_gmacs * 1e3)
        rows.append((name, f"{c}->{k} {r}x{r} @{h}x{h} {activation}", ort_us, kernels["onednn"],
                     kernels["winograd"] if r == 3 else None, auto_us, floor_us))
        print(f"{name}: ORT {ort_us:.0f} us, oneDNN {kernels['onednn']:.0f}, Winograd {kernels['winograd']:.0f}, "
              f"auto {auto_us:.0f}", flush=True)
    print(f"\n{_cpu_name()}, {os.cpu_count()} threads, onnxruntime {ort.__version__}, epifuse {__version__} "
          f"({registry.onednn_version()}), Python {platform.python_version()}\n")
    print("| layer | shape | ORT µs | oneDNN µs | Winograd µs | auto µs | auto vs ORT | direct floor µs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, shape, ort_us, onednn_us, winograd_us, auto_us, floor_us in rows:
        wino = f"{winograd_us:.0f}" if winograd_us is not None else "-"
        print(f"| {name} | {shape} | {ort_us:.0f} | {onednn_us:.0f} | {wino} | {auto_us:.0f} | "
              f"{ort_us / auto_us:.2f}x | {floor_us:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
