"""input_layout: for ort-cuda and ort-cpu, the Transpose taking a few-channel graph input into the NHWC
region becomes epifuse::NchwToNhwc, with the same result (ORT CPU EP, the library's CPU kernel);
TensorRT, many-channel inputs and (on ort-cpu) one-channel inputs keep the Transpose. The op itself is
checked exactly against numpy."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.passes.input_layout import OP_TYPE
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import conv_net, cpu_flags, ops

REWRITE = f"few-channel NCHW→NHWC Transpose → epifuse::{OP_TYPE} (ort-cuda)"
CPU_REWRITE = f"few-channel NCHW→NHWC Transpose → epifuse::{OP_TYPE} (ort-cpu)"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("build", [zoo.yolo_tiny, zoo.resnet_tiny])
def test_rgb_input_transpose_becomes_the_layout_op_with_the_same_result(build, precision):
    original = onnx.shape_inference.infer_shapes(build())
    optimized, report = optimize_model(original, target="ort-cuda", precision=precision)
    assert report.canonicalized[REWRITE] == 1
    layout = [n for n in optimized.graph.node if n.op_type == OP_TYPE]
    assert len(layout) == 1 and layout[0].domain == "epifuse"
    first = next(n for n in optimized.graph.node if n.op_type == "FusedConv")
    assert first.input[0] == layout[0].output[0]  # the stem reads the op's NHWC output
    source = layout[0].input[0]  # the graph input, or its Cast to fp16
    cast = {n.output[0]: n.input[0] for n in optimized.graph.node if n.op_type == "Cast"}
    assert cast.get(source, source) == optimized.graph.input[0].name
    result = verify(original, optimized, precision=precision)
    assert result["passed"], result


def test_bf16_models_get_the_op_on_bf16_data():
    """bf16 ort-cuda models cannot be verified on the CPU EP (no bf16 MaxPool there); the rewrite
    itself: the op reads the input's Cast to bf16."""
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.resnet_tiny()), target="ort-cuda",
                                       precision="bf16")
    assert report.canonicalized[REWRITE] == 1
    layout = next(n for n in optimized.graph.node if n.op_type == OP_TYPE)
    cast = next(n for n in optimized.graph.node if n.op_type == "Cast" and n.output[0] == layout.input[0])
    assert helper.get_attribute_value(cast.attribute[0]) == TensorProto.BFLOAT16


@pytest.mark.parametrize("build", [zoo.yolo_tiny, zoo.resnet_tiny])
def test_ort_cpu_models_get_the_op_with_the_same_result(build):
    original = onnx.shape_inference.infer_shapes(build())
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[CPU_REWRITE] == 1
    layout = next(n for n in optimized.graph.node if n.op_type == OP_TYPE)
    assert layout.input[0] == optimized.graph.input[0].name
    result = verify(original, optimized)
    assert result["passed"], result


def test_one_channel_input_keeps_the_transpose_on_ort_cpu():
    """ORT copies a one-channel NCHW→NHWC Transpose as the reshape it is; the op would be 0.9x."""
    def build(g, x):
        return g.conv(x, 1, 8, 3)

    model = onnx.shape_inference.infer_shapes(conv_net(build, channels=1, size=10))
    optimized, report = optimize_model(model, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[CPU_REWRITE] == 0 and "Transpose" in ops(optimized)
    optimized, report = optimize_model(model, target="ort-cuda")
    assert report.canonicalized[REWRITE] == 1


def test_tensorrt_keeps_the_transpose():
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.resnet_tiny()), target="tensorrt")
    assert OP_TYPE not in ops(optimized) and "Transpose" in ops(optimized)


def test_many_channel_input_keeps_the_transpose():
    def build(g, x):
        return g.conv(x, 16, 16, 3)

    model = onnx.shape_inference.infer_shapes(conv_net(build, channels=16, size=10))
    optimized, report = optimize_model(model, target="ort-cuda")
    assert report.canonicalized[REWRITE] == 0 and "Transpose" in ops(optimized)


def _layout_model(dtype: int, shape, name="to_nhwc"):
    out_shape = [shape[0], *shape[2:], shape[1]]
    node = helper.make_node(OP_TYPE, ["x"], ["y"], name=name, domain="epifuse")
    graph = helper.make_graph([node], "layout", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, out_shape)])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


@pytest.mark.parametrize("dtype,np_dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)])
@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (1, 1, 4, 9), (3, 8, 1, 1), (1, 5, 3, 2), (1, 2, 6, 3), (2, 4, 3, 5),
                                   (1, 6, 2, 2), (1, 7, 3, 1), (2, 12, 5, 3), (2, 3, 37, 301), (1, 3, 0, 4)])
def test_the_op_transposes_exactly(dtype, np_dtype, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np_dtype)
    sess = ort.InferenceSession(_layout_model(dtype, shape).SerializeToString(), session_options(),
                                providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x})
    assert y.dtype == np_dtype and np.array_equal(y, x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("isa", [  # avx512: 16 pixels a step with permutes, avx2: the plain rows
    pytest.param("avx512", marks=pytest.mark.skipif("avx512f" not in cpu_flags(), reason="no AVX-512")), "avx2"])
@pytest.mark.parametrize("shape", [(1, 3, 224, 224), (2, 3, 5, 48), (1, 3, 3, 17), (1, 3, 2, 15)])
def test_rgb_float_images_interleave_exactly_on_both_paths(isa, shape, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    x.flat[0], x.flat[-1] = np.nan, -np.inf  # moved, never computed
    sess = ort.InferenceSession(_layout_model(TensorProto.FLOAT, shape).SerializeToString(), session_options(),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.transpose(0, 2, 3, 1))


def test_a_non_4d_input_is_an_error_naming_the_node():
    model = _layout_model(TensorProto.FLOAT, (2, 3, 4), name="bad_layout")
    sess = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"epifuse::NchwToNhwc node 'bad_layout'.*rank 3"):
        sess.run(None, {"x": np.zeros((2, 3, 4), np.float32)})
