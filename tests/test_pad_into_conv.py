"""pad_into_conv: a zero Pad of H and W before a Conv becomes the Conv's pads on ort-cpu, with the same
outputs on ONNX Runtime; Pads that reflect, pad by another value, pad the channels, have other readers or
feed no Conv stay, and so does every Pad on the other targets."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.pad_into_conv import pad_into_conv
from optimizer.pipeline import FusionPolicy, optimize_model
from tests.helpers import ops, run_ort, run_pass


def _model(pads, conv_pads=(0, 0, 0, 0), mode="constant", value=None, second_reader=False, opset=17):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(rng.standard_normal((6, 4 + pads[1] + pads[5], 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")]
    pad_inputs = ["r", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        pad_inputs.append("value")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Pad", pad_inputs, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w", "b"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=list(conv_pads))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 9, 8])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _same_outputs(a, b):
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4, 9, 8)).astype(np.float32)}
    for u, v in zip(run_ort(a, feeds), run_ort(b, feeds)):
        assert u.shape == v.shape
        np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pads, conv_pads, value", [
    ([0, 0, 0, 1, 0, 0, 1, 1], (0, 0, 0, 0), None),      # TensorFlow "same": one more after than before
    ([0, 0, 1, 1, 0, 0, 1, 1], (1, 0, 0, 1), 0.0),       # added to the conv's own, a zero value given
    ([0, 0, 2, 0, 0, 0, 0, 3], (0, 0, 0, 0), None),
])
def test_a_zero_spatial_pad_becomes_the_convs_pads(pads, conv_pads, value):
    model = _model(pads, conv_pads, value=value)
    out, report = run_pass(lambda g, r: pad_into_conv(g, r, "ort-cpu"), model)
    assert ops(out) == ["Relu", "Conv"] and report.canonicalized["zero Pad → Conv pads"] == 1
    conv = out.graph.node[1]
    got = next(list(a.ints) for a in conv.attribute if a.name == "pads")
    assert got == [conv_pads[0] + pads[2], conv_pads[1] + pads[3], conv_pads[2] + pads[6], conv_pads[3] + pads[7]]
    _same_outputs(model, out)


@pytest.mark.parametrize("case", ["reflect", "value 1", "channels", "negative", "second reader", "cuda"])
def test_other_pads_stay(case):
    pads = [0, 0, 0, 1, 0, 0, 1, 1]
    model = _model([0, 1, 0, 1, 0, 0, 1, 1] if case == "channels" else [0, 0, 0, -1, 0, 0, 1, 1]
                   if case == "negative" else pads, mode="reflect" if case == "reflect" else "constant",
                   value=1.0 if case == "value 1" else None, second_reader=case == "second reader")
    out, report = run_pass(lambda g, r: pad_into_conv(g, r, "ort-cuda" if case == "cuda" else "ort-cpu"), model)
    assert "Pad" in ops(out) and not report.canonicalized
    _same_outputs(model, out)


def test_a_pad_before_a_fused_conv_goes_in_the_optimized_model():
    """Through the whole pipeline on ort-cpu: the Pad is gone, the conv fused with its Relu, same outputs."""
    model = _model([0, 0, 0, 1, 0, 0, 1, 1])
    relu = helper.make_node("Relu", ["y"], ["y_relu"])
    model.graph.node.append(relu)
    model.graph.output[0].name = "y_relu"
    model = onnx.shape_inference.infer_shapes(model)
    optimized, _ = optimize_model(model, target="ort-cpu", precision="fp32", policy=FusionPolicy(mode="always"))
    assert "Pad" not in ops(optimized) and "FusedConv" in ops(optimized)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4, 9, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_an_opset_10_pad_with_attributes_goes_too():
    """Below opset 11 the amounts and the value are attributes."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Pad", ["r"], ["p"], pads=[0, 0, 1, 0, 0, 0, 1, 2], value=0.0),
             helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3, 3])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 9, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 5
    model = onnx.shape_inference.infer_shapes(model)
    out, _ = run_pass(lambda g, r: pad_into_conv(g, r, "ort-cpu"), model)
    assert ops(out) == ["Relu", "Conv"]
    assert next(list(a.ints) for a in out.graph.node[1].attribute if a.name == "pads") == [1, 0, 1, 2]
    _same_outputs(model, out)
