"""channel_mean: on ort-cpu (fp32) the global average pool of a channels-last region, ReduceMean over axes 1
and 2 of X [N, H, W, C] keeping dims, becomes epifuse::ChannelMean with the same result; other targets and
precisions keep (or get back) the ReduceMean. The op itself is checked against numpy in float64, on both
vector ISAs and thread counts."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.graph import axes_of
from optimizer.passes.channel_mean import OP_TYPE, channel_mean
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import OTHER_TARGETS, assert_op_stays_out, conv_net, ops

REWRITE = f"channels-last global average pool → epifuse::{OP_TYPE} (ort-cpu)"


def _mean_model(x_shape, name="mean", opset=17):
    node = helper.make_node(OP_TYPE, ["x"], ["y"], name=name, domain="epifuse")
    graph = helper.make_graph([node], "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("epifuse", 1)])


def _run(model, x, threads=None):
    sess = ort.InferenceSession(model.SerializeToString(), session_options(threads=threads),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


# C of one vector, a part of one, several vectors with a tail, more than the register blocks (the long-row
# path) with and without a tail; images large enough to be split into pieces, batches, no pixels
SHAPES = [(2, 5, 7, 19), (1, 3, 3, 1), (1, 112, 112, 32), (1, 56, 56, 144), (3, 30, 30, 200), (1, 14, 14, 672),
          (2, 7, 7, 1153), (1, 20, 20, 16), (1, 0, 5, 8)]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_op_averages_as_numpy_does(isa, shape, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)  # a cap: the AVX2 path on an AVX-512 CPU
    x = (np.random.default_rng(3).standard_normal(shape) + 4).astype(np.float32)  # a mean far from zero
    y = _run(_mean_model(shape), x)
    assert y.shape == (shape[0], 1, 1, shape[3])
    if x.size == 0:
        assert np.isnan(y).all()  # 0/0, as numpy and ReduceMean give it
        return
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(1, 2), keepdims=True), rtol=2e-6, atol=0)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("shape", [(2, 5, 7, 19), (1, 112, 112, 32), (1, 14, 14, 672), (2, 7, 7, 1153), (1, 0, 5, 8)])
def test_the_op_averages_bf16_in_fp32_and_rounds_once(isa, shape, monkeypatch):
    """bfloat16 X: summed in fp32 (pieces and threads as for float), the mean rounded to bfloat16 once: within
    bf16's unit roundoff of the float64 mean of the same bf16 values, plus the fp32 sums' own error."""
    import ml_dtypes

    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node(OP_TYPE, ["xb"], ["yb"], domain="epifuse"),
             helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    x = (np.random.default_rng(6).standard_normal(shape) + 4).astype(np.float32)
    y = _run(model, x)
    assert y.shape == (shape[0], 1, 1, shape[3])
    if x.size == 0:
        assert np.isnan(y).all()
        return
    exact = x.astype(ml_dtypes.bfloat16).astype(np.float64).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(y, exact, rtol=2.0 ** -8 + 1e-5, atol=0)  # bf16: unit roundoff 2^-8


@pytest.mark.parametrize("shape", [(1, 112, 112, 32), (2, 30, 30, 200)])
def test_the_result_does_not_depend_on_the_threads(shape):
    """Partial sums of pieces are added in a fixed order: one thread and two give the same bits."""
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    model = _mean_model(shape)
    np.testing.assert_array_equal(_run(model, x, threads=1), _run(model, x, threads=2))


def test_non_finite_values_propagate():
    x = np.ones((1, 4, 4, 40), np.float32)
    x[0, 1, 2, 3], x[0, 3, 3, 39] = np.nan, np.inf
    y = _run(_mean_model(x.shape), x).reshape(-1)
    assert np.isnan(y[3]) and np.isposinf(y[39]) and np.all(np.delete(y, [3, 39]) == 1)


def test_a_tensor_of_another_rank_is_an_error_naming_the_node():
    with pytest.raises(Exception, match=r"epifuse::ChannelMean node 'bad_mean'.*rank 3"):
        _run(_mean_model((2, 4, 8), name="bad_mean"), np.zeros((2, 4, 8), np.float32))


@pytest.mark.parametrize("build", [zoo.efficientnet_tiny, zoo.mobilenetv3_tiny])
def test_squeeze_excite_pools_become_the_op_with_the_same_result(build):
    original = onnx.shape_inference.infer_shapes(build())
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] > 0 and OP_TYPE in ops(optimized)
    assert not {"ReduceMean", "MatMul", "GlobalAveragePool"} & set(ops(optimized))
    result = verify(original, optimized)
    assert result["passed"] and result["worst_rel_l2"] < 1e-5, result


def test_a_dynamic_image_size_takes_the_op_too():
    """The kernel reads H and W at run time: a model of symbolic height and width keeps its pools on it."""
    original = onnx.shape_inference.infer_shapes(zoo.efficientnet_tiny(size="size"))
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] > 0 and "ReduceMean" not in ops(optimized)
    assert verify(original, optimized)["passed"]


@pytest.mark.parametrize("opset", [17, 18])
def test_a_squeeze_excite_block_of_either_opset_takes_the_op(opset):
    """ReduceMean's axes: an attribute before opset 18, an input from it, as the layout pass writes them."""
    def squeeze_excite(g, x):
        y = g.op("Relu", [g.conv(x, 16, 16, 3)])
        gate = g.op("Sigmoid", [g.conv(g.op("GlobalAveragePool", [y]), 16, 16, 1)])
        return g.conv(g.op("Mul", [y, gate]), 16, 16, 1)

    original = onnx.shape_inference.infer_shapes(conv_net(squeeze_excite, channels=16, size=20, opset=opset))
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] == 1 and "ReduceMean" not in ops(optimized)
    result = verify(original, optimized)
    assert result["passed"] and result["worst_rel_l2"] < 1e-5, result


def _mean_head(opset=17):
    """A conv and x.mean([2, 3]) to [N, C] (MNASNet's and ShuffleNetV2's head), then a Gemm."""
    def head(g, x):
        y = g.op("Relu", [g.conv(x, 16, 24, 3)])
        axes = {"axes": [2, 3]} if opset < 18 else {}
        inputs = [y] if opset < 18 else [y, g.constant(np.array([2, 3], np.int64), dtype=np.int64)]
        return g.gemm(g.op("ReduceMean", inputs, keepdims=0, **axes), 24, 10)

    return onnx.shape_inference.infer_shapes(conv_net(head, channels=16, size=20, opset=opset, batch=2))


@pytest.mark.parametrize("opset", [17, 18])
def test_a_mean_that_drops_height_and_width_becomes_the_op_and_a_flatten(opset):
    """The layout pass ends the region at the mean (no Transpose before it) and the op's [N, 1, 1, C] is
    flattened."""
    original = _mean_head(opset)
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] == 1
    assert ops(optimized) == ["Transpose", "FusedConv", OP_TYPE, "Flatten", "Gemm"], ops(optimized)  # the input's
    result = verify(original, optimized)
    assert result["passed"] and result["worst_rel_l2"] < 1e-5, result


@pytest.mark.parametrize("target,precision", OTHER_TARGETS)
def test_other_targets_keep_a_mean_that_drops_its_axes_in_nchw(target, precision):
    """No library op takes it there: the region ends at a Transpose before the ReduceMean, as before."""
    optimized, _ = optimize_model(_mean_head(), target=target, precision=precision,
                                  policy=FusionPolicy(mode="always"))
    names = ops(optimized)
    assert OP_TYPE not in names and names[names.index("ReduceMean") - 1] == "Transpose", names


@pytest.mark.parametrize("target,precision", OTHER_TARGETS)
def test_other_targets_and_precisions_keep_the_pool(target, precision):
    assert_op_stays_out(zoo.efficientnet_tiny(), OP_TYPE, target, precision)


@pytest.mark.parametrize("opset", [17, 18])
def test_the_op_goes_back_to_a_reduce_mean_for_another_target(opset):
    """As an attribute before opset 18, an input from it; the same means either way."""
    model = _mean_model((2, 4, 5, 8), opset=opset)
    graph = gs.import_onnx(model)
    report = Report()
    channel_mean(graph, report, "ort-cuda", "fp32")
    (node,) = graph.nodes
    assert (node.op, node.domain or "", sorted(axes_of(node, 1).tolist())) == ("ReduceMean", "", [1, 2])
    assert report.canonicalized[f"epifuse::{OP_TYPE} → ReduceMean (ort-cuda, fp32)"] == 1
    x = np.random.default_rng(6).standard_normal((2, 4, 5, 8)).astype(np.float32)
    standard = gs.export_onnx(graph)
    y = ort.InferenceSession(standard.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, _run(model, x), rtol=1e-6)


def test_other_reductions_stay():
    """Other axes, a 3-D tensor: not the pool."""
    def graph_of(shape, axes, keepdims=1):
        node = helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=keepdims)
        graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    for shape, axes, keepdims in [((1, 8, 4, 4), [2, 3], 1), ((1, 4, 4, 8), [2, 3], 0), ((4, 4, 8), [1, 2], 1),
                                  ((1, 4, 4, 8), [1], 1)]:
        graph = graph_of(shape, axes, keepdims)
        channel_mean(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == ["ReduceMean"], (shape, axes, keepdims)
