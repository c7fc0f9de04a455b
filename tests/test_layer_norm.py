"""layer_norm: on ort-cpu (fp32) a LayerNormalization over the last axis of C >= 32 values becomes
epifuse::LayerNorm with the same result; other targets and precisions keep (or get back) the
LayerNormalization. The op itself is checked against numpy in float64, on both vector ISAs."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import zoo
from optimizer.passes.layer_norm import MIN_CHANNELS, OP_TYPE, layer_norm
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import OTHER_TARGETS, assert_op_stays_out, ops

REWRITE = f"last-axis LayerNormalization → epifuse::{OP_TYPE} (ort-cpu)"


def _norm_model(shape, *, ours=True, bias=True, epsilon=1e-6, name="norm", scale_len=None, outputs=("y",),
                axis=-1, x_from_add=False):
    rng = np.random.default_rng(5)
    c = shape[-1]
    inits = [numpy_helper.from_array(rng.standard_normal(scale_len or c).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")]
    inputs = ["x", "s", "b"] if bias else ["x", "s"]
    nodes = []
    if x_from_add:
        nodes.append(helper.make_node("Add", ["x", "x"], ["x2"]))
        inputs[0] = "x2"
    if ours:
        nodes.append(helper.make_node(OP_TYPE, inputs, ["y"], name=name, domain="epifuse", epsilon=epsilon))
    else:
        nodes.append(helper.make_node("LayerNormalization", inputs, list(outputs), name=name, axis=axis,
                                      epsilon=epsilon))
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _numpy_norm(x, scale, bias, epsilon):
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon) * scale
    return y + bias if bias is not None else y


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("shape,bias", [((1, 56, 56, 96), True), ((2, 5, 7, 37), True), ((3, 4, 100), False),
                                        ((1, 7, 7, 768), True), ((5, 1), True), ((4, 33), False),
                                        ((2, 0, 48), True)])
def test_the_op_normalizes_as_numpy_does(isa, shape, bias, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)  # a cap: the AVX2 path on an AVX-512 CPU
    model = _norm_model(shape, bias=bias)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 40).astype(np.float32)  # far from zero: one-pass moments would cancel
    y = _run(model, x)
    expected = _numpy_norm(x, inits["s"], inits["b"] if bias else None, 1e-6)
    assert y.shape == x.shape
    np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)


def test_a_scale_of_the_wrong_length_is_an_error_naming_the_node():
    model = _norm_model((2, 4, 40), scale_len=39, name="bad_norm")
    with pytest.raises(Exception, match=r"epifuse::LayerNorm node 'bad_norm'.*40 values, got 39"):
        _run(model, np.zeros((2, 4, 40), np.float32))


def test_convnext_norms_become_the_op_with_the_same_result():
    """The zoo's ConvNeXt normalizes 24 channels (stays ORT's) and 48 (becomes the op)."""
    original = onnx.shape_inference.infer_shapes(zoo.convnext_tiny())
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in original.graph.value_info}
    wide = [n for n in original.graph.node
            if n.op_type == "LayerNormalization" and shapes[n.input[0]][-1] >= MIN_CHANNELS]
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] == len(wide) > 0
    assert ops(optimized).count(OP_TYPE) == len(wide)
    assert ops(optimized).count("LayerNormalization") == ops(original).count("LayerNormalization") - len(wide)
    assert verify(original, optimized)["passed"]


@pytest.mark.parametrize("target,precision", OTHER_TARGETS)
def test_other_targets_and_precisions_keep_the_norm(target, precision):
    assert_op_stays_out(zoo.convnext_tiny(), OP_TYPE, target, precision)


def test_the_op_goes_back_to_a_layer_normalization_for_another_target():
    graph = gs.import_onnx(_norm_model((1, 4, 4, 64), epsilon=1e-3))
    report = Report()
    layer_norm(graph, report, "ort-cuda", "fp32")
    assert [(n.op, n.domain or "", n.attrs) for n in graph.nodes] == [
        ("LayerNormalization", "", {"axis": -1, "epsilon": pytest.approx(1e-3)})]
    assert report.canonicalized[f"epifuse::{OP_TYPE} → LayerNormalization (ort-cuda, fp32)"] == 1


def test_a_rewritten_norm_keeps_the_original_result():
    shape = (2, 6, 6, 64)
    original = _norm_model(shape, ours=False, bias=False, epsilon=1e-4)
    graph = gs.import_onnx(original)
    layer_norm(graph, Report(), "ort-cpu", "fp32")
    assert [(n.op, len(n.inputs)) for n in graph.nodes] == [(OP_TYPE, 2)]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(_run(gs.export_onnx(graph), x), _run(original, x), rtol=1e-5, atol=1e-5)


def test_norms_the_op_does_not_take_stay():
    """Another axis, too few values, a Mean output read, an X from an Add (ORT's SkipLayerNormalization)."""
    cases = [dict(shape=(1, 4, 64, 64), axis=2), dict(shape=(1, 4, 4, MIN_CHANNELS - 1)),
             dict(shape=(1, 4, 4, 64), outputs=("y", "mean")), dict(shape=(1, 4, 4, 64), x_from_add=True)]
    for case in cases:
        graph = gs.import_onnx(onnx.shape_inference.infer_shapes(_norm_model(ours=False, **case)))
        layer_norm(graph, Report(), "ort-cpu", "fp32")
        assert OP_TYPE not in [n.op for n in graph.nodes], case


def test_the_op_may_write_over_its_input():
    """The library lets ORT give Y the buffer of an X nothing else reads (here Relu's output): each row is
    read whole before its first value is written, so the result is the same."""
    shape = (1, 20, 20, 96)
    rng = np.random.default_rng(8)
    scale, bias = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node(OP_TYPE, ["t", "s", "b"], ["y"], domain="epifuse", epsilon=1e-6),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, list(shape))],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")],
                              value_info=[helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shape))
                                          for t in ("t", "y")])  # sizes the planner must know to share buffers
    model = helper.make_model(graph, ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    x = rng.standard_normal(shape).astype(np.float32)
    expected = np.maximum(_numpy_norm(np.maximum(x, 0), scale, bias, 1e-6), 0)
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-5, atol=1e-5)
