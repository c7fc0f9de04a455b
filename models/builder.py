"""A small graph builder on top of `onnx.helper`: the zoo writes each network layer by layer with it.

Names follow the PyTorch exporter's scheme (node `/layer1/Conv`, tensor `/layer1/Conv_output_0`,
weight `layer1.conv.weight`) so the graphs read like real exports in Netron and in error messages.
Random weights come from one seeded numpy Generator per model, drawn in graph order, so building a
model twice gives identical bytes.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# A batch dimension is a fixed size or the name of a symbolic dimension.
BatchDim = int | str

# He initialisation gain for layers followed by a ReLU-like activation; 1.0 for linear layers.
RELU_GAIN = math.sqrt(2.0)


def _pair(value: int | Sequence[int]) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


class GraphBuilder:
    """Accumulates nodes and initializers of one model and turns them into a checked ModelProto.

    `constants` chooses how scalar constants are written, as the exporter being imitated does:
    "initializers" (torch.export / dynamo style) or "nodes" (`Constant` nodes, as the TorchScript
    exporter and Paddle2ONNX write them). Weights are always initializers.
    """

    def __init__(self, name: str, *, opset: int, seed: int, constants: str = "initializers"):
        if constants not in ("initializers", "nodes"):
            raise ValueError(f"constants must be 'initializers' or 'nodes', got {constants!r}")
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self._constants_as_nodes = constants == "nodes"
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._inputs: list[onnx.ValueInfoProto] = []
        self._output_names: list[str] = []
        self._batch: BatchDim = "batch"
        self._scopes: list[str] = []
        self._taken_names: set[str] = set()

    # ----------------------------------------------------------------------------------- naming
    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names of everything created inside the block with `name`."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def _unique(self, name: str) -> str:
        candidate, suffix = name, 0
        while candidate in self._taken_names:
            suffix += 1
            candidate = f"{name}_{suffix}"
        self._taken_names.add(candidate)
        return candidate

    # ------------------------------------------------------------------------- inputs, outputs
    def input(self, name: str, channels: int, height: int, width: int, *, batch: BatchDim) -> str:
        self._batch = batch
        self._taken_names.add(name)
        self._inputs.append(helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [batch, channels, height, width]))
        return name

    def output(self, value: str, name: str) -> None:
        """Make `value` a graph output called `name` by renaming the tensor (no Identity node)."""
        self._taken_names.add(name)
        for node in self._nodes:
            node.input[:] = [name if v == value else v for v in node.input]
            node.output[:] = [name if v == value else v for v in node.output]
        self._output_names.append(name)

    # ------------------------------------------------------------------------------- tensors
    def weight(self, leaf: str, array: np.ndarray) -> str:
        """A float32 initializer named after the current scope."""
        name = self._unique(".".join(self._scopes + [leaf]))
        self._initializers.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def constant(self, value: float | Sequence[float] | np.ndarray, dtype=np.float32) -> str:
        """A constant in the style this model's exporter writes (initializer or Constant node)."""
        array = np.asarray(value, dtype)
        if self._constants_as_nodes:
            return self.op("Constant", [], value=numpy_helper.from_array(array, "value"))
        name = self._unique("/".join(["", *self._scopes, "Constant"]) + "_value")
        self._initializers.append(numpy_helper.from_array(array, name))
        return name

    # ---------------------------------------------------------------------------------- nodes
    def op(self, op_type: str, inputs: Sequence[str], *, num_outputs: int = 1, **attrs):
        """Append one node; returns its output name, or a list of names when num_outputs > 1."""
        node_name = self._unique("/".join(["", *self._scopes, op_type]))
        outputs = [f"{node_name}_output_{i}" for i in range(num_outputs)]
        self._taken_names.update(outputs)
        self._nodes.append(helper.make_node(op_type, list(inputs), outputs, name=node_name, **attrs))
        return outputs[0] if num_outputs == 1 else outputs

    def conv(self, x: str, in_channels: int, out_channels: int, kernel: int | Sequence[int], *,
             stride: int | Sequence[int] = 1, group: int = 1, bias: bool = False,
             gain: float = RELU_GAIN, pads: Sequence[int] | None = None) -> str:
        """Conv with He-initialised weights; "same"-style padding k//2 unless `pads` is given."""
        kh, kw = _pair(kernel)
        fan_in = in_channels // group * kh * kw
        inputs = [x, self.weight("weight", self.rng.normal(
            0.0, gain / math.sqrt(fan_in), (out_channels, in_channels // group, kh, kw)))]
        if bias:
            inputs.append(self.weight("bias", self.rng.normal(0.0, 0.1, out_channels)))
        return self.op("Conv", inputs, dilations=[1, 1], group=group, kernel_shape=[kh, kw],
                       pads=list(pads) if pads is not None else [kh // 2, kw // 2] * 2,
                       strides=_pair(stride))

    def batch_norm(self, x: str, channels: int) -> str:
        """Inference-mode BatchNormalization with deliberately non-trivial running statistics,
        so folding it into the conv changes the weights and a wrong fold shows up numerically."""
        rng = self.rng
        with self.scope("bn"):
            params = [self.weight("weight", rng.uniform(0.5, 1.5, channels)),
                      self.weight("bias", rng.normal(0.0, 0.1, channels)),
                      self.weight("running_mean", rng.normal(0.0, 0.1, channels)),
                      self.weight("running_var", rng.uniform(0.5, 1.5, channels))]
            return self.op("BatchNormalization", [x, *params], epsilon=1e-5, momentum=0.9)

    def conv_bn(self, x: str, in_channels: int, out_channels: int, kernel: int | Sequence[int],
                **conv_kwargs) -> str:
        """Conv (no bias, as frameworks write a conv that a BatchNorm follows) → BatchNormalization."""
        return self.batch_norm(self.conv(x, in_channels, out_channels, kernel, **conv_kwargs),
                               out_channels)

    def gemm(self, x: str, in_features: int, out_features: int) -> str:
        """A Linear layer on a [N, features] tensor, exported as Gemm(transB=1) like PyTorch."""
        w = self.weight("weight", self.rng.normal(0.0, 1.0 / math.sqrt(in_features),
                                                  (out_features, in_features)))
        b = self.weight("bias", self.rng.normal(0.0, 0.1, out_features))
        return self.op("Gemm", [x, w, b], alpha=1.0, beta=1.0, transB=1)

    # ---------------------------------------------------------------------------------- model
    def build(self) -> onnx.ModelProto:
        """The checked model. Output shapes come from ONNX shape inference; their leading
        dimension is the batch dimension (inference loses a symbolic one through Flatten)."""
        untyped_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                           for n in self._output_names]
        graph = helper.make_graph(self._nodes, self.name, self._inputs, untyped_outputs,
                                  initializer=self._initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="epifuse.models", producer_version="1")
        # IR 8 covers opsets up to 18, IR 9 up to 20; both load on onnxruntime >= 1.21.
        model.ir_version = 8 if self.opset <= 18 else 9

        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        shapes = {v.name: v.type.tensor_type.shape for v in inferred.graph.output}
        for output in model.graph.output:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                    for d in shapes[output.name].dim]
            output.CopyFrom(helper.make_tensor_value_info(
                output.name, TensorProto.FLOAT, [self._batch, *dims[1:]]))
        onnx.checker.check_model(model, full_check=True)
        return model
