"""Property tests: random conv graphs (activations, residual modes, groups, strides, dilations,
asymmetric pads, dtypes, shared weights, multi-consumer intermediates, broadcast adds) optimize
to models that match the original on ORT and never compute anything twice."""
from collections import Counter

import numpy as np
import onnx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimizer import contract
from optimizer.passes.load import validate
from optimizer.pipeline import optimize_model
from optimizer.verify import verify

ACTIVATIONS = ["none", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu", "Softplus",
               "Clip", "silu", "silu_swapped", "paddle_hardswish", "gelu_erf", "mish", "clip_computed_bound"]


class _Net:
    def __init__(self, dtype, rng):
        self.nodes, self.inits, self.dtype, self.rng, self.n = [], [], dtype, rng, 0

    def name(self, base):
        self.n += 1
        return f"{base}{self.n}"

    def const(self, value):
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, self.dtype), name))
        return name

    def op(self, op, inputs, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(f"{op}_node"), **attrs))
        return out

    def activation(self, kind, x):
        if kind == "none":
            return x
        if kind == "Clip":
            return self.op("Clip", [x, self.const(-1.0), self.const(2.0)])
        if kind == "clip_computed_bound":  # distractor: the lower bound is computed, not a constant
            return self.op("Clip", [x, self.op("ReduceMean", [x], keepdims=0), self.const(2.0)])
        if kind == "LeakyRelu":
            return self.op("LeakyRelu", [x], alpha=0.15)
        if kind == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if kind == "silu_swapped":
            return self.op("Mul", [self.op("Sigmoid", [x]), x])
        if kind == "paddle_hardswish":
            clip = self.op("Clip", [self.op("Add", [x, self.const(3.0)]), self.const(0.0), self.const(6.0)])
            return self.op("Div", [self.op("Mul", [x, clip]), self.const(6.0)])
        if kind == "gelu_erf":
            erf = self.op("Erf", [self.op("Div", [x, self.const(1.4142135)])])
            return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, self.const(1.0)])]), self.const(0.5)])
        if kind == "mish":
            return self.op("Mul", [x, self.op("Tanh", [self.op("Softplus", [x])])])
        return self.op(kind, [x])


@st.composite
def conv_graphs(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float16]))
    n, c = draw(st.integers(1, 2)), draw(st.sampled_from([2, 3, 4, 6, 8]))
    h, w = draw(st.integers(5, 11)), draw(st.integers(5, 11))
    net = _Net(dtype, np.random.default_rng(draw(st.integers(0, 2**16))))
    x, shape = "x", (c, h, w)
    outputs, shared = [], {}
    for _ in range(draw(st.integers(1, 3))):
        c_in, h_in, w_in = shape
        group = draw(st.sampled_from([g for g in (1, 2, 3, c_in) if c_in % g == 0]))
        k = group * draw(st.integers(1, 3)) if group != c_in else c_in * draw(st.sampled_from([1, 1, 2]))
        r, s = draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 3]))
        dil = draw(st.sampled_from([1, 1, 2]))
        stride = draw(st.sampled_from([1, 1, 2, 3]))
        pads = [draw(st.integers(0, 2)) for _ in range(4)]
        p = (h_in + pads[0] + pads[2] - dil * (r - 1) - 1) // stride + 1
        q = (w_in + pads[1] + pads[3] - dil * (s - 1) - 1) // stride + 1
        if p < 1 or q < 1:
            continue
        wkey = (k, c_in // group, r, s)
        if wkey in shared and draw(st.booleans()):
            wname = shared[wkey]  # a weight shared by two convs
        else:
            wname = net.const(net.rng.standard_normal(wkey) * np.sqrt(2.0 / (c_in // group * r * s)))
            shared[wkey] = wname
        inputs = [x, wname] + ([net.const(net.rng.normal(0, 0.1, k))] if draw(st.booleans()) else [])
        y = net.op("Conv", inputs, group=group, strides=[stride, stride], dilations=[dil, dil], pads=pads,
                   kernel_shape=[r, s])
        if draw(st.booleans()):
            bn = [net.const(net.rng.uniform(0.5, 1.5, k)), net.const(net.rng.normal(0, 0.1, k)),
                  net.const(net.rng.normal(0, 0.1, k)), net.const(net.rng.uniform(0.5, 1.5, k))]
            y = net.op("BatchNormalization", [y, *bn])
        if draw(st.integers(0, 5)) == 0:
            outputs.append(y)  # distractor: the raw conv output is also a graph output
        same_shape = (k, p, q) == shape
        residual = draw(st.sampled_from(["none", "pre", "post"])) if same_shape else "none"
        if residual == "pre":
            y = net.op("Add", [y, x])
        y = net.activation(draw(st.sampled_from(ACTIVATIONS)), y)
        if residual == "post":
            y = net.op("Add", [x, y])
        if draw(st.integers(0, 4)) == 0:  # distractor: a broadcast add that is not a residual
            y = net.op("Add", [y, net.const(net.rng.normal(0, 0.1, (1, k, 1, 1)))])
        if draw(st.integers(0, 4)) == 0:  # distractor: a second consumer of the block output
            outputs.append(net.op("Relu", [y]))
        x, shape = y, (k, p, q)
    assume(x != "x")  # every conv drawn had an empty output
    outputs.append(x)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    graph = helper.make_graph(net.nodes, "prop", [helper.make_tensor_value_info("x", elem, [n, c, h, w])],
                              [helper.make_tensor_value_info(o, elem, None) for o in dict.fromkeys(outputs)],
                              net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(conv_graphs())
def test_random_conv_graph_optimizes_correctly_without_duplicate_work(model):
    original = validate(model)
    optimized, report = optimize_model(original)
    is_fp16 = original.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    result = verify(original, optimized, precision="fp16" if is_fp16 else "fp32")
    assert result["passed"], result
    before = Counter(n.op_type for n in original.graph.node)
    after = Counter(n.op_type for n in optimized.graph.node)
    # every conv is computed exactly once, and no op runs more often than before
    assert after[contract.OP_TYPE] + after["Conv"] == before["Conv"]
    # on ort-cpu a HardSwish the exporter wrote as several nodes becomes the one op (fewer passes)
    one_op = sum(n for rewrite, n in report.canonicalized.items() if rewrite.startswith("HardSwish written as"))
    for op, count in after.items():
        if op not in ("Transpose", "NchwToNhwc", contract.OP_TYPE, "Mul", "ChannelScale", "Add", "Identity"):
            assert count <= before[op] + (one_op if op in ("HardSwish", "HardSigmoid") else 0), (op, count, before[op])
    # Mul/Add may appear for a BN whose conv output had another consumer (Mul+Add), never more
    assert after["Mul"] + after["ChannelScale"] + after["Add"] <= (before["Mul"] + before["Add"]
                                                                   + 2 * before["BatchNormalization"])
    onnx.checker.check_model(optimized)
