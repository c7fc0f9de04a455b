"""nhwc_pools: for ort-cuda at fp16, NHWC global average pools (squeeze-excite, heads) become Reshape →
MatMul by a 1/(H*W) row → Reshape, with the same result; other targets, precisions and dynamic spatial
sizes keep ReduceMean (on ort-cpu at fp32 the channel_mean pass takes it, tests/test_channel_mean.py)."""
import onnx
import pytest

from models import zoo
from optimizer.pipeline import optimize_model
from optimizer.verify import verify
from tests.helpers import ops


def _optimized(target, precision, mode=None, **kw):
    from optimizer.pipeline import FusionPolicy

    original = onnx.shape_inference.infer_shapes(zoo.efficientnet_tiny(**kw))
    optimized, report = optimize_model(original, target=target, precision=precision, policy=FusionPolicy(mode=mode))
    return original, optimized, report


def test_squeeze_excite_pools_become_gemvs_with_the_same_result():
    precision = "fp16"
    original, optimized, report = _optimized("ort-cuda", precision, mode="static")
    # 5 squeeze-excite pools and the head's pool, all inside the NHWC region; the three over at most
    # 64 pixels became depthwise convs first (pool_as_conv; the larger ones only where measured faster)
    n = report.canonicalized["NHWC global average pool → GEMV (ort-cuda)"]
    assert n == 3 and ops(optimized).count("MatMul") == n
    assert report.canonicalized["GlobalAveragePool → depthwise Conv (ort-cuda)"] == 3
    assert "ReduceMean" not in ops(optimized) and "GlobalAveragePool" not in ops(optimized)
    inits = {i.name: i for i in optimized.graph.initializer}
    row = inits[next(n.input[0] for n in optimized.graph.node if n.op_type == "MatMul")]
    assert len(row.dims) == 2 and row.dims[0] == 1
    assert row.data_type == onnx.TensorProto.FLOAT16
    result = verify(original, optimized, precision=precision)
    assert result["passed"], result


@pytest.mark.parametrize("target,precision", [("ort-cuda", "fp32"), ("ort-cuda", "bf16"), ("ort-cpu", "fp16"),
                                              ("ort-cpu", "fp32"), ("tensorrt", "fp16")])
def test_left_as_reduce_mean_elsewhere(target, precision):
    _, optimized, report = _optimized(target, precision)
    assert "MatMul" not in ops(optimized)
    assert not any(k.startswith("NHWC global average pool") for k in report.canonicalized)


def test_dynamic_spatial_size_keeps_reduce_mean():
    _, optimized, report = _optimized("ort-cuda", "fp16", size="size")
    assert report.canonicalized["NHWC global average pool → GEMV (ort-cuda)"] == 0
    assert "ReduceMean" in ops(optimized)
