"""A full-size YOLOv8 (ultralytics layout) for benchmarks, built like the zoo's yolo_tiny: the n/s/m
scales by width and depth multipliers, 640x640 input, three-level Detect head (box and class
branches per level, concatenated). Random weights, non-trivial BatchNorm; for timing, not accuracy.
Not in the zoo (tests iterate the zoo): `yolov8(scale="s")`."""
from __future__ import annotations

import onnx

from models.builder import BatchDim, GraphBuilder
from models.zoo import _sppf, _yolo_conv

SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768)}


def _c2f(g: GraphBuilder, x: str, c_in: int, c_out: int, n: int, shortcut: bool) -> str:
    """C2f: cv1, split into halves, n bottlenecks chained on the second half (each output kept),
    concat of all, cv2. The bottleneck's residual is added after its activation."""
    hidden = c_out // 2
    with g.scope("cv1"):
        y = _yolo_conv(g, x, c_in, 2 * hidden, 1)
    parts = g.op("Split", [y, g.constant([hidden, hidden], dtype="int64")], num_outputs=2, axis=1)
    b = parts[1]
    for i in range(n):
        with g.scope(f"m.{i}"):
            with g.scope("cv1"):
                t = _yolo_conv(g, b, hidden, hidden, 3)
            with g.scope("cv2"):
                t = _yolo_conv(g, t, hidden, hidden, 3)
            b = g.op("Add", [b, t]) if shortcut else t
        parts.append(b)
    with g.scope("cv2"):
        return _yolo_conv(g, g.op("Concat", parts, axis=1), (2 + n) * hidden, c_out, 1)


def yolov8(scale: str = "s", *, batch: BatchDim = "batch", size: int = 640, classes: int = 80) -> onnx.ModelProto:
    depth, width, max_channels = SCALES[scale]
    ch = lambda c: min(int(c * width), max_channels)  # noqa: E731
    rep = lambda n: max(round(n * depth), 1)  # noqa: E731
    g = GraphBuilder(f"yolov8{scale}", opset=17, seed=8)
    x = g.input("images", 3, size, size, batch=batch)
    layers = [("conv", 64, 2), ("conv", 128, 2), ("c2f", 128, 3), ("conv", 256, 2), ("c2f", 256, 6),
              ("conv", 512, 2), ("c2f", 512, 6), ("conv", 1024, 2), ("c2f", 1024, 3)]
    c, taps = 3, []
    for i, (kind, c_out, arg) in enumerate(layers):
        with g.scope(f"model.{i}"):
            if kind == "conv":
                x = _yolo_conv(g, x, c, ch(c_out), 3, stride=arg)
            else:
                x = _c2f(g, x, c, ch(c_out), rep(arg), shortcut=True)
        c = ch(c_out)
        taps.append(x)
    with g.scope("model.9"):
        p5 = _sppf(g, x, c)
    up = lambda t: g.op("Resize", [t, "", g.constant([1.0, 1.0, 2.0, 2.0])], mode="nearest",  # noqa: E731
                        coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    with g.scope("model.12"):
        h4 = _c2f(g, g.op("Concat", [up(p5), taps[6]], axis=1), ch(1024) + ch(512), ch(512), rep(3), False)
    with g.scope("model.15"):
        h3 = _c2f(g, g.op("Concat", [up(h4), taps[4]], axis=1), ch(512) + ch(256), ch(256), rep(3), False)
    with g.scope("model.16"):
        d3 = _yolo_conv(g, h3, ch(256), ch(256), 3, stride=2)
    with g.scope("model.18"):
        h4 = _c2f(g, g.op("Concat", [d3, h4], axis=1), ch(256) + ch(512), ch(512), rep(3), False)
    with g.scope("model.19"):
        d4 = _yolo_conv(g, h4, ch(512), ch(512), 3, stride=2)
    with g.scope("model.21"):
        h5 = _c2f(g, g.op("Concat", [d4, p5], axis=1), ch(512) + ch(1024), ch(1024), rep(3), False)
    box_ch, cls_ch = max(16, ch(256) // 4, 64), max(ch(256), min(classes, 100))
    for level, (t, c_in) in enumerate(((h3, ch(256)), (h4, ch(512)), (h5, ch(1024)))):
        branches = []
        for name, hidden, out in (("cv2", box_ch, 64), ("cv3", cls_ch, classes)):
            with g.scope(f"model.22.{name}.{level}"):
                with g.scope("0"):
                    y = _yolo_conv(g, t, c_in, hidden, 3)
                with g.scope("1"):
                    y = _yolo_conv(g, y, hidden, hidden, 3)
                with g.scope("2"):
                    branches.append(g.conv(y, hidden, out, 1, bias=True, gain=1.0))
        g.output(g.op("Concat", branches, axis=1), f"output{level}")
    return g.build()

