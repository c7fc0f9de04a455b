"""The YOLOv8 of models/yolo.py as a PyTorch module, for the PyTorch eager and torch.compile columns
of bench/ort_models.py (no ultralytics on the GPU machine, and onnx2torch's conversion of the ONNX
graph does not survive CUDA-graph capture). Same layers in the same order as the ONNX builder, so
`from_onnx` can copy the ONNX model's weights (conv and BatchNorm tensors in graph order) and the two
compute the same function: tests/test_torch_yolo.py checks that against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from models.yolo import SCALES


class Conv(nn.Module):
    """ultralytics Conv: Conv (no bias) → BatchNorm → SiLU."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-5)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))


class C2f(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool):
        super().__init__()
        self.hidden, self.shortcut = c_out // 2, shortcut
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.m = nn.ModuleList(nn.Sequential(Conv(self.hidden, self.hidden, 3), Conv(self.hidden, self.hidden, 3))
                               for _ in range(n))
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)

    def forward(self, x):
        parts = list(self.cv1(x).split(self.hidden, dim=1))
        b = parts[1]
        for m in self.m:
            b = b + m(b) if self.shortcut else m(b)
            parts.append(b)
        return self.cv2(torch.cat(parts, dim=1))


class SPPF(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c // 2, 1), Conv(2 * c, c, 1)

    def forward(self, x):
        pooled = [self.cv1(x)]
        for _ in range(3):
            pooled.append(F.max_pool2d(pooled[-1], 5, 1, 2))
        return self.cv2(torch.cat(pooled, dim=1))


class YOLOv8(nn.Module):
    def __init__(self, scale: str = "s", classes: int = 80):
        super().__init__()
        depth, width, max_channels = SCALES[scale]
        ch = lambda c: min(int(c * width), max_channels)  # noqa: E731
        rep = lambda n: max(round(n * depth), 1)  # noqa: E731
        layers, c = [], 3
        for kind, c_out, arg in [("conv", 64, 2), ("conv", 128, 2), ("c2f", 128, 3), ("conv", 256, 2), ("c2f", 256, 6),
                                 ("conv", 512, 2), ("c2f", 512, 6), ("conv", 1024, 2), ("c2f", 1024, 3)]:
            layers.append(Conv(c, ch(c_out), 3, arg) if kind == "conv" else C2f(c, ch(c_out), rep(arg), True))
            c = ch(c_out)
        self.backbone = nn.ModuleList(layers)
        self.sppf = SPPF(c)
        self.h4 = C2f(ch(1024) + ch(512), ch(512), rep(3), False)
        self.h3 = C2f(ch(512) + ch(256), ch(256), rep(3), False)
        self.d3 = Conv(ch(256), ch(256), 3, 2)
        self.h4b = C2f(ch(256) + ch(512), ch(512), rep(3), False)
        self.d4 = Conv(ch(512), ch(512), 3, 2)
        self.h5 = C2f(ch(512) + ch(1024), ch(1024), rep(3), False)
        box_ch, cls_ch = max(16, ch(256) // 4, 64), max(ch(256), min(classes, 100))
        self.heads = nn.ModuleList(
            nn.ModuleList(nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, out, 1))
                          for hidden, out in ((box_ch, 64), (cls_ch, classes)))
            for c_in in (ch(256), ch(512), ch(1024)))

    def forward(self, x):
        taps = []
        for layer in self.backbone:
            x = layer(x)
            taps.append(x)
        p5 = self.sppf(x)
        up = lambda t: F.interpolate(t, scale_factor=2.0, mode="nearest")  # noqa: E731
        h4 = self.h4(torch.cat([up(p5), taps[6]], 1))
        h3 = self.h3(torch.cat([up(h4), taps[4]], 1))
        h4 = self.h4b(torch.cat([self.d3(h3), h4], 1))
        h5 = self.h5(torch.cat([self.d4(h4), p5], 1))
        return tuple(torch.cat([branch(t) for branch in head], 1) for head, t in zip(self.heads, (h3, h4, h5)))

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto, scale: str = "s", classes: int = 80) -> "YOLOv8":
        """The module with the ONNX model's weights: each Conv's and BatchNorm's initializers in graph
        order go to this module's Conv2d and BatchNorm2d layers in construction order (the builder
        and __init__ create them in the same order; the forward order differs, the weights do not)."""
        net = cls(scale, classes).eval()
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        onnx_layers = [[inits[name] for name in node.input[1:] if name in inits]
                       for node in model.graph.node if node.op_type in ("Conv", "BatchNormalization")]
        torch_layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
        if len(onnx_layers) != len(torch_layers):
            raise ValueError(f"{len(onnx_layers)} ONNX conv/BN layers, {len(torch_layers)} in the module")
        with torch.no_grad():
            for layer, arrays in zip(torch_layers, onnx_layers):
                targets = ([layer.weight, layer.bias, layer.running_mean, layer.running_var]
                           if isinstance(layer, nn.BatchNorm2d) else [layer.weight] + ([layer.bias] if layer.bias
                                                                                        is not None else []))
                if len(targets) != len(arrays):
                    raise ValueError(f"{layer}: {len(arrays)} ONNX tensors for {len(targets)} parameters")
                for t, a in zip(targets, arrays):
                    if tuple(t.shape) != a.shape:
                        raise ValueError(f"{layer}: ONNX tensor of shape {a.shape} for a {tuple(t.shape)} parameter")
                    t.copy_(torch.from_numpy(np.array(a, dtype=np.float32)))
        return net
