"""Precision (optional): run the model in float16 or bfloat16 where the target has kernels for it.

Each node is low-precision when its op has a kernel of that dtype on the target (FusedConv always
does); float tensors it produces and float constants only it reads become low precision, and a
Cast is inserted on each edge where producer and consumer disagree. Graph inputs and outputs keep
their dtype, so callers feed and read what they did before. Constants are converted once from
their (already BN-folded, fp32) values, i.e. rounded once.
"""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .. import contract
from ..errors import EpifuseError
from ..graph import make_constant, make_variable, set_inputs, set_outputs, unique_name
from ..report import Report

LOW_DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
ONNX_TYPES = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
FLOAT32 = np.dtype(np.float32)

_MOVE = {"Transpose", "Identity", "Reshape", "Flatten", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze"}
# ops with CPU-EP kernels in float16 (probed on onnxruntime 1.32); bfloat16 on CPU moves data only
_CPU_FP16 = _MOVE | {
    "Abs", "Add", "AveragePool", "Clip", "Conv", "Div", "Elu", "Erf", "Exp", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "HardSigmoid", "HardSwish", "LayerNormalization", "LeakyRelu", "Log", "MatMul", "Max", "MaxPool",
    "Min", "Mul", "Neg", "Pad", "Pow", "Reciprocal", "ReduceMean", "Relu", "Resize", "Sigmoid", "Softmax",
    "Softplus", "Sqrt", "Sub", "Tanh", "Where",
}
# ops whose output dtype is set by an attribute, or that compute indices/shapes: left alone on GPU targets
_GPU_EXCLUDED = {"Cast", "CastLike", "ConstantOfShape", "Shape", "Size", "Range", "RandomNormal", "RandomUniform",
                 "RandomNormalLike", "RandomUniformLike", "EyeLike", "NonZero", "TopK", "ArgMax", "ArgMin", "Loop",
                 "If", "Scan", "BatchNormalization", "InstanceNormalization"}
_READS_DIMS_ONLY = {"Shape", "Size"}
# inputs that must stay float32 whatever the data dtype (Resize's roi and scales)
_FP32_INPUTS = {"Resize": {1, 2}}
_TYPE_STRS = {"fp16": "tensor(float16)", "bf16": "tensor(bfloat16)"}


@functools.lru_cache(maxsize=None)
def _admitted(op: str, opset: int, precision: str, n_inputs: int) -> tuple[bool, frozenset[int]] | None:
    """Whether the ONNX schema of `op` at `opset` lets its first output be `precision`, and which of its
    `n_inputs` inputs then do not admit it (they stay float32); None for an op ONNX does not define. bfloat16
    came to ops one opset at a time: at opset 17 Conv, MaxPool, GlobalAveragePool and HardSwish refuse
    it, and a model holding such a node is invalid (ONNX Runtime will not load it)."""
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    want = _TYPE_STRS[precision]

    def admits(type_str: str) -> bool:
        return want in allowed.get(type_str, {type_str})  # a fixed type ("tensor(float)") admits only itself

    if not schema.outputs or not admits(schema.outputs[0].type_str):
        return False, frozenset()
    params = schema.inputs
    refused = set()
    for i in range(n_inputs):
        formal = params[i] if i < len(params) else params[-1] if params and \
            params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic else None
        if formal is not None and not admits(formal.type_str):
            refused.add(i)
    return True, frozenset(refused)


# the library's CPU ops with bfloat16 kernels, which follow their data as move ops do (`_follow_producers`)
_CPU_BF16_LIBRARY_OPS = {"ChannelScale", "ChannelMean", "ChannelConcat", "ChannelSlice"}
_DATA_IS_INPUT_0 = {"ChannelScale", "ChannelMean", "ChannelSlice"}  # a concat's data is every input


def _runs_low(node: gs.Node, target: str, precision: str, opset: int) -> bool:
    if node.op == contract.OP_TYPE and node.domain == contract.DOMAIN:
        return True
    if node.domain == contract.DOMAIN and target == "ort-cpu" and precision == "bf16":
        return node.op in _CPU_BF16_LIBRARY_OPS
    if node.domain not in (None, "", "ai.onnx"):
        return False
    if target == "ort-cpu":
        return node.op in (_CPU_FP16 if precision == "fp16" else _MOVE)
    admitted = _admitted(node.op, opset, precision, len(node.inputs))
    return node.op not in _GPU_EXCLUDED and (admitted is None or admitted[0])


def _follow_producers(graph: gs.Graph, low_nodes: set[int]) -> set[int]:
    """On the CPU EP bfloat16 only moves data, and the library's channel scale, mean, concat and slice have bf16 kernels:
    such an op runs low where its float data comes from low-precision nodes (a Transpose or Concat of
    FusedConv outputs, the scale of a FusedConv's output), else it stays float32 (a Flatten between a pool
    and a Gemm, which would otherwise get two Casts and a rounding for nothing). Of a channel scale only X
    counts: its small S is cast where it differs. `graph` in topological order."""
    kept = set()
    for node in graph.nodes:
        if id(node) not in low_nodes:
            continue
        library_op = node.domain == contract.DOMAIN and node.op in _CPU_BF16_LIBRARY_OPS
        if not library_op and (node.op not in _MOVE or node.domain not in (None, "", "ai.onnx")):
            kept.add(id(node))
            continue
        inputs = node.inputs[:1] if library_op and node.op in _DATA_IS_INPUT_0 else node.inputs
        data = [t for t in inputs if t.name and not isinstance(t, gs.Constant) and _is_float32(t)]
        if data and all(t.inputs and id(t.inputs[0]) in kept for t in data):
            kept.add(id(node))
    return kept


def _is_float32(t: gs.Tensor) -> bool:
    dtype = t.values.dtype if isinstance(t, gs.Constant) else t.dtype
    try:
        return dtype is not None and np.dtype(dtype) == FLOAT32
    except TypeError:
        return False


def precision(graph: gs.Graph, report: Report, precision: str, target: str) -> gs.Graph:
    if precision == "fp32":
        return graph
    if precision == "bf16" and graph.opset < 13:
        raise EpifuseError(f"bf16 needs ai.onnx opset 13 or newer (Cast and Transpose admit bfloat16 from 13); "
                           f"the model is opset {graph.opset} (onnx.version_converter.convert_version can raise it, "
                           f"or use --precision fp16)")
    low = LOW_DTYPES[precision]
    low_nodes = {id(n) for n in graph.nodes if _runs_low(n, target, precision, graph.opset)}
    if target == "ort-cpu" and precision == "bf16":
        graph.toposort()  # producers before their consumers
        low_nodes = _follow_producers(graph, low_nodes)
    casts: dict[tuple[str, str], gs.Tensor] = {}
    converted: dict[str, gs.Constant] = {}
    graph_outputs = {id(t) for t in graph.outputs}
    original_nodes = list(graph.nodes)

    def cast(t: gs.Tensor, to: str) -> gs.Tensor:
        key = (t.name, to)
        if key not in casts:
            dtype = low if to == precision else FLOAT32
            out = make_variable(graph, f"{t.name}_{to}", dtype, t.shape)
            graph.nodes.append(gs.Node("Cast", name=unique_name(graph, f"{t.name}_cast_{to}"),
                                       attrs={"to": ONNX_TYPES[to] if to != "fp32" else onnx.TensorProto.FLOAT},
                                       inputs=[t], outputs=[out]))
            casts[key] = out
            report.canonicalized[f"Cast inserted ({precision})"] += 1
        return casts[key]

    # 1. float tensors produced by low-precision nodes change dtype; graph outputs keep theirs
    for node in original_nodes:
        if id(node) not in low_nodes:
            continue
        new_outputs = []
        for o in node.outputs:
            if not _is_float32(o):
                new_outputs.append(o)
            elif id(o) in graph_outputs:
                inner = make_variable(graph, f"{o.name}_{precision}", low, o.shape)
                graph.nodes.append(gs.Node("Cast", name=unique_name(graph, f"{o.name}_cast_out"),
                                           attrs={"to": onnx.TensorProto.FLOAT}, inputs=[inner], outputs=[o]))
                new_outputs.append(inner)
            else:
                o.dtype = low
                new_outputs.append(o)
        set_outputs(node, new_outputs)
    # 2. every edge into an original node gets the dtype that node runs in; Shape and Size read only the
    # dims, of any dtype (a Cast there would copy a whole feature map to learn its shape)
    for node in original_nodes:
        if node.op in _READS_DIMS_ONLY and node.domain in (None, "", "ai.onnx"):
            continue
        wants_low = id(node) in low_nodes
        admitted = _admitted(node.op, graph.opset, precision, len(node.inputs)) \
            if node.domain in (None, "", "ai.onnx") else None
        keep = _FP32_INPUTS.get(node.op, set()) | (admitted[1] if admitted else set())
        new_inputs = []
        for i, t in enumerate(node.inputs):
            if not t.name or i in keep:
                if t.name and wants_low and not isinstance(t, gs.Constant) and t.dtype is not None and \
                        np.dtype(t.dtype) == low:
                    t = cast(t, "fp32")  # a position the schema keeps float32 on a low-precision node
                new_inputs.append(t)
                continue
            if isinstance(t, gs.Constant):
                if wants_low and _is_float32(t):
                    if t.name not in converted:
                        converted[t.name] = make_constant(graph, f"{t.name}_{precision}", t.values.astype(low))
                    t = converted[t.name]
                new_inputs.append(t)
                continue
            is_low = t.dtype is not None and np.dtype(t.dtype) == low
            if wants_low and _is_float32(t):
                t = cast(t, precision)
            elif not wants_low and is_low:
                t = cast(t, "fp32")
            new_inputs.append(t)
        set_inputs(node, new_inputs)
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
