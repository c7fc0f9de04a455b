"""optimizer.activations: every formulation of the contract's activations is recognised, with
its parameters and all of its nodes; near misses are not."""
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from models import activations as act
from optimizer.activations import match_activation
from tests.helpers import conv_net, gs_graph


def _match(build):
    """Builds conv → activation and matches at the conv output."""
    graph = gs_graph(conv_net(lambda g, x: build(g, g.conv(x, 8, 8, 3)), opset=18))
    conv = next(n for n in graph.nodes if n.op == "Conv")
    m = match_activation(conv.outputs[0])
    return m, graph


FORMULATIONS = [
    ("relu", (), lambda g, x: g.op("Relu", [x])),
    ("leaky_relu", (0.1,), lambda g, x: g.op("LeakyRelu", [x], alpha=0.1)),
    ("elu", (0.7,), lambda g, x: g.op("Elu", [x], alpha=0.7)),
    ("softplus", (), lambda g, x: g.op("Softplus", [x])),
    ("sigmoid", (), lambda g, x: g.op("Sigmoid", [x])),
    ("tanh", (), lambda g, x: g.op("Tanh", [x])),
    ("hardsigmoid", (0.2, 0.5), lambda g, x: g.op("HardSigmoid", [x])),
    ("hardsigmoid", (0.25, 0.4), lambda g, x: g.op("HardSigmoid", [x], alpha=0.25, beta=0.4)),
    ("clip", (0.0, 6.0), lambda g, x: g.op("Clip", [x, g.constant(0.0), g.constant(6.0)])),
    ("clip", (-math.inf, 2.0), lambda g, x: g.op("Clip", [x, "", g.constant(2.0)])),
    ("hardswish", (), lambda g, x: g.op("HardSwish", [x])),
    ("hardswish", (), act.hard_swish_via_hard_sigmoid),
    ("hardswish", (), lambda g, x: act.hard_swish_paddle(g, x)),
    ("hardswish", (), lambda g, x: act.hard_swish_paddle(g, x, x_first=False)),
    ("hardswish", (), lambda g, x: act.hard_swish_paddle(g, x, divide=False)),
    ("mish", (), lambda g, x: g.op("Mish", [x])),
    ("mish", (), act.mish_decomposed),
    ("silu", (), lambda g, x: act.silu(g, x)),
    ("silu", (), lambda g, x: act.silu(g, x, sigmoid_first=True)),
    ("gelu", (), lambda g, x: act.gelu_erf(g, x)),
    ("gelu", (), lambda g, x: act.gelu_erf(g, x, multiply_by_inv_sqrt2=True)),
    ("gelu_tanh", (), act.gelu_tanh),
]


@pytest.mark.parametrize("name,params,build", FORMULATIONS)
def test_formulation_is_recognised_with_all_its_nodes(name, params, build):
    m, graph = _match(build)
    assert m is not None and m.name == name
    assert m.params == pytest.approx(params)
    # the pattern covers every node between the conv and the graph output
    non_conv = [n for n in graph.nodes if n.op not in ("Conv", "Constant")]
    assert {id(n) for n in non_conv} == {id(n) for n in m.nodes}
    assert m.output.name == "y"


def test_gelu_op_opset20_both_approximations():
    for approximate, name in (("none", "gelu"), ("tanh", "gelu_tanh")):
        graph = gs_graph(conv_net(lambda g, x: g.op("Gelu", [g.conv(x, 8, 8, 1)], approximate=approximate),
                                  opset=20))
        conv = next(n for n in graph.nodes if n.op == "Conv")
        assert match_activation(conv.outputs[0]).name == name


NEAR_MISSES = [
    # hard-swish with the wrong divisor, the wrong shift, the wrong clip bounds
    lambda g, x: g.op("Div", [g.op("Mul", [x, g.op("Clip", [g.op("Add", [x, g.constant(3.0)]), g.constant(0.0),
                                                             g.constant(6.0)])]), g.constant(5.0)]),
    lambda g, x: g.op("Div", [g.op("Mul", [x, g.op("Clip", [g.op("Add", [x, g.constant(2.0)]), g.constant(0.0),
                                                             g.constant(6.0)])]), g.constant(6.0)]),
    # x * HardSigmoid(x) with ONNX's default constants is not hard-swish
    lambda g, x: g.op("Mul", [x, g.op("HardSigmoid", [x])]),
    # GELU with 0.6 instead of 0.5
    lambda g, x: g.op("Mul", [g.op("Mul", [x, g.op("Add", [g.op("Erf", [g.op("Div", [x, g.constant(1.4142135)])]),
                                                         g.constant(1.0)])]), g.constant(0.6)]),
    # x * x (a square, not an activation)
    lambda g, x: g.op("Mul", [x, x]),
]


@pytest.mark.parametrize("build", NEAR_MISSES)
def test_near_misses_are_not_activations(build):
    m, _ = _match(build)
    assert m is None


def test_intermediate_with_another_consumer_blocks_the_match():
    def build(g, x):
        sig = g.op("Sigmoid", [x])
        y = g.op("Mul", [x, sig])
        g.output(g.op("Relu", [sig]), "also_sigmoid")
        return y

    m, _ = _match(build)
    assert m is None


def test_sigmoid_of_another_tensor_is_not_silu():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 1, 1], np.ones(4))])
    g = gs_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert match_activation(conv.outputs[0]) is None


def test_silu_followed_by_a_scaling_mul_still_matches_the_silu():
    def build(g, x):
        return g.op("Mul", [act.silu(g, x), g.constant(np.full((1, 8, 1, 1), 2.0))])

    m, graph = _match(build)
    assert m is not None and m.name == "silu"
    assert m.output.name != "y"


def test_models_with_every_formulation_match_end_to_end():
    from models import zoo

    graph = gs_graph(zoo.build("act_zoo"))
    names = [match_activation(n.outputs[0]) for n in graph.nodes if n.op == "BatchNormalization"]
    assert all(m is not None for m in names)
    assert {m.name for m in names} >= {"relu", "leaky_relu", "elu", "softplus", "sigmoid", "tanh", "hardsigmoid",
                                        "clip", "hardswish", "gelu", "gelu_tanh", "mish", "silu"}
    onnx.checker.check_model(zoo.build("act_zoo"))
