"""fc_as_conv: for ort-cuda, a classifier Gemm on [N, C] becomes Reshape → FusedConv 1x1 → Reshape
with the same result (ORT CPU EP, the library's CPU kernel) and no Transpose around it; other targets
and Gemms that are not a conv (transA, alpha, a per-row bias, non-constant weights) keep the Gemm."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import zoo
from optimizer.pipeline import optimize_model
from optimizer.verify import verify
from tests.helpers import ops

REWRITE = "Gemm on [N, C] → 1x1 Conv (ort-cuda)"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("build,gemms", [(zoo.resnet_tiny, 1), (zoo.mobilenetv3_tiny, 2), (zoo.efficientnet_tiny, 1)])
def test_classifier_gemms_become_fused_convs_with_the_same_result(build, gemms, precision):
    original = onnx.shape_inference.infer_shapes(build())
    optimized, report = optimize_model(original, target="ort-cuda", precision=precision)
    assert report.canonicalized[REWRITE] == gemms
    assert "Gemm" not in ops(optimized)
    produced = {o: n for n in optimized.graph.node for o in n.output}
    fc = [n for n in optimized.graph.node if n.op_type == "FusedConv" and "Gemm_conv" in n.name]
    assert len(fc) == gemms
    for node in fc:  # [N, C] → [N, 1, 1, C] is the NHWC image as it is: a Reshape, no Transpose
        assert produced[node.input[0]].op_type == "Reshape"
        readers = [n for n in optimized.graph.node if node.output[0] in n.input]
        assert [n.op_type for n in readers] == ["Reshape"]
    result = verify(original, optimized, precision=precision)
    assert result["passed"], result


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_other_targets_keep_the_gemm(target):
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.resnet_tiny()), target=target)
    assert report.canonicalized[REWRITE] == 0 and "Gemm" in ops(optimized)


def _gemm_model(*, trans_a=0, alpha=1.0, bias_shape=(4,), weights_as_input=False):
    rng = np.random.default_rng(0)
    a_shape = [6, 2] if trans_a else [2, 6]
    w = numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b")
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    if weights_as_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 6]))
    node = helper.make_node("Gemm", ["a", "w", "b"], ["y"], alpha=alpha, transA=trans_a, transB=1)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              initializer=[b] if weights_as_input else [w, b])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("kw", [dict(trans_a=1), dict(alpha=0.5), dict(bias_shape=(2, 4)),
                                dict(weights_as_input=True)], ids=["transA", "alpha", "row bias", "weights input"])
def test_gemms_that_are_not_a_conv_are_left(kw):
    optimized, report = optimize_model(_gemm_model(**kw), target="ort-cuda")
    assert report.canonicalized[REWRITE] == 0 and ops(optimized) == ["Gemm"]


def test_a_lone_gemm_runs_as_a_fused_conv():
    original = _gemm_model()
    optimized, report = optimize_model(original, target="ort-cuda")
    assert report.canonicalized[REWRITE] == 1 and "FusedConv" in ops(optimized) and "Transpose" not in ops(optimized)
    assert verify(original, optimized)["passed"]
