"""channel_scale: on ort-cpu (fp32, bf16) the squeeze-excite Mul of a channels-last region, X [N, H, W, C] times
S [N or 1, 1, 1, C], becomes epifuse::ChannelScale with the same result; other targets and precisions keep
(or get back) the Mul. The op itself is checked exactly against numpy, on both vector ISAs."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.passes.channel_scale import OP_TYPE, channel_scale
from optimizer.passes.conv_scale import OP_TYPE as CONV_SCALE
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import OTHER_TARGETS, assert_op_stays_out, ops

REWRITE = f"channels-last channel scale Mul → epifuse::{OP_TYPE} (ort-cpu)"


def _scale_model(x_shape, s_shape, name="scale"):
    node = helper.make_node(OP_TYPE, ["x", "s"], ["y"], name=name, domain="epifuse")
    graph = helper.make_graph([node], "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                                                helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _run(model, x, s):
    sess = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "s": s})[0]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("x_shape,s_shape", [((2, 5, 7, 19), (2, 1, 1, 19)), ((3, 4, 6, 19), (1, 1, 1, 19)),
                                             ((1, 112, 112, 32), (1, 1, 1, 32)), ((1, 3, 3, 48), (1, 1, 1, 48)),
                                             ((2, 9, 2, 1), (2, 1, 1, 1)), ((1, 0, 5, 8), (1, 1, 1, 8))])
def test_the_op_scales_exactly(isa, x_shape, s_shape, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)  # a cap: the AVX2 path on an AVX-512 CPU
    rng = np.random.default_rng(2)
    x = rng.standard_normal(x_shape).astype(np.float32)
    s = rng.standard_normal(s_shape).astype(np.float32)
    if x.size:
        x.flat[0], x.flat[-1] = np.nan, np.inf  # IEEE products, as numpy's
    y = _run(_scale_model(x_shape, s_shape), x, s)
    np.testing.assert_array_equal(y, x * s)


def _bf16_scale_model(x_shape, s_shape):
    """The op on bfloat16 data, fed and read as float through Casts (numpy has no bfloat16 for ORT)."""
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["s"], ["sb"], to=TensorProto.BFLOAT16),
             helper.make_node(OP_TYPE, ["xb", "sb"], ["yb"], domain="epifuse"),
             helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                                               helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("x_shape,s_shape", [((2, 5, 7, 19), (2, 1, 1, 19)), ((1, 112, 112, 32), (1, 1, 1, 32)),
                                             ((1, 3, 3, 48), (1, 1, 1, 48)), ((1, 0, 5, 8), (1, 1, 1, 8))])
def test_the_op_scales_bf16_rounding_each_product_once(isa, x_shape, s_shape, monkeypatch):
    """bfloat16 X and S: each product in fp32, rounded to nearest even once, as numpy computes it; NaN and
    infinity as IEEE has them."""
    import ml_dtypes

    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape).astype(np.float32)
    s = rng.standard_normal(s_shape).astype(np.float32)
    if x.size:
        x.flat[0], x.flat[-1] = np.nan, np.inf
    bf16 = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    expected = bf16(bf16(x) * bf16(s))
    np.testing.assert_array_equal(_run(_bf16_scale_model(x_shape, s_shape), x, s), expected)


def test_a_scale_of_the_wrong_shape_is_an_error_naming_the_node():
    model = _scale_model((2, 4, 4, 8), (2, 1, 1, 7), name="bad_scale")
    with pytest.raises(Exception, match=r"epifuse::ChannelScale node 'bad_scale'.*\[2, 1, 1, 7\]"):
        _run(model, np.zeros((2, 4, 4, 8), np.float32), np.zeros((2, 1, 1, 7), np.float32))


@pytest.mark.parametrize("build", [zoo.efficientnet_tiny, zoo.mobilenetv3_tiny])
def test_squeeze_excite_scales_become_the_op_with_the_same_result(build):
    original = onnx.shape_inference.infer_shapes(build())
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    # each scale is the op, or merged into the conv that reads it (conv_scale)
    scales = ops(optimized).count(OP_TYPE) + ops(optimized).count(CONV_SCALE)
    assert report.canonicalized[REWRITE] == scales > 0 and "Mul" not in ops(optimized)
    assert verify(original, optimized)["passed"]


def test_a_bf16_model_on_the_cpu_scales_its_bf16_data_in_place():
    """--precision bf16 on ort-cpu: the scale reads the bf16 FusedConv outputs as they are, no Casts
    between them, and the model computes the original within bf16's rounding."""
    original = onnx.shape_inference.infer_shapes(zoo.efficientnet_tiny())
    optimized, report = optimize_model(original, target="ort-cpu", precision="bf16",
                                       policy=FusionPolicy(mode="always"))
    producers = {o: n.op_type for n in optimized.graph.node for o in n.output}
    # X and S of each scale, of the ops it merged into too (their W and B are initializers)
    data = [i for n in optimized.graph.node for i in (n.input if n.op_type == OP_TYPE else n.input[0:4:3])
            if n.op_type in (OP_TYPE, CONV_SCALE)]
    assert data and all(producers[i] in ("FusedConv", "FusedConvMean") for i in data)
    assert verify(original, optimized, precision="bf16")["passed"]


@pytest.mark.parametrize("target,precision", OTHER_TARGETS)
def test_other_targets_and_precisions_keep_the_mul(target, precision):
    assert_op_stays_out(zoo.efficientnet_tiny(), OP_TYPE, target, precision)


def test_the_op_goes_back_to_a_mul_for_another_target():
    graph = gs.import_onnx(_scale_model((1, 4, 4, 8), (1, 1, 1, 8)))
    report = Report()
    channel_scale(graph, report, "tensorrt", "fp32")
    assert [(n.op, n.domain or "") for n in graph.nodes] == [("Mul", "")]
    assert report.canonicalized[f"epifuse::{OP_TYPE} → Mul (tensorrt, fp32)"] == 1


def test_a_mul_of_other_shapes_stays():
    """Broadcast over H and W only, by a constant, between two vectors: not the channel scale."""
    def model(x_shape, s_shape):
        graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "m",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                                   helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s_shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    for x_shape, s_shape in [((1, 8, 4, 4), (1, 8, 1, 1)), ((1, 4, 4, 8), (1, 4, 4, 1)), ((1, 1, 1, 8), (1, 1, 1, 8)),
                             ((2, 4, 4, 8), (3, 1, 1, 8)), ((1, 4, 4, 8), (1, 1, 1, 1))]:
        graph = model(x_shape, s_shape)
        channel_scale(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == ["Mul"], (x_shape, s_shape)


def test_the_op_may_write_over_its_input():
    """The library lets ORT give Y the buffer of an X nothing else reads (here Relu's output): the product
    is still exact."""
    x_shape, s_shape = (1, 40, 40, 48), (1, 1, 1, 48)
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node(OP_TYPE, ["t", "s"], ["y"], domain="epifuse"),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                                               helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s_shape))],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, list(x_shape))],
                              value_info=[helper.make_tensor_value_info(t, TensorProto.FLOAT, list(x_shape))
                                          for t in ("t", "y")])  # sizes the planner must know to share buffers
    model = helper.make_model(graph, ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    rng = np.random.default_rng(7)
    x, s = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(s_shape).astype(np.float32)
    np.testing.assert_array_equal(_run(model, x, s), np.maximum(np.maximum(x, 0) * s, 0))
