"""The embedded model zoo: tiny random-weight versions of the CNN families epifuse targets.

Every builder writes its network the way that family's usual exporter does (NCHW, Conv →
BatchNormalization → activation, the exporter's own spelling of each activation), takes
`batch` (a size, or the name of a symbolic dimension) and returns a checked `onnx.ModelProto`.
Weights are random (He-style, so activations stay O(1)) and BatchNorm statistics non-trivial
(ConvNeXt alone has no BatchNorm: it normalises with LayerNorm). Scalar constants are
initializers, except in convnext_tiny and ppocr_tiny, which write `Constant` nodes as the
TorchScript exporter and Paddle2ONNX do.
"""
from __future__ import annotations

from collections.abc import Callable

import onnx

from models.activations import (gelu_erf, gelu_tanh, hard_swish_paddle,
                                 hard_swish_via_hard_sigmoid, mish_decomposed, silu)
from models.builder import BatchDim, GraphBuilder

DYNAMIC_BATCH = "batch"


# --------------------------------------------------------------------------------- ResNet
def _basic_block(g: GraphBuilder, x: str, channels: int) -> str:
    with g.scope("conv1"):
        y = g.op("Relu", [g.conv_bn(x, channels, channels, 3)])
    with g.scope("conv2"):
        y = g.conv_bn(y, channels, channels, 3)
    # torchvision adds the identity before the block's last ReLU
    return g.op("Relu", [g.op("Add", [y, x])])


def _bottleneck(g: GraphBuilder, x: str, in_channels: int, width: int, out_channels: int,
                stride: int) -> str:
    with g.scope("conv1"):
        y = g.op("Relu", [g.conv_bn(x, in_channels, width, 1)])
    with g.scope("conv2"):  # ResNet v1.5: the stride sits on the 3x3
        y = g.op("Relu", [g.conv_bn(y, width, width, 3, stride=stride)])
    with g.scope("conv3"):
        y = g.conv_bn(y, width, out_channels, 1, gain=1.0)
    with g.scope("downsample"):
        shortcut = g.conv_bn(x, in_channels, out_channels, 1, stride=stride, gain=1.0)
    return g.op("Relu", [g.op("Add", [y, shortcut])])


def resnet_tiny(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 64,
                num_classes: int = 10) -> onnx.ModelProto:
    """ResNet: 7x7/2 stem, MaxPool, two basic blocks, one strided bottleneck with a projection
    shortcut, GlobalAveragePool → Flatten → Gemm."""
    g = GraphBuilder("resnet_tiny", opset=17, seed=1)
    x = g.input("input", 3, size, size, batch=batch)
    with g.scope("stem"):
        x = g.op("Relu", [g.conv_bn(x, 3, 16, 7, stride=2)])
        x = g.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    for i in range(2):
        with g.scope(f"layer1.{i}"):
            x = _basic_block(g, x, 16)
    with g.scope("layer2.0"):
        x = _bottleneck(g, x, 16, 16, 64, stride=2)
    with g.scope("fc"):
        x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
        g.output(g.gemm(x, 64, num_classes), "output")
    return g.build()


# ---------------------------------------------------------------------------------- YOLOv8
def _yolo_conv(g: GraphBuilder, x: str, in_channels: int, out_channels: int, kernel: int,
               stride: int = 1) -> str:
    """ultralytics Conv: Conv → BN → SiLU, SiLU exported as Mul(x, Sigmoid(x))."""
    return silu(g, g.conv_bn(x, in_channels, out_channels, kernel, stride=stride))


def _c2f(g: GraphBuilder, x: str, in_channels: int, out_channels: int, *, shortcut: bool) -> str:
    """C2f with one bottleneck: cv1, chunk into halves, bottleneck on the second half (residual
    added after its activation), concat all three, cv2."""
    hidden = out_channels // 2
    with g.scope("cv1"):
        y = _yolo_conv(g, x, in_channels, 2 * hidden, 1)
    halves = g.op("Split", [y, g.constant([hidden, hidden], dtype="int64")], num_outputs=2, axis=1)
    with g.scope("m.0"):
        with g.scope("cv1"):
            b = _yolo_conv(g, halves[1], hidden, hidden, 3)
        with g.scope("cv2"):
            b = _yolo_conv(g, b, hidden, hidden, 3)
        if shortcut:
            b = g.op("Add", [halves[1], b])
    y = g.op("Concat", [halves[0], halves[1], b], axis=1)
    with g.scope("cv2"):
        return _yolo_conv(g, y, 3 * hidden, out_channels, 1)


def _sppf(g: GraphBuilder, x: str, channels: int) -> str:
    hidden = channels // 2
    with g.scope("cv1"):
        y = _yolo_conv(g, x, channels, hidden, 1)
    pooled = [y]
    for _ in range(3):
        pooled.append(g.op("MaxPool", [pooled[-1]], kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                           strides=[1, 1]))
    y = g.op("Concat", pooled, axis=1)
    with g.scope("cv2"):
        return _yolo_conv(g, y, 4 * hidden, channels, 1)


def _detect_branch(g: GraphBuilder, x: str, channels: int, outputs: int) -> str:
    """One level of the Detect head: Conv block, then a plain 1x1 conv with bias (no BN)."""
    with g.scope("0"):
        y = _yolo_conv(g, x, channels, channels, 3)
    with g.scope("1"):
        return g.conv(y, channels, outputs, 1, bias=True, gain=1.0)


def yolo_tiny(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 64,
              num_outputs: int = 8) -> onnx.ModelProto:
    """YOLOv8: Conv/C2f backbone to stride 16, SPPF, a nearest-upsample + concat neck, and a
    two-level detect head (outputs at stride 8 and stride 16)."""
    g = GraphBuilder("yolo_tiny", opset=17, seed=2)
    x = g.input("images", 3, size, size, batch=batch)
    with g.scope("model.0"):
        x = _yolo_conv(g, x, 3, 16, 3, stride=2)
    with g.scope("model.1"):
        x = _yolo_conv(g, x, 16, 32, 3, stride=2)
    with g.scope("model.2"):
        x = _c2f(g, x, 32, 32, shortcut=True)
    with g.scope("model.3"):
        x = _yolo_conv(g, x, 32, 64, 3, stride=2)
    with g.scope("model.4"):
        p8 = _c2f(g, x, 64, 64, shortcut=True)
    with g.scope("model.5"):
        x = _yolo_conv(g, p8, 64, 64, 3, stride=2)
    with g.scope("model.6"):
        p16 = _sppf(g, x, 64)
    with g.scope("model.7"):
        up = g.op("Resize", [p16, "", g.constant([1.0, 1.0, 2.0, 2.0])],
                  coordinate_transformation_mode="asymmetric", mode="nearest",
                  nearest_mode="floor")
    with g.scope("model.8"):
        x = g.op("Concat", [up, p8], axis=1)
    with g.scope("model.9"):
        head8 = _c2f(g, x, 128, 32, shortcut=False)
    with g.scope("model.10.cv2.0"):
        g.output(_detect_branch(g, head8, 32, num_outputs), "output0")
    with g.scope("model.10.cv2.1"):
        g.output(_detect_branch(g, p16, 64, num_outputs), "output1")
    return g.build()


# --------------------------------------------------------------------------- MobileNetV3
def _squeeze_excite(g: GraphBuilder, x: str, channels: int, squeeze: int, *,
                    hidden_act: Callable[[GraphBuilder, str], str],
                    gate: Callable[[GraphBuilder, str], str]) -> str:
    """torchvision SqueezeExcitation: pool → fc1 (1x1 conv, bias) → act → fc2 → gate → scale·x."""
    s = g.op("GlobalAveragePool", [x])
    with g.scope("fc1"):
        s = hidden_act(g, g.conv(s, channels, squeeze, 1, bias=True))
    with g.scope("fc2"):
        s = gate(g, g.conv(s, squeeze, channels, 1, bias=True, gain=1.0))
    return g.op("Mul", [s, x])


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding for SE widths."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _relu(g: GraphBuilder, x: str) -> str:
    return g.op("Relu", [x])


def _hard_swish(g: GraphBuilder, x: str) -> str:
    return g.op("HardSwish", [x])


def _torch_hard_sigmoid(g: GraphBuilder, x: str) -> str:
    return g.op("HardSigmoid", [x], alpha=0.1666667, beta=0.5)


def _inverted_residual(g: GraphBuilder, x: str, in_channels: int, expanded: int,
                       out_channels: int, kernel: int, stride: int, *, use_se: bool,
                       act: Callable[[GraphBuilder, str], str]) -> str:
    y = x
    if expanded != in_channels:
        with g.scope("expand"):
            y = act(g, g.conv_bn(y, in_channels, expanded, 1))
    with g.scope("depthwise"):
        y = act(g, g.conv_bn(y, expanded, expanded, kernel, stride=stride, group=expanded))
    if use_se:
        with g.scope("se"):
            y = _squeeze_excite(g, y, expanded, _make_divisible(expanded // 4),
                                hidden_act=_relu, gate=_torch_hard_sigmoid)
    with g.scope("project"):
        y = g.conv_bn(y, expanded, out_channels, 1, gain=1.0)
    if stride == 1 and in_channels == out_channels:
        y = g.op("Add", [y, x])  # no activation after the residual in MobileNetV2/V3
    return y


def mobilenetv3_tiny(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 64,
                     num_classes: int = 10) -> onnx.ModelProto:
    """MobileNetV3: HardSwish stem, inverted residual blocks (ReLU early, HardSwish + SE later,
    3x3 and 5x5 depthwise, stride-2 depthwise), 1x1 head conv, Gemm classifier."""
    g = GraphBuilder("mobilenetv3_tiny", opset=17, seed=3)
    x = g.input("input", 3, size, size, batch=batch)
    with g.scope("features.0"):
        x = _hard_swish(g, g.conv_bn(x, 3, 16, 3, stride=2))
    #        (in, expanded, out, kernel, stride, SE, activation)
    blocks = [(16, 16, 16, 3, 1, False, _relu),
              (16, 64, 24, 3, 2, False, _relu),
              (24, 72, 24, 3, 1, False, _relu),
              (24, 72, 40, 5, 2, True, _hard_swish),
              (40, 120, 40, 5, 1, True, _hard_swish)]
    for i, (cin, exp, cout, k, s, se, act) in enumerate(blocks, start=1):
        with g.scope(f"features.{i}"):
            x = _inverted_residual(g, x, cin, exp, cout, k, s, use_se=se, act=act)
    with g.scope(f"features.{len(blocks) + 1}"):
        x = _hard_swish(g, g.conv_bn(x, 40, 96, 1))
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    with g.scope("classifier.0"):
        x = _hard_swish(g, g.gemm(x, 96, 128))
    with g.scope("classifier.3"):
        g.output(g.gemm(x, 128, num_classes), "output")
    return g.build()


# --------------------------------------------------------------------------- EfficientNet
def _effnet_silu(g: GraphBuilder, x: str) -> str:
    return silu(g, x, sigmoid_first=True)


def _sigmoid(g: GraphBuilder, x: str) -> str:
    return g.op("Sigmoid", [x])


def _mbconv(g: GraphBuilder, x: str, in_channels: int, out_channels: int, *, expand_ratio: int,
            kernel: int, stride: int) -> str:
    expanded = in_channels * expand_ratio
    y = x
    if expand_ratio != 1:
        with g.scope("expand"):
            y = _effnet_silu(g, g.conv_bn(y, in_channels, expanded, 1))
    with g.scope("depthwise"):
        y = _effnet_silu(g, g.conv_bn(y, expanded, expanded, kernel, stride=stride,
                                      group=expanded))
    with g.scope("se"):
        y = _squeeze_excite(g, y, expanded, max(1, in_channels // 4),
                            hidden_act=_effnet_silu, gate=_sigmoid)
    with g.scope("project"):
        y = g.conv_bn(y, expanded, out_channels, 1, gain=1.0)
    if stride == 1 and in_channels == out_channels:
        y = g.op("Add", [y, x])  # stochastic depth is the identity at inference
    return y


def efficientnet_tiny(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 64,
                      num_classes: int = 10) -> onnx.ModelProto:
    """EfficientNet: SiLU as Mul(Sigmoid(x), x), MBConv blocks with 3x3 and 5x5 depthwise convs
    and SiLU/Sigmoid squeeze-excite, 1x1 head conv, Gemm classifier."""
    g = GraphBuilder("efficientnet_tiny", opset=17, seed=4)
    x = g.input("input", 3, size, size, batch=batch)
    with g.scope("features.0"):
        x = _effnet_silu(g, g.conv_bn(x, 3, 16, 3, stride=2))
    #        (in, out, expand ratio, kernel, stride)
    blocks = [(16, 16, 1, 3, 1),
              (16, 24, 4, 3, 2),
              (24, 24, 4, 3, 1),
              (24, 40, 4, 5, 2),
              (40, 40, 4, 5, 1)]
    for i, (cin, cout, ratio, k, s) in enumerate(blocks, start=1):
        with g.scope(f"features.{i}"):
            x = _mbconv(g, x, cin, cout, expand_ratio=ratio, kernel=k, stride=s)
    with g.scope(f"features.{len(blocks) + 1}"):
        x = _effnet_silu(g, g.conv_bn(x, 40, 128, 1))
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    with g.scope("classifier.1"):
        g.output(g.gemm(x, 128, num_classes), "output")
    return g.build()


# ------------------------------------------------------------------------------- ConvNeXt
def _channels_last_layer_norm(g: GraphBuilder, x: str, channels: int) -> str:
    """LayerNorm on [N, H, W, C] over C, exported as LayerNormalization(axis=-1)."""
    scale = g.weight("weight", g.rng.uniform(0.5, 1.5, channels))
    bias = g.weight("bias", g.rng.normal(0.0, 0.1, channels))
    return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-6)


def _layer_norm_2d(g: GraphBuilder, x: str, channels: int) -> str:
    """LayerNorm over the channels of an NCHW tensor: permute to NHWC, normalise, permute back."""
    y = g.op("Transpose", [x], perm=[0, 2, 3, 1])
    y = _channels_last_layer_norm(g, y, channels)
    return g.op("Transpose", [y], perm=[0, 3, 1, 2])


def _linear_matmul(g: GraphBuilder, x: str, in_features: int, out_features: int,
                   gain: float) -> str:
    """nn.Linear on a >2-D tensor, exported as MatMul(x, Wᵀ) then Add(bias, ·)."""
    w = g.weight("weight_t", g.rng.normal(0.0, gain / in_features ** 0.5,
                                          (in_features, out_features)))
    b = g.weight("bias", g.rng.normal(0.0, 0.1, out_features))
    return g.op("Add", [b, g.op("MatMul", [x, w])])


def _convnext_block(g: GraphBuilder, x: str, dim: int) -> str:
    with g.scope("dwconv"):
        y = g.conv(x, dim, dim, 7, group=dim, bias=True, gain=1.0)
    y = g.op("Transpose", [y], perm=[0, 2, 3, 1])
    with g.scope("norm"):
        y = _channels_last_layer_norm(g, y, dim)
    with g.scope("pwconv1"):
        y = _linear_matmul(g, y, dim, 4 * dim, gain=2.0 ** 0.5)
    with g.scope("act"):
        y = gelu_erf(g, y)
    with g.scope("pwconv2"):
        y = _linear_matmul(g, y, 4 * dim, dim, gain=1.0)
    # layer scale: trained values are small; 0.1-0.5 keeps the residual branch visible
    y = g.op("Mul", [g.weight("gamma", g.rng.uniform(0.1, 0.5, dim)), y])
    y = g.op("Transpose", [y], perm=[0, 3, 1, 2])
    return g.op("Add", [x, y])  # drop path is the identity at inference


def convnext_tiny(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 64,
                  num_classes: int = 10) -> onnx.ModelProto:
    """ConvNeXt: 4x4/4 patchify stem + LayerNorm, blocks of 7x7 depthwise conv → LayerNorm →
    MLP with Erf-GELU → layer scale → residual, a LayerNorm + 2x2/2 conv downsampling layer.

    ConvNeXt has no BatchNormalization: this model covers LayerNorm, MatMul and Transpose
    around convolutions, and depthwise convs whose bias is their only epilogue."""
    g = GraphBuilder("convnext_tiny", opset=17, seed=5, constants="nodes")
    x = g.input("input", 3, size, size, batch=batch)
    dims = (24, 48)
    with g.scope("downsample_layers.0"):
        with g.scope("0"):
            x = g.conv(x, 3, dims[0], 4, stride=4, bias=True, gain=1.0, pads=[0, 0, 0, 0])
        with g.scope("1"):
            x = _layer_norm_2d(g, x, dims[0])
    for i in range(2):
        with g.scope(f"stages.0.{i}"):
            x = _convnext_block(g, x, dims[0])
    with g.scope("downsample_layers.1"):
        with g.scope("0"):
            x = _layer_norm_2d(g, x, dims[0])
        with g.scope("1"):
            x = g.conv(x, dims[0], dims[1], 2, stride=2, bias=True, gain=1.0, pads=[0, 0, 0, 0])
    with g.scope("stages.1.0"):
        x = _convnext_block(g, x, dims[1])
    x = g.op("GlobalAveragePool", [x])
    with g.scope("norm"):
        x = _layer_norm_2d(g, x, dims[1])
    with g.scope("head"):
        g.output(g.gemm(g.op("Flatten", [x], axis=1), dims[1], num_classes), "output")
    return g.build()


# --------------------------------------------------------------------------- PaddleOCR
def _paddle_conv_bn_hswish(g: GraphBuilder, x: str, in_channels: int, out_channels: int,
                           kernel: int, stride: int | tuple[int, int] = 1, group: int = 1,
                           **hswish_variant) -> str:
    y = g.conv_bn(x, in_channels, out_channels, kernel, stride=stride, group=group)
    return hard_swish_paddle(g, y, **hswish_variant)


def _paddle_hard_sigmoid(g: GraphBuilder, x: str) -> str:
    return g.op("HardSigmoid", [x], alpha=0.2, beta=0.5)


def _depthwise_separable(g: GraphBuilder, x: str, in_channels: int, out_channels: int,
                         kernel: int, stride: int | tuple[int, int], *, use_se: bool,
                         **hswish_variant) -> str:
    """PP-LCNet DepthwiseSeparable: dw conv+BN+hswish, optional SE, pw conv+BN+hswish."""
    with g.scope("dw_conv"):
        y = _paddle_conv_bn_hswish(g, x, in_channels, in_channels, kernel, stride,
                                   group=in_channels, **hswish_variant)
    if use_se:
        with g.scope("se"):
            y = _squeeze_excite(g, y, in_channels, in_channels // 4, hidden_act=_relu,
                                gate=_paddle_hard_sigmoid)
    with g.scope("pw_conv"):
        return _paddle_conv_bn_hswish(g, y, in_channels, out_channels, 1, **hswish_variant)


def ppocr_tiny(*, batch: BatchDim = DYNAMIC_BATCH, height: int = 32, width: int = 64,
               num_classes: int = 37) -> onnx.ModelProto:
    """PaddleOCR text recognizer on a PP-LCNet backbone, opset 11 as Paddle2ONNX writes it:
    hard-swish decomposed into Add/Clip/Mul/Div, depthwise separable blocks with (2, 1) strides
    that keep the text line's width, one SE, a 1x1 last conv, then Im2Seq (Squeeze, Transpose) and a CTC head."""
    g = GraphBuilder("ppocr_tiny", opset=11, seed=6, constants="nodes")
    x = g.input("input", 3, height, width, batch=batch)
    with g.scope("conv1"):
        x = _paddle_conv_bn_hswish(g, x, 3, 16, 3, stride=2)  # H/2, W/2
    with g.scope("blocks2.0"):
        x = _depthwise_separable(g, x, 16, 24, 3, 1, use_se=False, x_first=False)
    with g.scope("blocks3.0"):
        x = _depthwise_separable(g, x, 24, 32, 3, (2, 1), use_se=False)  # H/4
    with g.scope("blocks4.0"):
        x = _depthwise_separable(g, x, 32, 48, 5, (2, 1), use_se=True)  # H/8
    with g.scope("blocks5.0"):
        x = _depthwise_separable(g, x, 48, 48, 5, (2, 1), use_se=False)  # H/16
    with g.scope("last_conv"):
        x = _paddle_conv_bn_hswish(g, x, 48, 64, 1, divide=False)
    # collapse the remaining height (and halve the width) so each column is one time step
    x = g.op("MaxPool", [x], kernel_shape=[height // 16, 2], pads=[0, 0, 0, 0],
             strides=[height // 16, 2])
    with g.scope("neck"):
        x = g.op("Squeeze", [x], axes=[2])                       # [N, C, T]
        x = g.op("Transpose", [x], perm=[0, 2, 1])               # [N, T, C]
    with g.scope("head.fc"):
        w = g.weight("weight", g.rng.normal(0.0, 64 ** -0.5, (64, num_classes)))
        b = g.weight("bias", g.rng.normal(0.0, 0.1, num_classes))
        x = g.op("Add", [g.op("MatMul", [x, w]), b])
    g.output(g.op("Softmax", [x], axis=2), "output")
    return g.build()


# ---------------------------------------------------------------------------------- act_zoo
def _op(op_type: str, **attrs) -> Callable[[GraphBuilder, str], str]:
    return lambda g, x: g.op(op_type, [x], **attrs)


# Every activation formulation the optimizer recognises, in the order act_zoo chains them.
ACT_ZOO_ACTIVATIONS: list[tuple[str, Callable[[GraphBuilder, str], str]]] = [
    ("relu", _op("Relu")),
    ("leaky_relu", _op("LeakyRelu", alpha=0.1)),
    ("elu", _op("Elu", alpha=1.0)),
    ("softplus", _op("Softplus")),
    ("sigmoid", _op("Sigmoid")),
    ("tanh", _op("Tanh")),
    ("hard_sigmoid", _op("HardSigmoid", alpha=0.2, beta=0.5)),
    ("relu6", lambda g, x: g.op("Clip", [x, g.constant(0.0), g.constant(6.0)])),
    ("hard_swish", _op("HardSwish")),
    ("hard_swish_via_hard_sigmoid", hard_swish_via_hard_sigmoid),
    ("gelu", _op("Gelu")),
    ("gelu_tanh", _op("Gelu", approximate="tanh")),
    ("gelu_erf_decomposed", lambda g, x: gelu_erf(g, x, multiply_by_inv_sqrt2=True)),
    ("gelu_tanh_decomposed", gelu_tanh),
    ("mish", _op("Mish")),
    ("mish_decomposed", mish_decomposed),
    ("silu", silu),
    ("silu_sigmoid_first", lambda g, x: silu(g, x, sigmoid_first=True)),
]


def act_zoo(*, batch: BatchDim = DYNAMIC_BATCH, size: int = 16,
            channels: int = 16) -> onnx.ModelProto:
    """A chain of Conv → BN → activation, one link per entry of ACT_ZOO_ACTIVATIONS.
    Opset 20 so the Gelu op exists next to its decomposed forms."""
    g = GraphBuilder("act_zoo", opset=20, seed=7)
    x = g.input("input", 3, size, size, batch=batch)
    in_channels = 3
    for name, activation in ACT_ZOO_ACTIVATIONS:
        with g.scope(name):
            # gain 1.75 rather than He's √2: the GELU/Mish/SiLU links shrink small inputs, and
            # every activation should see pre-activations of order 1, not just its linear region
            x = activation(g, g.conv_bn(x, in_channels, channels, 3, gain=1.75))
        in_channels = channels
    g.output(x, "output")
    return g.build()


# ------------------------------------------------------------------------------------- zoo
ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet_tiny": resnet_tiny,
    "yolo_tiny": yolo_tiny,
    "mobilenetv3_tiny": mobilenetv3_tiny,
    "efficientnet_tiny": efficientnet_tiny,
    "convnext_tiny": convnext_tiny,
    "ppocr_tiny": ppocr_tiny,
    "act_zoo": act_zoo,
}

DEFAULT_MODEL = "resnet_tiny"


def build(name: str, **kwargs) -> onnx.ModelProto:
    """Build zoo model `name`; keyword arguments (e.g. batch=1) go to its builder."""
    try:
        builder = ZOO[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; the zoo has {', '.join(ZOO)}") from None
    return builder(**kwargs)


def default_model() -> onnx.ModelProto:
    """The demo's model: resnet_tiny with a static batch of 1."""
    return build(DEFAULT_MODEL, batch=1)
