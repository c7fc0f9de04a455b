"""fold_batchnorm: BN disappears into Conv / ConvTranspose (grouped too) / Gemm / MatMul with the
same outputs; BN with no foldable producer becomes Mul+Add; training-mode BN stays; shared
weights are never edited in place."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.fold_batchnorm import fold_batchnorm
from optimizer.report import Report
from tests.helpers import conv_net, ops, rel_l2, run_ort


def _fold(model):
    report = Report()
    graph = fold_batchnorm(gs.import_onnx(onnx.shape_inference.infer_shapes(model)), report)
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out, report


def _bn_params(rng, c, dtype=np.float32):
    return [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.3, c), rng.normal(0, 0.3, c), rng.uniform(0.5, 1.5, c)]


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _bn_inits(rng, c, prefix="bn", dtype=np.float32):
    names = [f"{prefix}_{k}" for k in ("scale", "bias", "mean", "var")]
    return names, [numpy_helper.from_array(v.astype(dtype), n) for v, n in zip(_bn_params(rng, c), names)]


def _check(model, feeds, expect_ops, tol=1e-5):
    folded, report = _fold(model)
    assert ops(folded) == expect_ops
    for a, b in zip(run_ort(folded, feeds), run_ort(model, feeds)):
        assert rel_l2(a, b) < tol
    return folded, report


def test_conv_bn_folds():
    m = conv_net(lambda g, x: g.conv_bn(x, 8, 16, 3, stride=2), batch="batch")
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 12, 12)).astype(np.float32)}
    _, report = _check(m, feeds, ["Conv"])
    assert report.bn_folded["Conv"] == 1


def test_grouped_conv_transpose_bn_folds_on_weight_axis_1():
    rng = np.random.default_rng(0)
    c, k, group = 6, 9, 3
    w = rng.standard_normal((c, k // group, 3, 3)).astype(np.float32)
    names, bn = _bn_inits(rng, k)
    m = _model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], group=group, strides=[2, 2]),
                helper.make_node("BatchNormalization", ["t", *names], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b"),
                *bn])
    feeds = {"x": rng.standard_normal((1, c, 5, 5)).astype(np.float32)}
    _, report = _check(m, feeds, ["ConvTranspose"])
    assert report.bn_folded["ConvTranspose"] == 1


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [False, True])
def test_gemm_bn_folds(trans_b, with_c):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 7) if trans_b else (7, 5)).astype(np.float32)
    names, bn = _bn_inits(rng, 5)
    inits = [numpy_helper.from_array(w, "w"), *bn]
    gemm_inputs = ["x", "w"]
    if with_c:
        inits.append(numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "c"))
        gemm_inputs.append("c")
    m = _model([helper.make_node("Gemm", gemm_inputs, ["t"], transB=trans_b, alpha=0.7, beta=1.3),
                helper.make_node("BatchNormalization", ["t", *names], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    _check(m, {"x": rng.standard_normal((3, 7)).astype(np.float32)}, ["Gemm"])


def test_matmul_bn_folds_into_matmul_and_add():
    rng = np.random.default_rng(3)
    names, bn = _bn_inits(rng, 4)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["t"]),
                helper.make_node("BatchNormalization", ["t", *names], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w"), *bn])
    _check(m, {"x": rng.standard_normal((3, 6)).astype(np.float32)}, ["MatMul", "Add"])


def test_bn_without_foldable_producer_becomes_mul_add():
    m = conv_net(lambda g, x: g.batch_norm(g.op("Relu", [x]), 8))
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    _, report = _check(m, feeds, ["Relu", "Mul", "Add"])
    assert report.bn_to_affine == 1


def test_conv_output_with_two_consumers_is_not_folded_into():
    def build(g, x):
        c = g.conv(x, 8, 8, 3)
        return g.op("Add", [g.batch_norm(c, 8), c])

    m = conv_net(build)
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    _, report = _check(m, feeds, ["Conv", "Mul", "Add", "Add"])
    assert not report.bn_folded


def test_training_mode_bn_is_left_alone():
    rng = np.random.default_rng(6)
    names, bn = _bn_inits(rng, 4)
    m = _model([helper.make_node("Conv", ["x", "w"], ["t"]),
                helper.make_node("BatchNormalization", ["t", *names], ["y"], training_mode=1)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
               [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w"), *bn])
    folded, report = _fold(m)
    assert ops(folded) == ["Conv", "BatchNormalization"]
    assert "training mode" in report.skipped[0].reason


def test_shared_weights_get_their_own_folded_copies():
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    n1, bn1 = _bn_inits(rng, 4, "bn1")
    n2, bn2 = _bn_inits(rng, 4, "bn2")
    m = _model([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["a", *n1], ["y1"]),
                helper.make_node("Conv", ["x", "w"], ["b"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["b", *n2], ["y2"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
               [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], [w, *bn1, *bn2])
    folded, _ = _check(m, {"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}, ["Conv", "Conv"])
    weights = {n.input[1] for n in folded.graph.node}
    assert len(weights) == 2


def test_fp16_model_is_folded_in_float64_and_rounded_once():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float16)
    names, bn = _bn_inits(rng, 8, dtype=np.float16)
    m = _model([helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["t", *names], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8, 6, 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
               [numpy_helper.from_array(w, "w"), *bn])
    folded, _ = _fold(m)
    init = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    w_folded = init[folded.graph.node[0].input[1]]
    params = [numpy_helper.to_array(i).astype(np.float64) for i in m.graph.initializer[1:]]
    scale = params[0] / np.sqrt(params[3] + 1e-5)
    exact = w.astype(np.float64) * scale[:, None, None, None]
    assert w_folded.dtype == np.float16
    np.testing.assert_array_equal(w_folded, exact.astype(np.float16))


# --- regressions: folds that changed a model's answer ------------------------------------------

def _optimized_matches_original(model, feeds):
    """The whole pipeline (every candidate fused), then ORT on both, NaN and Inf at the same places."""
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(model), policy=FusionPolicy(mode="always"))
    result = verify(model, optimized, inputs=feeds)
    assert result["passed"], result
    return optimized, report


def test_conv_whose_bias_is_a_graph_input_keeps_it():
    rng = np.random.default_rng(3)
    names, bn = _bn_inits(rng, 4)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["c", *names], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [w, *bn])
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32) * 3}
    optimized, report = _optimized_matches_original(m, feeds)
    assert "b" in [i.name for i in optimized.graph.input] and report.bn_folded["Conv"] == 0


def test_conv_whose_bias_is_a_graph_input_keeps_a_following_constant_add():
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    shift = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "shift")
    m = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "shift"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], [w, shift])
    _optimized_matches_original(m, {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
                                    "b": rng.standard_normal(4).astype(np.float32)})


@pytest.mark.parametrize("c_kind", ["graph input", "per row [K, 1]"])
def test_gemm_bn_fold_is_refused_before_any_weight_changes(c_kind):
    rng = np.random.default_rng(5)
    k = 6
    names, bn = _bn_inits(rng, k)
    b = numpy_helper.from_array(rng.standard_normal((k, k)).astype(np.float32), "B")  # M == K == N
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [k, k])]
    inits = [b, *bn]
    feeds = {"a": rng.standard_normal((k, k)).astype(np.float32)}
    if c_kind == "graph input":
        inputs.append(helper.make_tensor_value_info("C", TensorProto.FLOAT, [k]))
        feeds["C"] = rng.standard_normal(k).astype(np.float32)
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((k, 1)).astype(np.float32), "C"))
    m = _model([helper.make_node("Gemm", ["a", "B", "C"], ["g"]),
                helper.make_node("BatchNormalization", ["g", *names], ["y"])],
               inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, k])], inits)
    _, report = _optimized_matches_original(m, feeds)
    assert report.bn_folded["Gemm"] == 0 and report.bn_to_affine == 1


def test_bn_with_zero_variance_and_epsilon_is_left_as_it_is():
    rng = np.random.default_rng(6)
    params = [v.astype(np.float32) for v in _bn_params(rng, 4)]
    params[3][2] = 0.0  # channel 2: variance 0, epsilon 0 -> ±inf and NaN in the original
    names = [f"bn_{k}" for k in ("scale", "bias", "mean", "var")]
    bn = [numpy_helper.from_array(v, n) for v, n in zip(params, names)]
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["c", *names], ["y"], epsilon=0.0)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], [w, *bn])
    optimized, report = _optimized_matches_original(m, {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)})
    assert "BatchNormalization" in ops(optimized)
    assert any("variance + epsilon is zero or negative in channel 2" in s.reason for s in report.skipped)
