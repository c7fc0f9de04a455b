"""scaled_residual: on ort-cpu, x + x * s with a small broadcast s (a squeeze-excite gate) becomes
x * (1 + s), with the same result up to rounding (checked against ONNX Runtime on the original); other
shapes, shared products and other targets are left alone."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from optimizer.passes.scaled_residual import scaled_residual
from optimizer.report import Report
from tests.helpers import ops


def _model(x_shape, s_shape, *, mul_first=True, product_output=False, other=False):
    """y = x + x * s (or the product's operands and the Add's swapped); `other`: the Mul reads a second
    tensor instead of x; `product_output`: the product is a graph output too."""
    b = "w" if other else "x"
    mul = helper.make_node("Mul", [b, "s"] if mul_first else ["s", b], ["p"], name="mul")
    add = helper.make_node("Add", ["x", "p"] if mul_first else ["p", "x"], ["y"], name="add")
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, sh) for n, sh in
              (("x", x_shape), ("s", s_shape)) + ((("w", x_shape),) if other else ())]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if product_output:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    graph = helper.make_graph([mul, add], "g", inputs, outputs)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _rewritten(model, target="ort-cpu"):
    report = Report()
    return gs.export_onnx(scaled_residual(gs.import_onnx(model), report, target)), report


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})[0]


@pytest.mark.parametrize("s_shape,mul_first", [([1, 1, 1, 24], True), ([2, 1, 1, 24], False), ([24], True),
                                               ([1, 24, 1, 1], True)])
def test_gated_residual_becomes_one_product(s_shape, mul_first):
    x_shape = [2, 24, 9, 24] if s_shape == [1, 24, 1, 1] else [2, 9, 7, 24]
    model = _model(x_shape, s_shape, mul_first=mul_first)
    rewritten, report = _rewritten(model)
    assert sorted(ops(rewritten)) == ["Add", "Mul"]
    add = next(n for n in rewritten.graph.node if n.op_type == "Add")
    assert list(add.input)[0] == "s"  # the Add is on the gate now, not on x
    assert report.canonicalized["x + x * s → x * (1 + s) (ort-cpu)"] == 1
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32), "s": rng.random(s_shape).astype(np.float32)}
    np.testing.assert_allclose(_run(rewritten, feeds), _run(model, feeds), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("why,kw", [
    ("s as large as x", dict(x_shape=[1, 4, 4, 8], s_shape=[1, 4, 4, 8])),
    ("the product of another tensor", dict(x_shape=[1, 4, 4, 8], s_shape=[1, 1, 1, 8], other=True)),
    ("the product also an output", dict(x_shape=[1, 4, 4, 8], s_shape=[1, 1, 1, 8], product_output=True)),
])
def test_other_sums_are_left_alone(why, kw):
    x_shape, s_shape = kw.pop("x_shape"), kw.pop("s_shape")
    rewritten, report = _rewritten(_model(x_shape, s_shape, **kw))
    assert [n.name for n in rewritten.graph.node] == ["mul", "add"] and not report.canonicalized, why


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_sum(target):
    rewritten, report = _rewritten(_model([1, 4, 4, 8], [1, 1, 1, 8]), target)
    assert not report.canonicalized and [n.name for n in rewritten.graph.node] == ["mul", "add"]


def test_legacy_broadcast_attributes_are_left_alone():
    """Before opset 7, Add and Mul broadcast by `broadcast` / `axis` attributes, not by numpy's rules."""
    graph = gs.import_onnx(_model([1, 4, 4, 8], [1, 1, 1, 8]))
    next(n for n in graph.nodes if n.op == "Add").attrs.update(broadcast=1, axis=0)
    report = Report()
    scaled_residual(graph, report, "ort-cpu")
    assert not report.canonicalized and [n.op for n in graph.nodes] == ["Mul", "Add"]
