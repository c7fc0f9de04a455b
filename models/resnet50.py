"""Full-size ResNets (torchvision layout) with random weights, for benchmarks rather than tests.

`resnet50()` is torchvision's ResNet-50 (v1.5: the stride on the bottleneck's 3x3), ≈25.6 M
parameters, ≈100 MB as fp32 ONNX; `resnet18()` the basic-block ResNet-18, ≈11.7 M, ≈47 MB. Both
are written the way the PyTorch exporter writes them (Conv without bias → BatchNormalization →
Relu; the residual Add before the block's last Relu; GlobalAveragePool → Flatten → Gemm), with
He-initialised weights and non-trivial BatchNorm statistics, fp32, opset 17.

They live in `LARGE`, not in `models.zoo.ZOO`: the test suite iterates ZOO and must stay fast.
"""
from __future__ import annotations

from collections.abc import Callable

import onnx

from models.builder import BatchDim, GraphBuilder

DYNAMIC_BATCH = "batch"
EXPANSION = 4


def _stem(g: GraphBuilder, x: str) -> str:
    with g.scope("conv1"):
        x = g.op("Relu", [g.conv_bn(x, 3, 64, 7, stride=2)])
    return g.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])


def _head(g: GraphBuilder, x: str, in_features: int, num_classes: int) -> None:
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    with g.scope("fc"):
        g.output(g.gemm(x, in_features, num_classes), "output")


def _bottleneck(g: GraphBuilder, x: str, in_channels: int, width: int, stride: int) -> str:
    out_channels = width * EXPANSION
    with g.scope("conv1"):
        y = g.op("Relu", [g.conv_bn(x, in_channels, width, 1)])
    with g.scope("conv2"):
        y = g.op("Relu", [g.conv_bn(y, width, width, 3, stride=stride)])
    with g.scope("conv3"):
        y = g.conv_bn(y, width, out_channels, 1, gain=1.0)
    shortcut = x
    if stride != 1 or in_channels != out_channels:
        with g.scope("downsample"):
            shortcut = g.conv_bn(x, in_channels, out_channels, 1, stride=stride, gain=1.0)
    return g.op("Relu", [g.op("Add", [y, shortcut])])


def _basic_block(g: GraphBuilder, x: str, in_channels: int, width: int, stride: int) -> str:
    with g.scope("conv1"):
        y = g.op("Relu", [g.conv_bn(x, in_channels, width, 3, stride=stride)])
    with g.scope("conv2"):
        y = g.conv_bn(y, width, width, 3, gain=1.0)
    shortcut = x
    if stride != 1 or in_channels != width:
        with g.scope("downsample"):
            shortcut = g.conv_bn(x, in_channels, width, 1, stride=stride, gain=1.0)
    return g.op("Relu", [g.op("Add", [y, shortcut])])


def _resnet(name: str, block: str, layers: list[int], *, batch: BatchDim, image_size: int,
            seed: int, num_classes: int) -> onnx.ModelProto:
    g = GraphBuilder(name, opset=17, seed=seed)
    x = _stem(g, g.input("input", 3, image_size, image_size, batch=batch))
    expansion = EXPANSION if block == "bottleneck" else 1
    make_block = _bottleneck if block == "bottleneck" else _basic_block
    channels = 64
    for stage, (blocks, width) in enumerate(zip(layers, (64, 128, 256, 512)), start=1):
        for i in range(blocks):
            with g.scope(f"layer{stage}.{i}"):
                x = make_block(g, x, channels, width, 2 if i == 0 and stage > 1 else 1)
            channels = width * expansion
    _head(g, x, channels, num_classes)
    return g.build()


def resnet50(batch: BatchDim = DYNAMIC_BATCH, image_size: int = 224, seed: int = 0,
             num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision ResNet-50: bottleneck stages [3, 4, 6, 3], widths 64/128/256/512 × 4."""
    return _resnet("resnet50", "bottleneck", [3, 4, 6, 3], batch=batch, image_size=image_size,
                   seed=seed, num_classes=num_classes)


def resnet18(batch: BatchDim = DYNAMIC_BATCH, image_size: int = 224, seed: int = 0,
             num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision ResNet-18: basic-block stages [2, 2, 2, 2], widths 64/128/256/512."""
    return _resnet("resnet18", "basic", [2, 2, 2, 2], batch=batch, image_size=image_size,
                   seed=seed, num_classes=num_classes)


def parameter_count(model: onnx.ModelProto) -> int:
    """Number of weight elements (every initializer)."""
    total = 0
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        total += n
    return total


LARGE: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet50,
}

__all__ = ["LARGE", "resnet50", "resnet18", "parameter_count"]
