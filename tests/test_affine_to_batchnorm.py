"""affine_to_batchnorm: a per-channel Mul → Add pair left in NCHW becomes one BatchNormalization with the
same outputs on ONNX Runtime (fp32 only); pairs that broadcast their input up, that are read in the
middle, or that are not per channel stay; and a BatchNormalization with no conv before it (DenseNet's)
comes out of the whole pipeline as a BatchNormalization again, not as two elementwise nodes."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.affine_to_batchnorm import affine_to_batchnorm
from optimizer.pipeline import unfused_model
from tests.helpers import ops, rel_l2, run_ort, run_pass


def _model(x_shape, scale_shape, shift_shape=None, extra_output=False):
    rng = np.random.default_rng(0)
    shift_shape = shift_shape or scale_shape
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)], outputs,
                          [numpy_helper.from_array(rng.standard_normal(scale_shape).astype(np.float32), "s"),
                           numpy_helper.from_array(rng.standard_normal(shift_shape).astype(np.float32), "t")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _same(a, b, x_shape):
    feeds = {"x": np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)}
    for u, v in zip(run_ort(a, feeds), run_ort(b, feeds)):
        assert u.shape == v.shape and rel_l2(u, v) < 1e-6


def test_a_per_channel_pair_becomes_one_batchnormalization():
    model = _model([2, 6, 5, 4], (6, 1, 1))
    out, report = run_pass(affine_to_batchnorm, model, "fp32")
    assert ops(out) == ["BatchNormalization"]
    assert report.canonicalized["per-channel Mul → Add → BatchNormalization"] == 1
    _same(model, out, (2, 6, 5, 4))


@pytest.mark.parametrize("x_shape, scale_shape, shift_shape, extra_output, precision", [
    ([2, 1, 5, 4], (6, 1, 1), None, False, "fp32"),       # the Mul broadcasts x up to 6 channels
    ([2, 6, 5, 4], (6, 1, 1), None, True, "fp32"),        # its product is read elsewhere
    ([2, 6, 5, 4], (1, 5, 1), None, False, "fp32"),       # along another axis
    ([2, 6, 5, 4], (6, 1, 1), (6, 5, 1), False, "fp32"),  # a shift that varies along H
    ([2, 6, 5, 4], (6, 1, 1), None, False, "fp16"),       # BatchNormalization stays fp32 on the GPU targets
])
def test_other_pairs_stay(x_shape, scale_shape, shift_shape, extra_output, precision):
    model = _model(x_shape, scale_shape, shift_shape, extra_output)
    out, report = run_pass(affine_to_batchnorm, model, precision)
    assert ops(out) == ["Mul", "Add"] and not report.canonicalized
    _same(model, out, tuple(x_shape))


def test_a_batchnorm_after_a_concat_stays_one_node_through_the_pipeline():
    """Concat → BatchNormalization → Relu → Conv (DenseNet's pre-activation layer): nothing to fold into,
    and nothing fused: the BatchNormalization is one node again at the end, with the original's outputs."""
    rng = np.random.default_rng(0)
    c = 8
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("g", rng.random(c) + 0.5), ("b", rng.standard_normal(c)), ("mu", rng.standard_normal(c) * 0.1),
        ("var", rng.random(c) + 0.5))]
    w = numpy_helper.from_array(rng.standard_normal((4, c, 1, 1)).astype(np.float32) * 0.3, "w")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["x", "r"], ["cat"], axis=1),
             helper.make_node("BatchNormalization", ["cat", "g", "b", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["a"]), helper.make_node("Conv", ["a", "w"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], bn + [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    out = unfused_model(model, "ort-cpu", "fp32")
    assert ops(out).count("BatchNormalization") == 1 and "Mul" not in ops(out)
    _same(model, out, (2, 4, 6, 6))
