"""The graph input's NCHW → NHWC move on ONNX Runtime's CPU EP: ORT's Transpose against
epifuse::NchwToNhwc (the library's row interleave), one op a micro-model, batch and shape as models
see them. Prints a markdown table with a copy of the same bytes (numpy, one thread) as the floor.

    python bench/cpu_layout.py [--runs 200]

Times are wall times of session.run, each side's median over interleaved runs; both sides pay the
same session overhead (a few microseconds) and output allocation.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from optimizer import __version__
from optimizer.measure import _cpu_name
from optimizer.passes.input_layout import OP_TYPE
from optimizer.runtime import session_options

# (what it is, N, C, H, W)
SHAPES = [
    ("ImageNet classifier", 1, 3, 224, 224),
    ("ImageNet classifier, batch 8", 8, 3, 224, 224),
    ("YOLO 640", 1, 3, 640, 640),
    ("PP-OCR recognizer", 1, 3, 48, 320),
    ("PP-OCR detector", 1, 3, 640, 640),
    ("RGBA", 1, 4, 224, 224),
    ("two channels", 1, 2, 224, 224),
    ("eight channels", 1, 8, 224, 224),
    ("one channel (stays a Transpose)", 1, 1, 224, 224),
]


def _model(node: onnx.NodeProto, shape) -> bytes:
    n, c, h, w = shape
    graph = helper.make_graph([node], "layout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, h, w, c])])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("epifuse", 1)]).SerializeToString()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for name, *shape in SHAPES:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        sides = {
            "ort": helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1]),
            "epifuse": helper.make_node(OP_TYPE, ["x"], ["y"], domain="epifuse"),
        }
        sessions = {side: ort.InferenceSession(_model(node, shape), session_options(), providers=["CPUExecutionProvider"])
                    for side, node in sides.items()}
        expected = x.transpose(0, 2, 3, 1)
        for side, session in sessions.items():
            assert np.array_equal(session.run(None, {"x": x})[0], expected), side
        copy_target = np.empty_like(x)
        times: dict[str, list[float]] = {"ort": [], "epifuse": [], "copy": []}
        for _ in range(args.runs):  # interleaved, so a slow spell of the shared machine hits every side
            for side, session in sessions.items():
                start = time.perf_counter()
                session.run(None, {"x": x})
                times[side].append(time.perf_counter() - start)
            start = time.perf_counter()
            np.copyto(copy_target, x)
            times["copy"].append(time.perf_counter() - start)
        us = {side: float(np.median(t)) * 1e6 for side, t in times.items()}
        rows.append((name, "x".join(map(str, shape)), us["ort"], us["epifuse"], us["copy"]))
    print(f"\n{_cpu_name()}, {os.cpu_count()} threads, onnxruntime {ort.__version__}, epifuse {__version__}, "
          f"Python {platform.python_version()}\n")
    print("| input | N x C x H x W | ORT Transpose µs | NchwToNhwc µs | speed-up | copy floor µs |")
    print("|---|---|---:|---:|---:|---:|")
    for name, shape, ort_us, ours_us, copy_us in rows:
        print(f"| {name} | {shape} | {ort_us:.0f} | {ours_us:.0f} | {ort_us / ours_us:.2f}x | {copy_us:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
