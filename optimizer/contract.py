"""The epifuse::FusedConv op contract (shared/docs/fusedconv-op.md, v1) as Python data.

The plugins implement the same table in plugins/core; tests/test_contract.py checks both agree.
"""
from __future__ import annotations

DOMAIN = "epifuse"
OP_TYPE = "FusedConv"
OPSET_VERSION = 1
PLUGIN_NAMESPACE = "epifuse"
PLUGIN_VERSION = "1"

# activation name -> default parameters (the number of parameters is fixed per activation)
ACTIVATIONS: dict[str, tuple[float, ...]] = {
    "identity": (),
    "relu": (),
    "leaky_relu": (0.01,),
    "clip": (float("-inf"), float("inf")),
    "sigmoid": (),
    "tanh": (),
    "silu": (),
    "hardsigmoid": (0.2, 0.5),
    "hardswish": (),
    "gelu": (),
    "gelu_tanh": (),
    "mish": (),
    "elu": (1.0,),
    "softplus": (),
}

RESIDUAL_MODES = ("none", "pre", "post")  # in the C ABI's order (epifuse_conv_desc.residual)

TARGETS = ("ort-cpu", "ort-cuda", "tensorrt")
CUDA_TARGETS = ("ort-cuda", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16")
# `--precision fp32-strict`: fp32 without TF32 (FusedConv's allow_tf32 left 0) on the CUDA targets
STRICT_FP32 = "fp32-strict"
# The ONNX element types (TensorProto) of the FusedConv dtypes: by precision, and by numpy dtype name
FLOAT, FLOAT16, BFLOAT16 = 1, 10, 16
PRECISION_CODES = {"fp32": FLOAT, "fp16": FLOAT16, "bf16": BFLOAT16}
PRECISION_OF_CODE = {code: name for name, code in PRECISION_CODES.items()}
DTYPE_CODES = {"float32": FLOAT, "float16": FLOAT16, "bfloat16": BFLOAT16}
