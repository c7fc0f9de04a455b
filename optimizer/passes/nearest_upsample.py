"""Channels-last nearest upsampling by whole pixels as a broadcast copy, where the target runs that
faster: a nearest Resize of [N, H, W, C] by integer factors (a, b) on H and W, the form the layout
pass gives an NCHW Upsample inside an NHWC region (YOLO's necks, FPNs), becomes

    Reshape [N, H, 1, W, 1, C]  →  Expand [N, H, a, W, b, C]  →  Reshape [N, H*a, W*b, C]

which copies each pixel's C channels a*b times: the same values, exactly.

Why, on ort-cpu: ONNX Runtime's CPU Resize on a channels-last tensor computes a source index per
element, 1.5-4x slower than Expand's block copies for C >= 16 (2-core AMD EPYC with AVX-512, 1 and 2
threads, inputs from 10x10x512 to 160x160x16 upsampled by 2: 80x80x64 took 1.77 ms against 0.48 on one
thread), while at C = 4 Expand's 16-byte copies lose (0.21 against 0.17 ms). In the model the original
Upsample runs in ORT's NCHWc layout at about Expand's speed, so this gives back what moving it into NHWC
cost. Not on the GPU targets: not measured there.

The rewrite is made only where the Resize's index mapping (its coordinate transformation and nearest
mode, ONNX's formulas) sends output pixel i to input pixel floor(i / a) for every i, which is what the
copy does; H, W and C must be static.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import attr_text, constant_value, make_constant, make_variable, shape_of
from ..report import Report

MIN_CHANNELS = 16  # below, Expand's per-pixel copies are too short to beat Resize (see above)
TARGETS = ("ort-cpu",)


def _source_index(i: int, scale: int, length: int, transform: str, nearest: str) -> int | None:
    """ONNX Resize's nearest source index of output index `i` (None: a mode this pass does not take, or
    a coordinate so close to a rounding boundary that float32 arithmetic could round it either way)."""
    out_length = length * scale
    if transform == "half_pixel":
        x = (i + 0.5) / scale - 0.5
    elif transform == "pytorch_half_pixel":
        x = (i + 0.5) / scale - 0.5 if out_length > 1 else 0.0
    elif transform == "asymmetric":
        x = i / scale
    elif transform == "tf_half_pixel_for_nn":
        x = (i + 0.5) / scale
    else:
        return None  # align_corners, half_pixel_symmetric, tf_crop_and_resize: not a whole-pixel copy
    fraction = x - math.floor(x)
    if nearest in ("round_prefer_floor", "round_prefer_ceil"):
        if abs(fraction - 0.5) < 1e-3 and fraction != 0.5:
            return None
        tie_up = nearest == "round_prefer_ceil"
        index = math.floor(x) + (1 if fraction > 0.5 or (fraction == 0.5 and tie_up) else 0)
    elif nearest in ("floor", "ceil"):
        if 0 < fraction < 1e-3 or fraction > 1 - 1e-3:
            return None
        index = math.floor(x) if nearest == "floor" else math.ceil(x)
    else:
        return None
    return min(max(index, 0), length - 1)


def _copies_whole_pixels(length: int, scale: int, transform: str, nearest: str) -> bool:
    return all(_source_index(i, scale, length, transform, nearest) == i // scale for i in range(length * scale))


def _factors(node: gs.Node) -> tuple[int, int] | None:
    """(a, b) when `node` is a nearest Resize of a static [N, H, W, C] tensor by integer factors a, b on H
    and W alone (scales or sizes), its mapping a whole-pixel copy, and C >= MIN_CHANNELS."""
    if node.op != "Resize" or attr_text(node, "mode", "nearest") != "nearest":
        return None
    if "axes" in node.attrs or int(node.attrs.get("antialias", 0)):
        return None
    if attr_text(node, "keep_aspect_ratio_policy", "stretch") != "stretch":  # opset 18: may shrink what sizes say
        return None
    shape = shape_of(node.inputs[0])
    if not shape or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    if shape[3] < MIN_CHANNELS:
        return None
    inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
    roi = inputs[1]
    if roi is not None and roi.name and (constant_value(roi) is None or constant_value(roi).size):
        return None
    scales = constant_value(inputs[2]) if inputs[2] is not None and inputs[2].name else None
    sizes = constant_value(inputs[3]) if inputs[3] is not None and inputs[3].name else None
    if scales is not None and scales.size == 4:
        factors = [float(v) for v in scales]
    elif sizes is not None and sizes.size == 4 and isinstance(shape[0], int):  # a symbolic batch: sizes may resize it
        factors = [int(s) / d for s, d in zip(sizes, shape)]
    else:
        return None  # scales or sizes computed at run time, or neither
    if factors[0] != 1.0 or factors[3] != 1.0:
        return None
    a, b = factors[1], factors[2]
    if not (a.is_integer() and b.is_integer() and a >= 1 and b >= 1) or a * b == 1:
        return None
    a, b = int(a), int(b)
    transform = attr_text(node, "coordinate_transformation_mode", "half_pixel")
    nearest = attr_text(node, "nearest_mode", "round_prefer_floor")
    if not all(_copies_whole_pixels(n, f, transform, nearest) for n, f in ((shape[1], a), (shape[2], b))):
        return None
    return a, b


def nearest_upsample(graph: gs.Graph, report: Report, target: str) -> gs.Graph:
    if target not in TARGETS or (graph.opset or 0) < 11:  # Resize-10 has none of the mode attributes
        return graph
    done = 0
    for node in list(graph.nodes):
        factors = _factors(node) if node.outputs else None
        if factors is None:
            continue
        (a, b), (_, h, w, c) = factors, shape_of(node.inputs[0])
        x, y, base = node.inputs[0], node.outputs[0], node.name or "resize"
        pixels = make_variable(graph, f"{base}_pixels", x.dtype, None)
        copies = make_variable(graph, f"{base}_copies", x.dtype, None)
        shape = lambda name, dims: make_constant(graph, f"{base}_{name}", np.array(dims, np.int64))  # noqa: E731
        node.outputs.clear()
        graph.nodes += [
            gs.Node("Reshape", f"{base}_split_pixels", inputs=[x, shape("pixels_shape", [0, h, 1, w, 1, c])],
                    outputs=[pixels]),
            # a 1 in Expand's shape broadcasts: the batch stays the input's, symbolic or not
            gs.Node("Expand", f"{base}_copy_pixels", inputs=[pixels, shape("copies_shape", [1, h, a, w, b, c])],
                    outputs=[copies]),
            gs.Node("Reshape", f"{base}_join_pixels", inputs=[copies, shape("out_shape", [0, h * a, w * b, c])],
                    outputs=[y]),
        ]
        done += 1
    if not done:
        return graph
    report.canonicalized[f"NHWC nearest Resize → Expand ({target})"] += done
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
