"""activation_ops: on ort-cpu, HardSwish written as several nodes becomes the one ONNX op
(HardSigmoid + Mul below opset 14) with the same outputs on ONNX Runtime; patterns whose inner values
are read elsewhere, and other targets, are left alone."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.activation_ops import activation_ops
from tests.helpers import ops, rel_l2, run_ort, run_pass

HARDSWISH = [helper.make_node("Add", ["a", "three"], ["p"]), helper.make_node("Clip", ["p", "zero", "six"], ["q"]),
             helper.make_node("Mul", ["a", "q"], ["r"]), helper.make_node("Div", ["r", "six"], ["y"])]


def _model(tail, opset=17, outputs=("y",)):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32(3), "three"), numpy_helper.from_array(np.float32(0), "zero"),
             numpy_helper.from_array(np.float32(6), "six")]
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4)] + tail, "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _rewrite(model, target="ort-cpu"):
    return run_pass(activation_ops, model, target)


def _same(a, b):
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32) * 3}
    for u, v in zip(run_ort(a, feeds), run_ort(b, feeds)):
        assert rel_l2(u, v) < 1e-6


@pytest.mark.parametrize("tail, opset, expect", [(HARDSWISH, 17, ["Conv", "HardSwish"]),
                                                 (HARDSWISH, 13, ["Conv", "HardSigmoid", "Mul"])])
def test_written_as_nodes_becomes_the_op(tail, opset, expect):
    model = _model(tail, opset)
    rewritten, report = _rewrite(model)
    assert ops(rewritten) == expect and sum(report.canonicalized.values()) == 1
    _same(rewritten, model)


def test_an_inner_value_read_elsewhere_keeps_the_pattern():
    model = _model(HARDSWISH, outputs=("y", "q"))
    rewritten, _ = _rewrite(model)
    assert ops(rewritten) == ops(model)


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_nodes(target):
    model = _model(HARDSWISH)
    assert ops(_rewrite(model, target)[0]) == ops(model)
