"""Two builds of the ONNX Runtime custom-op library (libepifuse_ort.so) against each other on single
FusedConv layers, fp32, batch 1, in one process: two sessions per build and layer, made in the order
A B B A and run in alternating blocks with ORT's default (spinning) thread pools; the first runs of each
block, while the other session's pool may still spin, are not counted. Also a chain of 50 small 1x1
FusedConvs, whose time per node is mostly the op's fixed cost. Prints a markdown table of wall times per
run (medians).

    python bench/cpu_ab.py --baseline OLD/optimizer/lib/libepifuse_ort.so [--candidate NEW.so] [--kernel onednn]
                           [--models A.epifuse.onnx ...] [--no-layers] [--threads N]

--models: also whole optimized models (their first input random, batch 1), where a layer's filters come
cold from memory as they do in a model and not from the cache, as in a micro-model run over and over.

--candidate defaults to the installed epifuse's library; --kernel sets EPIFUSE_CPU_KERNEL for both
(unset: each build's own choice, which for 3x3 layers is itself a timing and may differ between runs).
A baseline build: `git worktree add /tmp/base <commit> && pip install --no-deps --target /tmp/base-lib /tmp/base`.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cpu_layers import _fused_model  # the same one-FusedConv micro-model as the layer table's
from optimizer.libraries import library_path, preload_onednn

# (name, H, C, K, kernel size, activation[, groups])
LAYERS = [
    ("resnet 3x3 @7", 7, 512, 512, 3, "relu"),
    ("resnet 3x3 @14", 14, 256, 256, 3, "relu"),
    ("resnet 1x1 2048->512 @7", 7, 2048, 512, 1, "relu"),
    ("efficientnet 1x1 192->1152 @7", 7, 192, 1152, 1, "silu"),
    ("efficientnet 1x1 1152->192 @7", 7, 1152, 192, 1, "relu"),
    ("efficientnet 1x1 16->96 @112", 112, 16, 96, 1, "silu"),
    ("yolov8n 1x1 48->32 @160", 160, 48, 32, 1, "silu"),
    ("resnet 1x1 64->256 @56", 56, 64, 256, 1, "relu"),
    ("one-row 3x3 320->256", 1, 320, 256, 3, "relu"),
    ("convnext 1x1 96->384 @56", 56, 96, 384, 1, "gelu"),
    ("convnext 7x7 depthwise @56", 56, 96, 96, 7, "identity", 96),
    ("convnext 7x7 depthwise @14", 14, 384, 384, 7, "identity", 384),
    ("efficientnet 3x3 depthwise @112", 112, 32, 32, 3, "silu", 32),
    ("efficientnet 5x5 depthwise @14", 14, 672, 672, 5, "silu", 672),
    ("squeeze-excite 1x1 672->28 @1", 1, 672, 28, 1, "silu"),
    ("squeeze-excite 1x1 28->672 @1", 1, 28, 672, 1, "sigmoid"),
    ("squeeze-excite 1x1 960->240 @1", 1, 960, 240, 1, "relu"),
    ("squeeze-excite 1x1 240->960 @1", 1, 240, 960, 1, "hardsigmoid"),
]
CHAIN_NODES, CHAIN_CHANNELS = 50, 32


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "ab", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def layer_model(h, c, k, r, activation, rng, groups=1) -> onnx.ModelProto:
    w = (rng.standard_normal((k, c // groups, r, r)) / np.sqrt(c // groups * r * r)).astype(np.float32)
    model = _fused_model(h, c, k, r, activation, w, rng.standard_normal(k).astype(np.float32))
    if groups > 1:
        model.graph.node[0].attribute.append(helper.make_attribute("group", groups))
    return model


def chain_model(rng) -> onnx.ModelProto:
    c, nodes, inits, x = CHAIN_CHANNELS, [], [], "x"
    for i in range(CHAIN_NODES):
        inits += [numpy_helper.from_array((rng.standard_normal((c, 1, 1, c)) * 0.1).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(c, np.float32), f"b{i}")]
        nodes.append(helper.make_node("FusedConv", [x, f"w{i}", f"b{i}"], [f"y{i}"], domain="epifuse",
                                      activation="relu"))
        x = f"y{i}"
    shape = [1, 1, 1, c]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)


def session(model: onnx.ModelProto, library: str, threads: int | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(model: onnx.ModelProto, libraries: list[str], blocks: int, runs: int, skip: int,
            threads: int | None = None) -> list[float]:
    """Median wall time per run (µs) of each library, the outputs checked to agree. Two sessions a library,
    made in the order A B B A: with one each, the session made second read 1.03-1.04x faster whole models
    than the first with the same build on both sides (2-core Xeon); made so, that falls on both alike."""
    order = [0, 1, 1, 0]
    sessions = [session(model, libraries[i], threads) for i in order]
    name = sessions[0].get_inputs()[0].name
    shape = [d if isinstance(d, int) else 1 for d in sessions[0].get_inputs()[0].shape]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    outputs = [s.run(None, {name: x})[0] for s in sessions]
    for other in outputs[1:]:
        # the builds may sum in another order (their kernels' choices are timed per session): fp32 rounding
        error = np.linalg.norm(other - outputs[0]) / max(np.linalg.norm(outputs[0]), 1e-30)
        assert error <= 1e-5, f"the sessions' outputs differ: relative L2 {error:.2e}"
    times: list[list[float]] = [[] for _ in libraries]
    for block in range(blocks):  # the order reverses each block: a session pays the one before's spinning pool
        for s, lib in list(zip(sessions, order))[::1 if block % 2 == 0 else -1]:
            for i in range(runs):
                start = time.perf_counter()
                s.run(None, {name: x})
                if i >= skip:
                    times[lib].append(time.perf_counter() - start)
    return [float(np.median(t)) * 1e6 for t in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the libepifuse_ort.so to compare against")
    ap.add_argument("--candidate", default=None, help="default: the installed epifuse's library")
    ap.add_argument("--kernel", choices=["auto", "onednn", "winograd", "depthwise", "gemv", "reference"], default=None)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=60, help="runs per block, the first third not counted")
    ap.add_argument("--models", nargs="*", default=[], help="optimized models to run whole under both builds")
    ap.add_argument("--no-layers", action="store_true", help="only the --models")
    ap.add_argument("--threads", type=int, default=None, help="ORT's intra-op threads (default: one per core)")
    args = ap.parse_args()
    if args.kernel:
        os.environ["EPIFUSE_CPU_KERNEL"] = args.kernel  # read when a session creates its kernels
    preload_onednn()  # a baseline installed with --target finds no libdnnl.so.3 by its RUNPATH
    libraries = [args.baseline, args.candidate or str(library_path())]
    rng = np.random.default_rng(0)
    rows = []
    for path in args.models:
        base, cand = compare(onnx.load(path), libraries, args.blocks, max(args.runs // 2, 6), max(args.runs // 6, 2),
                             args.threads)
        rows.append((os.path.basename(path), "whole model", base, cand))
        print(f"{path}: baseline {base:.1f} us, candidate {cand:.1f} us", flush=True)
    for name, h, c, k, r, activation, *groups in [] if args.no_layers else LAYERS:
        model = layer_model(h, c, k, r, activation, rng, *groups)
        base, cand = compare(model, libraries, args.blocks, args.runs, args.runs // 3, args.threads)
        rows.append((name, f"{c}->{k} {r}x{r}{' depthwise' if groups else ''} @{h}x{h} {activation}", base, cand))
        print(f"{name}: baseline {base:.1f} us, candidate {cand:.1f} us", flush=True)
    if not args.no_layers:
        base, cand = compare(chain_model(rng), libraries, args.blocks, args.runs, args.runs // 3, args.threads)
        rows.append((f"chain of {CHAIN_NODES} 1x1 (per node)", f"{CHAIN_CHANNELS}->{CHAIN_CHANNELS} 1x1 @1x1 relu",
                     base / CHAIN_NODES, cand / CHAIN_NODES))
    print(f"\nbaseline {libraries[0]}\ncandidate {libraries[1]}\nEPIFUSE_CPU_KERNEL={args.kernel or '(unset)'}, "
          f"onnxruntime {ort.__version__}, {args.threads or os.cpu_count()} threads\n")
    print("| layer | shape | baseline µs | candidate µs | speed-up |")
    print("|---|---|---:|---:|---:|")
    for name, shape, base, cand in rows:
        print(f"| {name} | {shape} | {base:.1f} | {cand:.1f} | {base / cand:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
