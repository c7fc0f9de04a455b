"""pool_as_conv: for ort-cuda, a GlobalAveragePool over at most 64 static pixels becomes a depthwise
Conv of 1/(H*W) taps, fused into a FusedConv that reads the NHWC region directly, with the same result
(ORT CPU EP, the library's CPU kernel); larger pools only where measured faster (tests/test_decide.py),
dynamic pools and other targets keep the pool."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.pipeline import optimize_model
from optimizer.verify import verify
from tests.helpers import ops

REWRITE = "GlobalAveragePool → depthwise Conv (ort-cuda)"


def _pool_model(h, w, c=16, batch=2):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, h, w])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, c, 1, 1])
    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], "g", [x], [y])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_resnet_head_pool_becomes_a_depthwise_fused_conv_with_the_same_result(precision):
    original = onnx.shape_inference.infer_shapes(zoo.resnet_tiny())
    optimized, report = optimize_model(original, target="ort-cuda", precision=precision)
    assert report.canonicalized[REWRITE] == 1
    assert "GlobalAveragePool" not in ops(optimized) and "ReduceMean" not in ops(optimized)
    init = {i.name: i for i in optimized.graph.initializer}
    pools = [n for n in optimized.graph.node if n.op_type == "FusedConv" and "GlobalAveragePool" in n.name]
    assert len(pools) == 1
    group = next(a.i for a in pools[0].attribute if a.name == "group")
    weights = onnx.numpy_helper.to_array(init[pools[0].input[1]])
    assert group == weights.shape[0] and weights.shape[3] == 1  # KRSC, one input channel per group
    np.testing.assert_allclose(weights.astype(np.float64), 1.0 / (weights.shape[1] * weights.shape[2]), rtol=1e-3)
    result = verify(original, optimized, precision=precision)
    assert result["passed"], result


@pytest.mark.parametrize("hw", [(8, 8), (7, 9), (1, 1)])
def test_pools_up_to_64_pixels_are_rewritten(hw):
    original = _pool_model(*hw)
    optimized, report = optimize_model(original, target="ort-cuda")
    assert report.canonicalized[REWRITE] == 1
    assert "GlobalAveragePool" not in ops(optimized) and "FusedConv" in ops(optimized)
    assert verify(original, optimized)["passed"]


@pytest.mark.parametrize("hw", [(9, 8), (56, 56)])
@pytest.mark.parametrize("mode", ["static", "auto"])  # auto: no GPU to measure on here, so the static policy
def test_larger_pools_stay_pools_unmeasured(hw, mode):
    from optimizer.pipeline import FusionPolicy

    optimized, report = optimize_model(_pool_model(*hw), target="ort-cuda", policy=FusionPolicy(mode=mode))
    assert report.canonicalized[REWRITE] == 0 and "GlobalAveragePool" in ops(optimized)


def test_a_larger_pool_fused_always_has_the_same_result():
    from optimizer.pipeline import FusionPolicy

    original = _pool_model(56, 56, c=8)
    optimized, report = optimize_model(original, target="ort-cuda", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] == 1 and "GlobalAveragePool" not in ops(optimized)
    assert verify(original, optimized)["passed"]


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_other_targets_keep_the_pool(target):
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.resnet_tiny()), target=target)
    assert report.canonicalized[REWRITE] == 0


def test_dynamic_spatial_size_keeps_the_pool():
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.efficientnet_tiny(size="size")),
                                       target="ort-cuda", precision="fp16")
    assert report.canonicalized[REWRITE] == 0


def test_static_policy_keeps_the_pool_conv_fused_in_its_second_fuse_pass():
    """Static policy: the convs before the pool fuse; the pool, rewritten after the fuse pass because it
    reads their NHWC output, is fused by a second fuse pass that sees only it, and the static policy's
    Transpose rule leaves it fused there (a plain depthwise Conv would be slower than the pool it replaced)."""
    from optimizer.pipeline import FusionPolicy
    from tests.helpers import conv_net

    def build(g, x):
        for name in ("pw1", "pw2"):
            with g.scope(name):
                x = g.op("Relu", [g.conv(x, 128, 128, 1)])
        return g.op("GlobalAveragePool", [x])

    original = onnx.shape_inference.infer_shapes(conv_net(build, channels=128, size=7))
    optimized, report = optimize_model(original, target="ort-cuda", precision="fp16",
                                       policy=FusionPolicy(mode="static"))
    assert report.canonicalized[REWRITE] == 1
    assert "Conv" not in ops(optimized) and ops(optimized).count("FusedConv") == 3, ops(optimized)
    assert verify(original, optimized, precision="fp16")["passed"]
