"""layout: transposes pushed through layout-agnostic ops cancel; numerics unchanged; ops that
need NCHW keep a transpose on each side (the region edge)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.layout import layout
from tests.helpers import ops, rel_l2, run_ort, run_pass

N, H, W, C = 2, 6, 8, 4


def _sandwich(body, n_inputs=1, n_outputs=1, inits=(), opset=17):
    """NHWC inputs → Transpose to NCHW → body (NCHW) → Transpose back → NHWC outputs."""
    nodes = [helper.make_node("Transpose", [f"x{i}"], [f"a{i}"], perm=[0, 3, 1, 2]) for i in range(n_inputs)]
    body_nodes, outs = body()
    nodes += body_nodes
    nodes += [helper.make_node("Transpose", [o], [f"y{i}"], perm=[0, 2, 3, 1]) for i, o in enumerate(outs)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [N, H, W, C])
                                       for i in range(n_inputs)],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_outputs)],
                          list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _layout(model):
    return run_pass(layout, model)


def _same_numerics(a, b, n_inputs=1):
    rng = np.random.default_rng(0)
    feeds = {f"x{i}": rng.standard_normal((N, H, W, C)).astype(np.float32) for i in range(n_inputs)}
    for u, v in zip(run_ort(a, feeds), run_ort(b, feeds)):
        assert u.shape == v.shape
        assert rel_l2(u, v) < 1e-6


def c(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32 if np.asarray(array).dtype.kind == "f" else np.int64),
                                   name)


CASES = {
    "unary": (lambda: ([helper.make_node("Relu", ["a0"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"])], ["s"]),
              1, 1, []),
    "add_broadcast_channel_constant": (lambda: ([helper.make_node("Add", ["a0", "k"], ["s"])], ["s"]), 1, 1,
                                       [c("k", np.arange(C, dtype=np.float32).reshape(1, C, 1, 1))]),
    "mul_rank3_constant": (lambda: ([helper.make_node("Mul", ["a0", "k"], ["s"])], ["s"]), 1, 1,
                           [c("k", np.arange(C, dtype=np.float32).reshape(C, 1, 1) + 1)]),
    "binary_two_transposed": (lambda: ([helper.make_node("Mul", ["a0", "a1"], ["s"])], ["s"]), 2, 1, []),
    "concat_channels": (lambda: ([helper.make_node("Concat", ["a0", "a1"], ["s"], axis=1)], ["s"]), 2, 1, []),
    "split_channels": (lambda: ([helper.make_node("Split", ["a0", "sp"], ["s0", "s1"], axis=1)], ["s0", "s1"]), 1, 2,
                       [c("sp", np.array([1, 3]))]),
    "slice_height_and_channels": (lambda: ([helper.make_node("Slice", ["a0", "st", "en", "ax"], ["s"])], ["s"]), 1, 1,
                                  [c("st", np.array([1, 1])), c("en", np.array([3, 5])), c("ax", np.array([1, 2]))]),
    "pad": (lambda: ([helper.make_node("Pad", ["a0", "p"], ["s"])], ["s"]), 1, 1,
            [c("p", np.array([0, 0, 1, 2, 0, 0, 3, 0]))]),
    "resize_nearest": (lambda: ([helper.make_node("Resize", ["a0", "", "sc"], ["s"], mode="nearest")], ["s"]), 1, 1,
                       [c("sc", np.array([1.0, 1.0, 2.0, 2.0]))]),
    "global_average_pool": (lambda: ([helper.make_node("GlobalAveragePool", ["a0"], ["s"])], ["s"]), 1, 1, []),
    "reduce_mean_keepdims": (lambda: ([helper.make_node("ReduceMean", ["a0"], ["s"], axes=[2, 3])], ["s"]), 1, 1, []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_transposes_cancel_through_layout_agnostic_op(case):
    body, n_in, n_out, inits = CASES[case]
    model = _sandwich(body, n_in, n_out, inits)
    out, report = _layout(model)
    assert "Transpose" not in ops(out), ops(out)
    assert report.transposes_removed == n_in + n_out
    _same_numerics(model, out, n_in)


def test_reduce_mean_opset18_axes_input():
    model = _sandwich(lambda: ([helper.make_node("ReduceMean", ["a0", "ax"], ["s"])], ["s"]), 1, 1,
                      [c("ax", np.array([2, 3]))], opset=18)
    out, _ = _layout(model)
    assert "Transpose" not in ops(out)
    _same_numerics(model, out)


def _reduce_to_2d(axes, op="ReduceMean"):
    """NHWC input → Transpose to NCHW → a reduction over `axes` dropping them."""
    nodes = [helper.make_node("Transpose", ["x0"], ["a0"], perm=[0, 3, 1, 2]),
             helper.make_node(op, ["a0"], ["y0"], axes=axes, keepdims=0)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [N, H, W, C])],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("axes", [[2, 3], [-1, -2]])
def test_a_spatial_mean_that_drops_its_axes_ends_the_region_without_a_transpose(axes):
    """With spatial_means (ort-cpu): x.mean([2, 3]) to [N, C] is the same tensor in either frame."""
    model = _reduce_to_2d(axes)
    out, report = run_pass(layout, model, True)
    assert "Transpose" not in ops(out) and report.transposes_removed == 1, ops(out)
    _same_numerics(model, out)


@pytest.mark.parametrize("axes, op, spatial_means", [
    ([2, 3], "ReduceMean", False),  # other targets: as before
    ([2, 3], "ReduceMax", True),  # no library op takes it: ORT's strided loop over the middle axes
    ([1], "ReduceMean", True), ([1, 2, 3], "ReduceMean", True),  # not over H and W alone
    ([2], "ReduceMean", True), ([0], "ReduceMean", True),  # the kept axes would come out reordered
], ids=["other_target", "max", "channels", "three_axes", "height", "batch"])
def test_other_reductions_that_drop_axes_keep_their_transpose(axes, op, spatial_means):
    model = _reduce_to_2d(axes, op)
    out, _ = run_pass(layout, model, spatial_means)
    assert ops(out) == ["Transpose", op], ops(out)
    _same_numerics(model, out)


def test_nchw_only_op_keeps_one_transpose_each_side():
    model = _sandwich(lambda: ([helper.make_node("Relu", ["a0"], ["r"]),
                                helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2]),
                                helper.make_node("Relu", ["m"], ["s"])], ["s"]))
    out, _ = _layout(model)
    assert ops(out).count("Transpose") == 2
    assert ops(out)[ops(out).index("MaxPool") - 1] == "Transpose"
    _same_numerics(model, out)


def test_pushing_does_not_add_transposes_when_a_tensor_also_feeds_nchw_ops():
    model = _sandwich(lambda: ([helper.make_node("Relu", ["a0"], ["r"]),
                                helper.make_node("MaxPool", ["a0"], ["m"], kernel_shape=[1, 1]),
                                helper.make_node("Add", ["r", "m"], ["s"])], ["s"]))
    before = ops(model).count("Transpose")
    out, _ = _layout(model)
    assert ops(out).count("Transpose") <= before
    _same_numerics(model, out)


def test_unit_dim_transpose_before_flatten_is_dropped():
    def body():
        return [helper.make_node("GlobalAveragePool", ["a0"], ["g"]), helper.make_node("Flatten", ["g"], ["f"])], ["f"]

    nodes_model = _sandwich(body)
    # the Flatten output is 2-D: drop the trailing NHWC transpose from the sandwich
    g = nodes_model.graph
    last = g.node[-1]
    g.node.remove(last)
    g.output[0].name = "f"
    out, _ = _layout(onnx.shape_inference.infer_shapes(nodes_model))
    assert "Transpose" not in ops(out)
    rng = np.random.default_rng(0)
    feeds = {"x0": rng.standard_normal((N, H, W, C)).astype(np.float32)}
    assert rel_l2(run_ort(out, feeds)[0], run_ort(nodes_model, feeds)[0]) < 1e-6


# --- regressions: the layout pass changed a model's answer or shape -----------------------------

def _conv_then(tail, inits=(), extra_inputs=(), feeds=None):
    """x [2, 8, 6, 6] → Conv 3x3 → Relu ("r") → `tail` nodes writing "y", through every pass (each
    candidate fused), compared with ORT on the original."""
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             *tail]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6]), *extra_inputs]
    m = helper.make_model(helper.make_graph(nodes, "t", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], [w, *inits]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)
    optimized, _ = optimize_model(m, policy=FusionPolicy(mode="always"))
    result = verify(m, optimized, inputs=feeds)
    assert result["passed"], result
    return optimized


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, 4, -1, -3])
def test_flatten_after_a_pooled_nhwc_region_keeps_its_shape(axis):
    _conv_then([helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["y"], axis=axis)])


def test_resize_with_sizes_computed_from_shape_keeps_them_nchw():
    w2 = numpy_helper.from_array(np.random.default_rng(2).standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    _conv_then([helper.make_node("Shape", ["r"], ["s"]),
                helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
                helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
                helper.make_node("Resize", ["r", "", "", "sizes"], ["up"], mode="nearest"),
                helper.make_node("Conv", ["up", "w2"], ["y"], pads=[1, 1, 1, 1])],
               inits=[w2, _const("zero", np.array([0], np.int64)), _const("two", np.array([2], np.int64)),
                      _const("hw", np.array([12, 10], np.int64))])


def test_resize_with_scales_from_a_graph_input_and_a_computed_roi():
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])
    scales = helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4])
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Resize", ["r", "roi", "scales"], ["up"], mode="nearest"),
             helper.make_node("Conv", ["up", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["scales", "zero"], ["roi_half"]),
             helper.make_node("Concat", ["roi_half", "ones"], ["roi"], axis=0)]
    inits = [w, numpy_helper.from_array(np.zeros(4, np.float32), "zero"),
             numpy_helper.from_array(np.ones(4, np.float32), "ones")]
    m = helper.make_model(helper.make_graph(nodes, "t", [x, scales], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    m = onnx.shape_inference.infer_shapes(m)
    optimized, _ = optimize_model(m, policy=FusionPolicy(mode="always"))
    feeds = {"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32),
             "scales": np.array([1, 1, 2, 2], np.float32)}
    assert verify(m, optimized, inputs=feeds)["passed"]


@pytest.mark.parametrize("shape", [(1, 1, 8, 1, 1), (2, 1, 1, 1, 1), (3, 1, 8, 6, 6)])
def test_elementwise_with_a_five_d_constant_stays_nchw(shape):
    value = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    _conv_then([helper.make_node("Add", ["r", "k"], ["y"])], inits=[_const("k", value)])
