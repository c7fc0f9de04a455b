"""shape_constants: Reshape and Slice arguments computed from Shape ops become constants where the
model's declared shape fixes them (the batch kept symbolic: 0 copies it, -1 infers it), with the same
outputs on ONNX Runtime at several batch sizes; what depends on a symbolic size in arithmetic, and
Reshapes with allowzero, stay computed."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.shape_constants import shape_constants
from tests.helpers import ops, run_ort, run_pass


def _model(nodes, inits, x_shape, y_shape=None, opset=17):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _dim(i, src="x", name=None):
    """torch.onnx's `src.size(i)` as a 1-element vector: Shape → Gather(scalar) → Unsqueeze."""
    name = name or f"{src}_d{i}"
    return [helper.make_node("Shape", [src], [f"{name}_s"]),
            helper.make_node("Gather", [f"{name}_s", f"i{i}"], [f"{name}_g"], axis=0),
            helper.make_node("Unsqueeze", [f"{name}_g", "zero_axis"], [name])]


INDICES = {f"i{i}": np.int64(i) for i in range(4)} | {"zero_axis": [0]}


def _shuffle_model(groups=2):
    """ShuffleNetV2's channel shuffle as torch.onnx writes it: view(b, g, c // g, h, w), transpose(1, 2),
    view(b, c, h, w), every size read from Shape ops; a Relu between so the data is not a graph input."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    nodes += _dim(0, "r") + _dim(1, "r") + _dim(2, "r") + _dim(3, "r")
    nodes += [helper.make_node("Div", ["r_d1", "g"], ["cg"]),
              helper.make_node("Cast", ["cg"], ["cg64"], to=TensorProto.INT64),
              helper.make_node("Concat", ["r_d0", "g", "cg64", "r_d2", "r_d3"], ["shape5"], axis=0),
              helper.make_node("Reshape", ["r", "shape5"], ["v"]),
              helper.make_node("Transpose", ["v"], ["t"], perm=[0, 2, 1, 3, 4])]
    nodes += _dim(0, "t", "t_d0")
    nodes += [helper.make_node("Concat", ["t_d0", "r_d1", "r_d2", "r_d3"], ["shape4"], axis=0),
              helper.make_node("Reshape", ["t", "shape4"], ["y"])]
    return _model(nodes, INDICES | {"g": [groups]}, ["batch", 12, 5, 6])


def _same_outputs(a, b, shape):
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)}
        for u, v in zip(run_ort(a, feeds), run_ort(b, feeds)):
            assert u.shape == v.shape and np.array_equal(u, v)


def test_channel_shuffle_runs_without_shape_ops():
    model = _shuffle_model()
    out, report = run_pass(shape_constants, model)
    assert "Shape" not in ops(out) and ops(out) == ["Relu", "Reshape", "Transpose", "Reshape"]
    shapes = [numpy_helper.to_array(i).tolist() for i in out.graph.initializer if i.data_type == TensorProto.INT64]
    assert [0, 2, 6, 5, 6] in shapes and [0, 12, 5, 6] in shapes  # the batch copied, the rest fixed
    assert report.canonicalized["Reshape shape computed at run time → constant"] == 2
    _same_outputs(model, out, (12, 5, 6))


def test_a_symbolic_size_moved_to_another_position_is_inferred():
    """Reshape [b, c, h, w] -> [c, b, h * w]: b sits at position 1, so only -1 can stand for it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _dim(0, "r") + _dim(1, "r")
    nodes += [helper.make_node("Concat", ["r_d1", "r_d0", "hw"], ["shape"], axis=0),
              helper.make_node("Reshape", ["r", "shape"], ["y"])]
    model = _model(nodes, INDICES | {"hw": [30]}, ["batch", 4, 5, 6])
    out, _ = run_pass(shape_constants, model)
    assert ops(out) == ["Relu", "Reshape"]
    assert [4, -1, 30] in [numpy_helper.to_array(i).tolist() for i in out.graph.initializer]
    _same_outputs(model, out, (4, 5, 6))


def test_slice_bounds_from_shape_ops_become_constants():
    """torch.chunk(x, 2, dim=1) as YOLO's C2f exports it: the split point is Shape → Gather → Div."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _dim(1, "r")
    nodes += [helper.make_node("Div", ["r_d1", "two"], ["half"]),
              helper.make_node("Slice", ["r", "half", "big", "one"], ["y"])]
    model = _model(nodes, INDICES | {"two": [2], "big": [2**62], "one": [1]}, ["batch", 8, 3, 3])
    out, report = run_pass(shape_constants, model)
    assert ops(out) == ["Relu", "Slice"] and report.canonicalized["shape arithmetic → constant"] >= 1
    _same_outputs(model, out, (8, 3, 3))


@pytest.mark.parametrize("case", ["symbolic arithmetic", "allowzero", "two symbols elsewhere"])
def test_what_depends_on_a_symbolic_size_stays_computed(case):
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _dim(0, "r") + _dim(1, "r") + _dim(2, "r") + _dim(3, "r")
    if case == "symbolic arithmetic":  # [b, c, h * w] with h, w symbolic: h * w is not known here
        nodes += [helper.make_node("Mul", ["r_d2", "r_d3"], ["hw"]),
                  helper.make_node("Concat", ["r_d0", "r_d1", "hw"], ["shape"], axis=0),
                  helper.make_node("Reshape", ["r", "shape"], ["y"])]
        x_shape = ["batch", 4, "h", "w"]
    elif case == "allowzero":  # 0 would then mean a size of zero, not "copy"
        nodes += [helper.make_node("Concat", ["r_d0", "r_d1", "r_d2", "r_d3"], ["shape"], axis=0),
                  helper.make_node("Reshape", ["r", "shape"], ["y"], allowzero=1)]
        x_shape = ["batch", 4, 5, 6]
    else:  # [w, h, c, b] with b, h, w symbolic: neither 0 nor a single -1 can stand for them
        nodes += [helper.make_node("Concat", ["r_d3", "r_d2", "r_d1", "r_d0"], ["shape"], axis=0),
                  helper.make_node("Reshape", ["r", "shape"], ["y"])]
        x_shape = ["batch", 4, "h", "w"]
    model = _model(nodes, INDICES, x_shape, opset=17 if case != "allowzero" else 19)
    out, _ = run_pass(shape_constants, model)
    assert "Shape" in ops(out) and ops(out)[-1] == "Reshape"
    reshape = out.graph.node[-1]
    assert reshape.input[1] == "shape"  # still the computed one
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4, 5, 6)).astype(np.float32)}
    for u, v in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert np.array_equal(u, v)


def test_a_model_without_shape_ops_is_left_as_it_is():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    model = _model(nodes, {"shape": [0, -1]}, ["batch", 4, 5, 6])
    out, report = run_pass(shape_constants, model)
    assert ops(out) == ops(model) and not report.canonicalized


def test_a_symbol_named_twice_in_an_input_is_not_trusted():
    """[N, 4, "s", "s"]: ORT runs it with different heights and widths, so "s" at position 3 of a Reshape
    shape taken from the height is not the width."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _dim(0, "r") + _dim(1, "r") + _dim(2, "r") + _dim(3, "r")
    nodes += [helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2]),
              helper.make_node("Concat", ["r_d0", "r_d1", "r_d2", "r_d3"], ["shape"], axis=0),
              helper.make_node("Reshape", ["t", "shape"], ["y"])]
    model = _model(nodes, INDICES, ["batch", 4, "s", "s"])
    out, _ = run_pass(shape_constants, model)
    assert out.graph.node[-1].input[1] == "shape"
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4, 5, 6)).astype(np.float32)}
    for u, v in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert u.shape == v.shape == (2, 4, 5, 6) and np.array_equal(u, v)


def test_a_scalar_stays_a_scalar():
    """MobileViT's unfold: batch * channels (a symbolic size times a known scalar) unsqueezed into a Reshape
    shape. The known scalar becomes a 0-D constant, not a 1-element vector: Mul's output keeps its rank,
    and so do the Unsqueeze and Concat after it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
             helper.make_node("Mul", ["b", "c"], ["bc"]),
             helper.make_node("Unsqueeze", ["bc", "zero_axis"], ["bc1"]),
             helper.make_node("Concat", ["bc1", "minus_one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    model = _model(nodes, INDICES | {"minus_one": [-1]}, ["batch", 4, 5, 6])
    out, report = run_pass(shape_constants, model)
    assert report.canonicalized["shape arithmetic → constant"] == 1  # c = 4, a scalar
    assert [list(numpy_helper.to_array(i).shape) for i in out.graph.initializer if i.name.startswith("c_")] == [[]]
    onnx.shape_inference.infer_shapes(out, strict_mode=True)
    _same_outputs(model, out, (4, 5, 6))


def _same_pad(axis: int, size_name: str, kernel: int, stride: int) -> list:
    """timm's TensorFlow "same" padding of one spatial axis as torch.onnx writes it, in floating point:
    pad = max((ceil(size / stride) - 1) * stride + kernel - size, 0), split pad // 2 before, the rest after."""
    f = f"{size_name}_f"
    return _dim(axis, "r", size_name) + [
        helper.make_node("Cast", [size_name], [f], to=TensorProto.FLOAT),
        helper.make_node("Div", [f, "stride_f"], [f"{f}_q"]),
        helper.make_node("Ceil", [f"{f}_q"], [f"{f}_c"]),
        helper.make_node("Sub", [f"{f}_c", "one_f"], [f"{f}_c1"]),
        helper.make_node("Mul", [f"{f}_c1", "stride_f"], [f"{f}_m"]),
        helper.make_node("Add", [f"{f}_m", "kernel_f"], [f"{f}_a"]),
        helper.make_node("Sub", [f"{f}_a", f], [f"{f}_p"]),
        helper.make_node("Clip", [f"{f}_p", "zero_f"], [f"{f}_pad"]),
        helper.make_node("Div", [f"{f}_pad", "two_f"], [f"{f}_half"]),
        helper.make_node("Cast", [f"{f}_half"], [f"{size_name}_before"], to=TensorProto.INT64),
        helper.make_node("Cast", [f"{f}_pad"], [f"{size_name}_pad"], to=TensorProto.INT64),
        helper.make_node("Sub", [f"{size_name}_pad", f"{size_name}_before"], [f"{size_name}_after"]),
    ]


def test_tensorflow_same_padding_computed_in_floating_point_becomes_constant():
    """timm's tf_ models pad each strided conv's input by amounts computed at run time from Shape ops in
    floating point (Cast, Div, Ceil, Clip): folded, the Pad's amounts are constants and the shapes after it
    known, so the conv behind it can be measured and fused; the outputs stay the same at several batch
    sizes, with the batch symbolic."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    nodes += _same_pad(2, "h", 3, 2) + _same_pad(3, "w", 3, 2)
    nodes += [helper.make_node("Concat", ["zeros2", "h_before", "w_before", "zeros2", "h_after", "w_after"],
                               ["pads"], axis=0),
              helper.make_node("Pad", ["r", "pads"], ["p"]),
              helper.make_node("Conv", ["p", "wt"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    model = _model(nodes, INDICES | {"zeros2": [0, 0]}, ["batch", 4, 8, 7])
    floats = {"stride_f": 2.0, "one_f": 1.0, "kernel_f": 3.0, "zero_f": 0.0, "two_f": 2.0}
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.float32), k) for k, v in floats.items())
    weight = np.random.default_rng(1).standard_normal((5, 4, 3, 3)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(weight, "wt"))
    model = onnx.shape_inference.infer_shapes(model)
    out, report = run_pass(shape_constants, model)
    assert ops(out) == ["Relu", "Pad", "Conv"]
    assert report.canonicalized["constant arithmetic → constant"] > 0
    pads = next(numpy_helper.to_array(i) for i in out.graph.initializer if i.name == out.graph.node[1].input[1])
    assert pads.tolist() == [0, 0, 0, 1, 0, 0, 1, 1]  # 8 rows: 0 before, 1 after; 7 columns: 1 and 1
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
              for g in [onnx.shape_inference.infer_shapes(out).graph] for v in [*g.value_info, *g.output]}
    assert shapes["p"] == ["batch", 4, 9, 9] and shapes["y"] == ["batch", 5, 4, 4]
    _same_outputs(model, out, (4, 8, 7))


def test_small_constant_folding_leaves_weights_alone():
    """Only shape-sized results are computed ahead: a Transpose of a filter stays in the model."""
    nodes = [helper.make_node("Transpose", ["wt"], ["wt_t"], perm=[1, 0, 2, 3]),
             helper.make_node("Relu", ["x"], ["r"])] + _dim(0, "r") + _dim(1, "r") + _dim(2, "r") + _dim(3, "r")
    nodes += [helper.make_node("Concat", ["r_d0", "r_d1", "r_d2", "r_d3"], ["shape"], axis=0),
              helper.make_node("Reshape", ["r", "shape"], ["rr"]),
              helper.make_node("Conv", ["rr", "wt_t"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    model = _model(nodes, INDICES, ["batch", 16, 5, 6])
    weight = np.random.default_rng(2).standard_normal((16, 16, 3, 3)).astype(np.float32)  # 9 KiB
    model.graph.initializer.append(numpy_helper.from_array(weight, "wt"))
    model = onnx.shape_inference.infer_shapes(model)
    out, _ = run_pass(shape_constants, model)
    assert "Shape" not in ops(out) and "Transpose" in ops(out)
    _same_outputs(model, out, (16, 5, 6))


def test_an_op_of_another_domain_is_left_out_of_the_folding_and_the_rest_folds():
    """ONNX Runtime cannot evaluate an op it does not know: it stays, reading the folded constant."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + _dim(1, "r") + [
        helper.make_node("Cast", ["r_d1"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Scale", ["c"], ["s"], domain="vendor.ops"),
        helper.make_node("Mul", ["r", "s"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 5, 6])],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in INDICES.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor.ops", 1)])
    model.ir_version = 8
    out, report = run_pass(shape_constants, onnx.shape_inference.infer_shapes(model))
    assert ops(out) == ["Relu", "Scale", "Mul"] and report.canonicalized["constant arithmetic → constant"] == 1
    scale = out.graph.node[1]
    assert numpy_helper.to_array(next(i for i in out.graph.initializer if i.name == scale.input[0])).tolist() == [4.0]


def test_a_graph_output_computed_from_constants_keeps_its_node():
    """A model that returns a size it computes (here the channel count as a float) still computes it."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])] + _dim(1, "y") + [
        helper.make_node("Cast", ["y_d1"], ["channels"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 5, 6]),
                           helper.make_tensor_value_info("channels", TensorProto.FLOAT, [1])],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in INDICES.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    out, _ = run_pass(shape_constants, model)
    assert ops(out) == ["Relu", "Cast"] and [o.name for o in out.graph.output] == ["y", "channels"]
    _same_outputs(model, out, (4, 5, 6))
