"""The channels-last region's own ops on ONNX Runtime's CPU EP, one op a micro-model, shapes as models see
them. (1) The graph input's NCHW → NHWC move: ORT's Transpose against epifuse::NchwToNhwc (the library's
row interleave), with a copy of the same bytes (numpy, one thread) as the floor. (2) The squeeze-excite
scale of an NHWC tensor: ORT's Mul by a [1, 1, 1, C] vector against epifuse::ChannelScale, and beside them
ORT's Mul of the same product in NCHW (what the original model runs), on the default threads and on one,
each side in blocks of runs in a session of its own, its pool spinning between runs as between a model's
nodes. (3) The global average pool of an NHWC tensor: ORT's ReduceMean over axes 1 and 2, the GEMV form
(Reshape, MatMul by a row of 1/(H*W), Reshape) and epifuse::ChannelMean, beside ORT's NCHW
GlobalAveragePool of the same tensor, timed the same way. (4) The layer norm over the channels: ORT's
LayerNormalization(axis=-1) against epifuse::LayerNorm, timed the same way. (5) The concat of NHWC
tensors along the channels: ORT's Concat(axis=3) against epifuse::ChannelConcat, beside ORT's Concat of
the same tensors in NCHW (axis=1, what the original model runs), timed the same way. (6) A range of the
channels of an NHWC tensor (a C2f chunk's second half, a CSP block's split): ORT's Slice(axes=[3]) against
epifuse::ChannelSlice, beside ORT's Slice of the NCHW tensor's channels, timed the same way. (7) A
depthwise conv and the squeeze-excite pool of its output: epifuse::FusedConv and epifuse::ChannelMean
against the one epifuse::FusedConvMean, timed the same way. (8) A squeeze-excite gate and the conv that
reads the gated tensor: epifuse::ChannelScale and epifuse::FusedConv against the one epifuse::FusedConvScaled,
timed the same way. (9) An inverted-residual block's expand 1x1 conv and the depthwise conv that reads it: two
epifuse::FusedConvs against the one epifuse::FusedPointwiseDepthwise (computed in bands of rows), timed the
same way: hot in a loop, where the expanded tensor stays in cache between runs (bench/cpu_pairs.py times
whole models with and without the pairs).

    python bench/cpu_layout.py [--runs 200]
                               [--only layout|scale|mean|norm|concat|slice|conv-mean|conv-scale|pointwise-depthwise]

Times are wall times of session.run, each side's median over interleaved runs; every side pays the
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
from optimizer.passes.channel_copy import OP_TYPE as CONCAT_OP
from optimizer.passes.channel_copy import SLICE_OP
from optimizer.passes.channel_mean import OP_TYPE as MEAN_OP
from optimizer.passes.channel_scale import OP_TYPE as SCALE_OP
from optimizer.passes.conv_mean import OP_TYPE as CONV_MEAN_OP
from optimizer.passes.conv_scale import OP_TYPE as CONV_SCALE_OP
from optimizer.passes.input_layout import OP_TYPE
from optimizer.passes.layer_norm import OP_TYPE as NORM_OP
from optimizer.passes.pointwise_depthwise import OP_TYPE as PAIR_OP
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


# (what it is, H, C): EfficientNet-B0's and MobileNetV3-Large's squeeze-excite inputs at 224x224
SCALES = [
    ("EfficientNet-B0 block 1", 112, 32),
    ("EfficientNet-B0 block 2", 56, 96),
    ("EfficientNet-B0 block 3", 56, 144),
    ("EfficientNet-B0 block 5", 28, 240),
    ("MobileNetV3-Large block 4", 28, 72),
    ("EfficientNet-B0 block 9", 14, 480),
    ("EfficientNet-B0 block 12", 14, 672),
    ("EfficientNet-B0 block 14", 7, 1152),
]

# (what it is, shape): ConvNeXt-T's norms at 224x224 (stages 1-4), a transformer neck's tokens, and the
# shortest rows the op takes
NORMS = [
    ("ConvNeXt-T stage 1", (1, 56, 56, 96)),
    ("ConvNeXt-T stage 2", (1, 28, 28, 192)),
    ("ConvNeXt-T stage 3", (1, 14, 14, 384)),
    ("ConvNeXt-T stage 4", (1, 7, 7, 768)),
    ("40 tokens of 120", (1, 40, 120)),
    ("32 values a row", (1, 16, 16, 32)),
]

# (what it is, H, channels of each input): YOLOv8n's C2f and neck concats at 640x640, CSPDarknet-S's at 256x256
CONCATS = [
    ("YOLOv8n C2f, stage 1", 160, (16, 16, 16)),
    ("YOLOv8n C2f, stage 2", 80, (32, 32, 32, 32)),
    ("YOLOv8n C2f, stage 3", 40, (64, 64, 64, 64)),
    ("YOLOv8n neck, 80x80", 80, (64, 128)),
    ("YOLOv8n SPPF", 20, (128, 128, 128, 128)),
    ("CSPDarknet-S stage 1", 64, (32, 32)),
    ("CSPDarknet-S stage 3", 16, (128, 128)),
]

# (what it is, H, C, start, end): the channel ranges YOLOv8n's C2f blocks (after concat_of_slices) and
# CSPDarknet-S's stages read at 640x640 and 256x256
SLICES = [
    ("YOLOv8n C2f, stage 1", 160, 32, 16, 32),
    ("YOLOv8n C2f, stage 2", 80, 64, 32, 64),
    ("YOLOv8n C2f, stage 3", 40, 128, 64, 128),
    ("CSPDarknet-S stage 1, first half", 64, 64, 0, 32),
    ("CSPDarknet-S stage 3", 16, 256, 128, 256),
]

WARM_RUNS = 100  # a new session's first runs of a small op read up to 1.5x slower


def _micro_model(nodes: list, feeds: dict[str, np.ndarray], inits: list = (), outputs=("y",)) -> bytes:
    """A model of `nodes` reading float32 inputs named and shaped as `feeds`, writing `outputs` (epifuse's
    domain imported), serialized."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in feeds.items()]
    graph = helper.make_graph(nodes, "micro", inputs,
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
                              list(inits))
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("epifuse", 1)]).SerializeToString()


def _outputs(model: bytes, feeds: dict, threads: int | None = None) -> list:
    """The outputs of one run of `model` in a session of its own (`threads` intra-op threads, None: ORT's
    default), closed before anything is timed."""
    session = ort.InferenceSession(model, session_options(threads=threads), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _timed_in_blocks(models: dict, feeds: dict, runs: int, threads: int | None = None,
                     blocks: int = 4) -> dict[str, float]:
    """Each model's median wall time (µs) on `threads` intra-op threads (None: ORT's default): `blocks`
    blocks a side in turn, each block in a session of its own, opened after the previous side's is closed
    (no other pool spins), its pool spinning between runs as between a model's nodes; a block's first
    WARM_RUNS not counted."""
    times: dict[str, list[float]] = {side: [] for side in models}
    for _ in range(blocks):
        for side, model in models.items():
            session = ort.InferenceSession(model, session_options(threads=threads), providers=["CPUExecutionProvider"])
            for i in range(runs // blocks + WARM_RUNS):
                start = time.perf_counter()
                session.run(None, feeds[side])
                if i >= WARM_RUNS:
                    times[side].append(time.perf_counter() - start)
            del session
    return {side: float(np.median(t)) * 1e6 for side, t in times.items()}


def scale_table(runs: int) -> list[str]:
    lines = ["| squeeze-excite input | 1 x H x W x C | threads | ORT Mul, NHWC µs | ChannelScale µs | speed-up | "
             "ORT Mul, NCHW µs |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, h, c in SCALES:
        rng = np.random.default_rng(0)
        x, s = rng.standard_normal((1, h, h, c)).astype(np.float32), rng.standard_normal((1, 1, 1, c)).astype(np.float32)
        models = {"ort": ("Mul", "", x, s), "epifuse": (SCALE_OP, "epifuse", x, s),
                  "nchw": ("Mul", "", np.ascontiguousarray(x.transpose(0, 3, 1, 2)), s.reshape(1, c, 1, 1))}
        for threads in (None, 1):
            feeds = {side: {"x": xs, "s": ss} for side, (_, _, xs, ss) in models.items()}
            serialized = {side: _micro_model([helper.make_node(op, ["x", "s"], ["y"], domain=domain)], feeds[side])
                          for side, (op, domain, _, _) in models.items()}
            assert np.array_equal(_outputs(serialized["epifuse"], feeds["epifuse"], threads)[0], x * s)
            us = _timed_in_blocks(serialized, feeds, runs, threads)
            lines.append(f"| {name} | 1x{h}x{h}x{c} | {threads or 'default'} | {us['ort']:.0f} | {us['epifuse']:.0f} | "
                         f"{us['ort'] / us['epifuse']:.2f}x | {us['nchw']:.0f} |")
    return lines


def mean_table(runs: int) -> list[str]:
    lines = ["| squeeze-excite pool | 1 x H x W x C | threads | ORT ReduceMean, NHWC µs | GEMV µs | ChannelMean µs | "
             "speed-up (best ORT form) | ORT GlobalAveragePool, NCHW µs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, h, c in SCALES:
        x = np.random.default_rng(0).standard_normal((1, h, h, c)).astype(np.float32)
        row = helper.make_tensor("row", TensorProto.FLOAT, [1, h * h], np.full(h * h, 1.0 / (h * h), np.float32))
        to_rows = helper.make_tensor("to_rows", TensorProto.INT64, [3], [0, h * h, -1])
        to_nhwc = helper.make_tensor("to_nhwc", TensorProto.INT64, [4], [0, 1, 1, -1])
        sides = {
            "reduce": ([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, 2], keepdims=1)], [], x),
            "gemv": ([helper.make_node("Reshape", ["x", "to_rows"], ["rows"]),
                      helper.make_node("MatMul", ["row", "rows"], ["sums"]),
                      helper.make_node("Reshape", ["sums", "to_nhwc"], ["y"])], [row, to_rows, to_nhwc], x),
            "epifuse": ([helper.make_node(MEAN_OP, ["x"], ["y"], domain="epifuse")], [], x),
            "nchw": ([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [],
                     np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
        }
        feeds = {side: {"x": xs} for side, (_, _, xs) in sides.items()}
        serialized = {side: _micro_model(nodes, feeds[side], inits) for side, (nodes, inits, _) in sides.items()}
        expected = x.astype(np.float64).mean(axis=(1, 2), keepdims=True)
        np.testing.assert_allclose(_outputs(serialized["epifuse"], feeds["epifuse"])[0], expected, rtol=1e-5, atol=1e-6)
        for threads in (None, 1):
            us = _timed_in_blocks(serialized, feeds, runs, threads)
            best_ort = min(us["reduce"], us["gemv"])
            lines.append(f"| {name} | 1x{h}x{h}x{c} | {threads or 'default'} | {us['reduce']:.0f} | {us['gemv']:.0f} | "
                         f"{us['epifuse']:.0f} | {best_ort / us['epifuse']:.2f}x | {us['nchw']:.0f} |")
    return lines


def norm_table(runs: int) -> list[str]:
    lines = ["| layer norm input | shape | threads | ORT LayerNormalization µs | LayerNorm µs | speed-up | "
             "relative L2 |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, shape in NORMS:
        rng = np.random.default_rng(0)
        c = shape[-1]
        x = rng.standard_normal(shape).astype(np.float32)
        inits = [onnx.numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), what)
                 for what in ("scale", "bias")]
        serialized = {
            "ort": _micro_model([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1,
                                                  epsilon=1e-6)], {"x": x}, inits),
            "epifuse": _micro_model([helper.make_node(NORM_OP, ["x", "scale", "bias"], ["y"], domain="epifuse",
                                                      epsilon=1e-6)], {"x": x}, inits)}
        feeds = {side: {"x": x} for side in serialized}
        results = [_outputs(serialized[side], {"x": x})[0] for side in ("ort", "epifuse")]
        error = float(np.linalg.norm(results[1] - results[0]) / np.linalg.norm(results[0]))
        assert error < 1e-5, (name, error)
        for threads in (None, 1):
            us = _timed_in_blocks(serialized, feeds, runs, threads)
            lines.append(f"| {name} | {'x'.join(map(str, shape))} | {threads or 'default'} | {us['ort']:.0f} | "
                         f"{us['epifuse']:.0f} | {us['ort'] / us['epifuse']:.2f}x | {error:.0e} |")
    return lines


def concat_table(runs: int) -> list[str]:
    lines = ["| concat | H x W, channels | threads | ORT Concat, NHWC µs | ChannelConcat µs | speed-up | "
             "ORT Concat, NCHW µs |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, h, channels in CONCATS:
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1, h, h, c)).astype(np.float32) for c in channels]
        names = [f"x{i}" for i in range(len(xs))]
        serialized, feeds = {}, {}
        for side, node, data in (
                ("ort", helper.make_node("Concat", names, ["y"], axis=3), xs),
                ("epifuse", helper.make_node(CONCAT_OP, names, ["y"], domain="epifuse"), xs),
                ("nchw", helper.make_node("Concat", names, ["y"], axis=1),
                 [np.ascontiguousarray(x.transpose(0, 3, 1, 2)) for x in xs])):
            feeds[side] = dict(zip(names, data))
            serialized[side] = _micro_model([node], feeds[side])
        assert np.array_equal(_outputs(serialized["epifuse"], feeds["epifuse"])[0], np.concatenate(xs, axis=3))
        for threads in (None, 1):
            us = _timed_in_blocks(serialized, feeds, runs, threads)
            lines.append(f"| {name} | {h}x{h}, {'+'.join(map(str, channels))} | {threads or 'default'} | "
                         f"{us['ort']:.0f} | {us['epifuse']:.0f} | {us['ort'] / us['epifuse']:.2f}x | {us['nchw']:.0f} |")
    return lines


def slice_table(runs: int) -> list[str]:
    lines = ["| slice | 1 x H x W x C, channels | threads | ORT Slice, NHWC µs | ChannelSlice µs | speed-up | "
             "ORT Slice, NCHW µs |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, h, c, start, end in SLICES:
        x = np.random.default_rng(0).standard_normal((1, h, h, c)).astype(np.float32)
        bounds = lambda axis: [onnx.numpy_helper.from_array(np.array([v], np.int64), n)  # noqa: E731
                               for n, v in (("starts", start), ("ends", end), ("axes", axis))]
        serialized, feeds = {}, {}
        for side, node, data, inits in (
                ("ort", helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]), x, bounds(3)),
                ("epifuse", helper.make_node(SLICE_OP, ["x"], ["y"], domain="epifuse", start=start, end=end), x, []),
                ("nchw", helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
                 np.ascontiguousarray(x.transpose(0, 3, 1, 2)), bounds(1))):
            feeds[side] = {"x": data}
            serialized[side] = _micro_model([node], feeds[side], inits)
        assert np.array_equal(_outputs(serialized["epifuse"], feeds["epifuse"])[0], x[..., start:end])
        for threads in (None, 1):
            us = _timed_in_blocks(serialized, feeds, runs, threads)
            lines.append(f"| {name} | 1x{h}x{h}x{c}, [{start}, {end}) | {threads or 'default'} | {us['ort']:.0f} | "
                         f"{us['epifuse']:.0f} | {us['ort'] / us['epifuse']:.2f}x | {us['nchw']:.0f} |")
    return lines


# (what it is, H, C, filter size, stride): the depthwise convs whose outputs squeeze-excite blocks pool, at 224x224
CONV_MEANS = [
    ("EfficientNet-B0 block 1", 112, 32, 3, 1),
    ("EfficientNet-B0 block 2", 112, 96, 3, 2),
    ("EfficientNet-B0 block 3", 56, 144, 3, 1),
    ("EfficientNet-B0 block 4", 28, 240, 5, 1),
    ("EfficientNet-B0 block 6", 14, 480, 3, 1),
    ("EfficientNet-B0 block 9", 14, 672, 5, 2),
    ("EfficientNet-B0 block 10", 7, 1152, 5, 1),
    ("MobileNetV3-Large block 4", 56, 72, 5, 2),
    ("MobileNetV3-Large block 12", 14, 672, 3, 1),
    ("MobileNetV3-Large block 14", 7, 960, 5, 1),
]


def _two_nodes_against_one(name: str, shape: str, serialized: dict, feeds: dict, runs: int) -> list[str]:
    """The table rows of two nodes ("two") against the one op that merges them ("epifuse"), on the default
    threads and on one."""
    rows = []
    for threads in (None, 1):
        us = _timed_in_blocks(serialized, feeds, runs, threads)
        rows.append(f"| {name} | {shape} | {threads or 'default'} | {us['two']:.0f} | {us['epifuse']:.0f} | "
                    f"{us['two'] / us['epifuse']:.2f}x |")
    return rows


def conv_mean_table(runs: int) -> list[str]:
    lines = ["| depthwise conv + squeeze-excite pool | 1 x H x W x C, filter / stride | threads | "
             "FusedConv + ChannelMean µs | FusedConvMean µs | speed-up |", "|---|---|---:|---:|---:|---:|"]
    for name, h, c, r, stride in CONV_MEANS:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, h, h, c)).astype(np.float32)
        w = helper.make_tensor("w", TensorProto.FLOAT, [c, r, r, 1],
                               (rng.standard_normal((c, r, r)) / r).astype(np.float32))
        b = helper.make_tensor("b", TensorProto.FLOAT, [c], rng.standard_normal(c).astype(np.float32))
        attrs = dict(group=c, strides=[stride] * 2, pads=[r // 2] * 4, activation="silu", domain="epifuse")
        sides = {"two": [helper.make_node("FusedConv", ["x", "w", "b"], ["y"], **attrs),
                         helper.make_node(MEAN_OP, ["y"], ["m"], domain="epifuse")],
                 "epifuse": [helper.make_node(CONV_MEAN_OP, ["x", "w", "b"], ["y", "m"], **attrs)]}
        feeds = {side: {"x": x} for side in sides}
        serialized = {side: _micro_model(nodes, feeds[side], [w, b], ("y", "m")) for side, nodes in sides.items()}
        (y, m), (y2, m2) = (_outputs(serialized[side], feeds[side]) for side in ("two", "epifuse"))
        # the same sums, by another kernel where a rule gives the plain conv oneDNN's (Zen 5)
        assert np.linalg.norm(y2 - y) <= 1e-6 * np.linalg.norm(y)
        np.testing.assert_allclose(m2, m, rtol=1e-5, atol=1e-6)
        lines += _two_nodes_against_one(name, f"1x{h}x{h}x{c}, {r}x{r} / {stride}", serialized, feeds, runs)
    return lines


# (what it is, H, C, K): the squeeze-excite projections (1x1 convs of the gated tensor), at 224x224
CONV_SCALES = [
    ("EfficientNet-B0 block 1", 112, 32, 16),
    ("EfficientNet-B0 block 3", 56, 144, 24),
    ("EfficientNet-B0 block 5", 28, 240, 40),
    ("EfficientNet-B0 block 8", 14, 480, 80),
    ("EfficientNet-B0 block 11", 14, 672, 112),
    ("EfficientNet-B0 block 15", 7, 1152, 192),
    ("MobileNetV3-Large block 5", 28, 120, 40),
    ("MobileNetV3-Large block 11", 14, 480, 112),
    ("MobileNetV3-Large block 12", 14, 672, 112),
    ("MobileNetV3-Large block 14", 7, 960, 160),
]


def conv_scale_table(runs: int) -> list[str]:
    lines = ["| squeeze-excite gate + projection | 1 x H x W x C -> K | threads | ChannelScale + FusedConv µs | "
             "FusedConvScaled µs | speed-up |", "|---|---|---:|---:|---:|---:|"]
    for name, h, c, k in CONV_SCALES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, h, h, c)).astype(np.float32)
        s = rng.uniform(0.0, 1.0, (1, 1, 1, c)).astype(np.float32)
        w = helper.make_tensor("w", TensorProto.FLOAT, [k, 1, 1, c],
                               (rng.standard_normal((k, c)) / np.sqrt(c)).astype(np.float32))
        b = helper.make_tensor("b", TensorProto.FLOAT, [k], rng.standard_normal(k).astype(np.float32))
        sides = {"two": [helper.make_node(SCALE_OP, ["x", "s"], ["g"], domain="epifuse"),
                         helper.make_node("FusedConv", ["g", "w", "b"], ["y"], domain="epifuse")],
                 "epifuse": [helper.make_node(CONV_SCALE_OP, ["x", "w", "b", "s"], ["y"], domain="epifuse")]}
        feeds = {side: {"x": x, "s": s} for side in sides}
        serialized = {side: _micro_model(nodes, feeds[side], [w, b]) for side, nodes in sides.items()}
        y, y2 = (_outputs(serialized[side], feeds[side])[0] for side in ("two", "epifuse"))
        assert np.linalg.norm(y2 - y) <= 1e-6 * np.linalg.norm(y)  # the same sums, rounded in another order
        lines += _two_nodes_against_one(name, f"1x{h}x{h}x{c} -> {k}", serialized, feeds, runs)
    return lines


# (what it is, H, C, K, depthwise filter, stride, activation of both): expand 1x1 conv C -> K, then the
# depthwise conv over K channels, at 224x224
PAIRS = [
    ("MobileNetV2 block 2", 112, 16, 96, 3, 2, "relu6"),
    ("MobileNetV2 block 3", 56, 24, 144, 3, 1, "relu6"),
    ("MobileNetV2 block 4", 56, 24, 144, 3, 2, "relu6"),
    ("MobileNetV2 block 5", 28, 32, 192, 3, 1, "relu6"),
    ("MobileNetV2 block 8", 14, 64, 384, 3, 1, "relu6"),
    ("MobileNetV3-Large block 2", 112, 16, 64, 3, 2, "relu"),
    ("MobileNetV3-Large block 3", 56, 24, 72, 3, 1, "relu"),
    ("MobileNetV3-Large block 8", 14, 80, 200, 3, 1, "hardswish"),
]


def pointwise_depthwise_table(runs: int) -> list[str]:
    lines = ["| expand 1x1 + depthwise conv | 1 x H x W x C -> K, filter / stride | threads | FusedConv + FusedConv µs | "
             "FusedPointwiseDepthwise µs | speed-up |", "|---|---|---:|---:|---:|---:|"]
    for name, h, c, k, r, stride, activation in PAIRS:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, h, h, c)).astype(np.float32)
        act = dict(activation="clip", activation_params=[0.0, 6.0]) if activation == "relu6" else dict(activation=activation)
        w = helper.make_tensor("w", TensorProto.FLOAT, [k, 1, 1, c],
                               (rng.standard_normal((k, c)) / np.sqrt(c)).astype(np.float32))
        b = helper.make_tensor("b", TensorProto.FLOAT, [k], rng.standard_normal(k).astype(np.float32))
        dw = helper.make_tensor("dw", TensorProto.FLOAT, [k, r, r, 1],
                                (rng.standard_normal((k, r, r)) / r).astype(np.float32))
        db = helper.make_tensor("db", TensorProto.FLOAT, [k], rng.standard_normal(k).astype(np.float32))
        depthwise = dict(group=k, strides=[stride] * 2, pads=[r // 2] * 4, **act)
        pointwise = {f"pointwise_{key}": value for key, value in act.items()}
        sides = {"two": [helper.make_node("FusedConv", ["x", "w", "b"], ["e"], domain="epifuse", **act),
                         helper.make_node("FusedConv", ["e", "dw", "db"], ["y"], domain="epifuse", **depthwise)],
                 "epifuse": [helper.make_node(PAIR_OP, ["x", "w", "b", "dw", "db"], ["y"], domain="epifuse",
                                              **depthwise, **pointwise)]}
        feeds = {side: {"x": x} for side in sides}
        serialized = {side: _micro_model(nodes, feeds[side], [w, b, dw, db]) for side, nodes in sides.items()}
        y, y2 = (_outputs(serialized[side], feeds[side])[0] for side in ("two", "epifuse"))
        assert np.linalg.norm(y2 - y) <= 1e-6 * np.linalg.norm(y)  # the same sums, maybe by other kernels
        lines += _two_nodes_against_one(name, f"1x{h}x{h}x{c} -> {k}, {r}x{r} / {stride}", serialized, feeds, runs)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--only", choices=["layout", "scale", "mean", "norm", "concat", "slice", "conv-mean",
                                       "conv-scale", "pointwise-depthwise"],
                    help="one table instead of all")
    args = ap.parse_args()
    print(f"\n{_cpu_name()}, {os.cpu_count()} threads, onnxruntime {ort.__version__}, epifuse {__version__}, "
          f"Python {platform.python_version()}\n")
    tables = {"scale": scale_table, "mean": mean_table, "norm": norm_table, "concat": concat_table,
              "slice": slice_table, "conv-mean": conv_mean_table, "conv-scale": conv_scale_table,
              "pointwise-depthwise": pointwise_depthwise_table}
    if args.only in tables:
        print("\n".join(tables[args.only](args.runs)))
        return 0
    rows = []
    for name, *shape in SHAPES:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        sides = {
            "ort": helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1]),
            "epifuse": helper.make_node(OP_TYPE, ["x"], ["y"], domain="epifuse"),
        }
        sessions = {side: ort.InferenceSession(_micro_model([node], {"x": x}), session_options(),
                                               providers=["CPUExecutionProvider"])
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
    print("| input | N x C x H x W | ORT Transpose µs | NchwToNhwc µs | speed-up | copy floor µs |")
    print("|---|---|---:|---:|---:|---:|")
    for name, shape, ort_us, ours_us, copy_us in rows:
        print(f"| {name} | {shape} | {ort_us:.0f} | {ours_us:.0f} | {ort_us / ours_us:.2f}x | {copy_us:.0f} |")
    if args.only is None:
        for table in tables.values():
            print()
            print("\n".join(table(args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
