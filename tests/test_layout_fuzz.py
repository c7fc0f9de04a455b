"""A differential fuzzer for the folds and the layout pass: seeded random graphs in which fused convs
meet every op the layout pass moves Transposes through (Flatten at every axis, Reshape, Resize with
constant and computed sizes, scales and roi, Concat/Split/Slice with negative axes, Gather, Pad,
reductions, broadcasts from rank 1 to 5, Transpose), with symbolic and -1 dims, several outputs and
an initializer that is also a graph input; each optimized model is compared with ONNX Runtime on the
original. CI runs FUZZ_CASES seeds; EPIFUSE_FUZZ_CASES=2000 (say) is the long mode."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.verify import verify

FUZZ_CASES = int(os.environ.get("EPIFUSE_FUZZ_CASES", "150"))
BATCH = 2


class _Graph:
    """Builds a model while tracking every tensor's concrete shape (batch BATCH)."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self.shapes, self.n = rng, [], [], {}, 0
        self.outputs: list[str] = []
        self.extra_inputs: list[onnx.ValueInfoProto] = []

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name("k")
        value = np.asarray(value, dtype)
        self.inits.append(numpy_helper.from_array(value, name))
        self.shapes[name] = value.shape
        return name

    def op(self, op: str, inputs: list[str], shape, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        self.shapes[out] = tuple(shape)
        return out

    def conv_block(self, x: str, out_channels: int) -> str:
        n, c, h, w = self.shapes[x]
        k = int(self.rng.choice([1, 3]))
        wt = self.const(self.rng.standard_normal((out_channels, c, k, k)) * np.sqrt(2.0 / (c * k * k)))
        y = self.op("Conv", [x, wt, self.const(self.rng.normal(0, 0.1, out_channels))], (n, out_channels, h, w),
                    pads=[k // 2] * 4)
        if self.rng.random() < 0.5:
            bn = [self.const(self.rng.uniform(0.5, 1.5, out_channels)), self.const(self.rng.normal(0, .1, out_channels)),
                  self.const(self.rng.normal(0, .1, out_channels)), self.const(self.rng.uniform(0.5, 1.5, out_channels))]
            y = self.op("BatchNormalization", [y, *bn], self.shapes[y])
        act = str(self.rng.choice(["Relu", "Sigmoid", "silu", "none"]))
        if act == "silu":
            return self.op("Mul", [y, self.op("Sigmoid", [y], self.shapes[y])], self.shapes[y])
        return y if act == "none" else self.op(act, [y], self.shapes[y])


def _int64(g: _Graph, values) -> str:
    return g.const(values, np.int64)


def _layout_op(g: _Graph, x: str) -> str | None:
    """One op of the layout pass's kind on the 4-D tensor x; the new tensor, or None where the chain ends
    (its result became a graph output)."""
    n, c, h, w = g.shapes[x]
    rng = g.rng
    kind = str(rng.choice(["flatten", "reshape", "resize_const", "resize_computed", "resize_input_scales",
                           "concat", "split", "slice", "gather", "pad", "reduce", "broadcast", "transpose",
                           "pool", "conv"]))
    if kind == "flatten":
        axis = int(rng.integers(-4, 5))
        a = axis + 4 if axis < 0 else axis
        left = int(np.prod((n, c, h, w)[:a]))
        g.outputs.append(g.op("Flatten", [x], (left, n * c * h * w // left), axis=axis))
        return None
    if kind == "reshape":
        shape = [n, c * h, w, 1] if rng.random() < 0.5 else [n, -1]
        out = g.op("Reshape", [x, _int64(g, shape)], (n, c * h, w, 1) if len(shape) == 4 else (n, c * h * w))
        if len(shape) == 4:
            return out
        g.outputs.append(out)
        return None
    if kind in ("resize_const", "resize_computed", "resize_input_scales"):
        if kind == "resize_const" and rng.random() < 0.5:
            return g.op("Resize", [x, "", g.const([1, 1, 2, 2])], (n, c, 2 * h, 2 * w), mode="nearest")
        if kind == "resize_const":
            return g.op("Resize", [x, "", "", _int64(g, [n, c, h + 3, w + 1])], (n, c, h + 3, w + 1), mode="nearest")
        if kind == "resize_computed":  # the usual PyTorch export: sizes from Shape → Slice → Concat
            nc = g.op("Slice", [g.op("Shape", [x], (4,)), _int64(g, [0]), _int64(g, [2])], (2,))
            sizes = g.op("Concat", [nc, _int64(g, [2 * h, 2 * w])], (4,), axis=0)
            return g.op("Resize", [x, "", "", sizes], (n, c, 2 * h, 2 * w), mode="nearest")
        scales = g.name("scales")  # a graph input: known only at run time
        g.extra_inputs.append(helper.make_tensor_value_info(scales, TensorProto.FLOAT, [4]))
        roi = g.op("Mul", [scales, g.const(np.zeros(4))], (4,))  # a computed (empty-effect) roi, as exporters write
        roi = g.op("Concat", [roi, g.const(np.ones(4))], (8,), axis=0)
        return g.op("Resize", [x, roi, scales], (n, c, 2 * h, 2 * w), mode="nearest")
    if kind == "concat":
        other = g.conv_block(x, c) if rng.random() < 0.6 else x
        axis = int(rng.choice([1, -3, 2, -1]))
        a = axis + 4 if axis < 0 else axis
        shape = [n, c, h, w]
        shape[a] *= 2
        return g.op("Concat", [x, other], shape, axis=axis)
    if kind == "split" and c % 2 == 0:
        axis = int(rng.choice([1, -3]))
        first, second = g.name("split"), g.name("split")
        g.nodes.append(helper.make_node("Split", [x, _int64(g, [c // 2, c // 2])], [first, second],
                                        name=g.name("Split"), axis=axis))
        g.shapes[first] = g.shapes[second] = (n, c // 2, h, w)
        g.outputs.append(second)
        return first
    if kind == "slice":
        axis = int(rng.choice([-1, -2, 2, 3, 1]))
        a = axis + 4 if axis < 0 else axis
        size = (n, c, h, w)[a]
        if size < 2:
            return x
        shape = [n, c, h, w]
        shape[a] = size - 1
        return g.op("Slice", [x, _int64(g, [1]), _int64(g, [size]), _int64(g, [axis])], shape)
    if kind == "gather":
        out = g.op("Gather", [x, _int64(g, [0, c - 1])], (n, 2, h, w), axis=1)
        return out
    if kind == "pad":
        pads = [0, 0, 1, 2, 0, 0, 2, 1]
        return g.op("Pad", [x, _int64(g, pads)], (n, c, h + 3, w + 3), mode="constant")
    if kind == "reduce":
        op = str(rng.choice(["ReduceMean", "ReduceMax", "ReduceSum"]))
        axes = [int(rng.choice([2, 3, -1, 1]))]
        keep = int(rng.integers(0, 2))
        shape = [n, c, h, w]
        a = axes[0] + 4 if axes[0] < 0 else axes[0]
        if keep:
            shape[a] = 1
            return g.op(op, [x, _int64(g, axes)], shape, keepdims=1)
        del shape[a]
        g.outputs.append(g.op(op, [x, _int64(g, axes)], shape, keepdims=0))
        return None
    if kind == "broadcast":
        rank = int(rng.integers(1, 6))
        full = [1] * (rank - 4) + [1, c, h, w] if rank > 4 else [1, c, h, w][4 - rank:]  # never across the batch
        shape = [d if rng.random() < 0.5 else 1 for d in full]
        value = g.const(rng.standard_normal(shape))
        op = str(rng.choice(["Add", "Mul"]))
        out_shape = list(np.broadcast_shapes(tuple(shape), (n, c, h, w)))
        out = g.op(op, [x, value] if rng.random() < 0.5 else [value, x], out_shape)
        if len(out_shape) == 4:
            return out
        g.outputs.append(out)
        return None
    if kind == "transpose":
        perm = [int(p) for p in rng.permutation(4)]
        g.outputs.append(g.op("Transpose", [x], [(n, c, h, w)[p] for p in perm], perm=perm))
        return None
    if kind == "pool":
        return g.op("GlobalAveragePool", [x], (n, c, 1, 1))
    return g.conv_block(x, int(rng.choice([c, 2 * c])) if c <= 8 else c)


def fuzz_model(seed: int) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(seed)
    g = _Graph(rng)
    c, h, w = int(rng.choice([2, 4, 6])), int(rng.integers(4, 9)), int(rng.integers(4, 9))
    g.shapes["x"] = (BATCH, c, h, w)
    x = g.conv_block("x", c)
    for _ in range(int(rng.integers(1, 6))):
        if rng.random() < 0.25:
            g.outputs.append(x)  # a graph output in the middle of a region
        nxt = _layout_op(g, x)
        if nxt is None:
            x = g.conv_block("x", c) if rng.random() < 0.5 else None
            if x is None:
                break
        else:
            x = nxt
    if x is not None:
        g.outputs.append(x)
    batch = str(rng.choice(["static", "symbolic", "minus_one"]))
    dims = [BATCH if batch == "static" else ("N" if batch == "symbolic" else -1), c, h, w]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims), *g.extra_inputs]
    if rng.random() < 0.2 and g.inits:  # an initializer that is also a graph input (overridable)
        shared = g.inits[int(rng.integers(0, len(g.inits)))]
        if shared.data_type == TensorProto.FLOAT:
            inputs.append(helper.make_tensor_value_info(shared.name, TensorProto.FLOAT, list(shared.dims)))
    graph = helper.make_graph(g.nodes, f"fuzz{seed}", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in dict.fromkeys(g.outputs)],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)  # outputs declared with the shapes inference gives
    del model.graph.output[:]
    for out in inferred.graph.output:
        if not out.type.tensor_type.HasField("shape"):  # inference could not tell (scales known at run time)
            out = helper.make_tensor_value_info(out.name, TensorProto.FLOAT, [None] * len(g.shapes[out.name]))
        model.graph.output.append(out)
    feeds = {"x": rng.standard_normal((BATCH, c, h, w)).astype(np.float32)}
    for vi in g.extra_inputs:
        feeds[vi.name] = np.array([1, 1, 2, 2], np.float32)
    return model, feeds


@pytest.mark.parametrize("seed", range(FUZZ_CASES))
def test_fuzzed_graph_matches_onnx_runtime(seed):
    model, feeds = fuzz_model(seed)
    try:  # the generator's own mistakes, not the optimizer's
        onnx.checker.check_model(model)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"seed {seed}: the generated model does not check: {e}")
    optimized, _ = optimize_model(inferred, policy=FusionPolicy(mode="always"))
    result = verify(model, optimized, inputs=feeds)
    assert result["passed"], (seed, result)
