"""canonicalize: Constant nodes become initializers, Conv auto_pad becomes explicit pads with
the same output, a per-channel constant Add after a Conv becomes its bias, a Concat of slices that tile a
tensor reads the tensor."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.canonicalize import canonicalize, concat_of_slices
from optimizer.report import Report
from tests.helpers import ops, rel_l2, run_ort


def _canon(model):
    report = Report()
    graph = canonicalize(gs.import_onnx(onnx.shape_inference.infer_shapes(model)), report)
    out = gs.export_onnx(concat_of_slices(graph, report))
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out, report


def _model(nodes, x_shape, inits, opset=17):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _same(a, b, shape):
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ya, yb = run_ort(a, feeds)[0], run_ort(b, feeds)[0]
    assert ya.shape == yb.shape and rel_l2(ya, yb) < 1e-6


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride,size", [(1, 9), (2, 9), (2, 10), (3, 11)])
def test_auto_pad_becomes_pads(mode, stride, size):
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 3, 3, 4)).astype(np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[stride, stride])],
               [1, 3, size, size], [w])
    out, report = _canon(m)
    conv = out.graph.node[0]
    assert "auto_pad" not in {a.name for a in conv.attribute}
    assert report.canonicalized["auto_pad → pads"] == 1
    _same(m, out, (1, 3, size, size))


def test_auto_pad_with_unknown_size_and_stride_is_left_and_reported():
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
               [1, 3, "h", "w"], [w])
    out, report = _canon(m)
    assert {a.name for a in out.graph.node[0].attribute} >= {"auto_pad"}
    assert "input size unknown" in report.skipped[0].reason


def test_constant_nodes_become_initializers():
    value = numpy_helper.from_array(np.float32(6.0), "value")
    m = _model([helper.make_node("Constant", [], ["six"], value=value),
                helper.make_node("Min", ["x", "six"], ["y"])], [1, 4], [])
    out, _ = _canon(m)
    assert ops(out) == ["Min"]
    assert [i.name for i in out.graph.initializer] == ["six"]


def test_per_channel_add_after_conv_becomes_bias():
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((5, 3, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 5, 1, 1)).astype(np.float32), "b")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["y"])],
               [2, 3, 4, 4], [w, b])
    out, _ = _canon(m)
    assert ops(out) == ["Conv"] and len(out.graph.node[0].input) == 3
    _same(m, out, (2, 3, 4, 4))


def test_add_of_a_full_tensor_is_not_a_bias():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((5, 3, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 5, 4, 4)).astype(np.float32), "b")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["y"])],
               [2, 3, 4, 4], [w, b])
    out, _ = _canon(m)
    assert ops(out) == ["Conv", "Add"]


def test_identity_of_a_constant_becomes_the_constant_so_the_conv_fuses():
    """torch.onnx writes deduplicated weights as Identity(initializer): a ResNet-50 export reads 47 of
    its conv biases that way, and before this rule none of those convs fused ("bias is not a constant")."""
    from optimizer.pipeline import optimize_model

    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b_shared")
    m = _model([helper.make_node("Identity", ["b_shared"], ["b"]),
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"])], [1, 3, 8, 8], [w, b])
    out, report = _canon(m)
    assert "Identity" not in ops(out)
    assert report.canonicalized["Identity of a constant → the constant"] == 1
    _same(m, out, (1, 3, 8, 8))
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(m), target="ort-cpu")
    assert report.fused_count() == 1 and "Relu" not in ops(optimized)


def test_identity_of_a_graph_output_stays():
    b = numpy_helper.from_array(np.ones(3, np.float32), "b")
    g = helper.make_graph([helper.make_node("Identity", ["b"], ["y"]), helper.make_node("Relu", ["x"], ["r"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [3])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out, _ = _canon(m)
    assert "Identity" in ops(out)


def test_identity_between_a_conv_and_its_activation_goes_so_the_activation_fuses():
    """paddle2onnx writes Conv -> Add(bias) -> Identity -> Relu (PP-OCRv6: 147 Identity nodes); with the
    Identity left, the conv fused alone and the Relu ran on its own."""
    from optimizer.pipeline import FusionPolicy, optimize_model

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "bias")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "bias"], ["a"]),
                helper.make_node("Identity", ["a"], ["i"]),
                helper.make_node("Relu", ["i"], ["y"])], [1, 3, 8, 8], [w, bias])
    out, report = _canon(m)
    assert "Identity" not in ops(out) and report.canonicalized["Identity → its input"] == 1
    _same(m, out, (1, 3, 8, 8))
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(m), target="ort-cpu",
                                       policy=FusionPolicy(mode="always"))
    assert ops(optimized).count("FusedConv") == 1 and "Relu" not in ops(optimized), ops(optimized)
    assert report.decisions[0].pattern == "Conv+Relu"


def _chunk_model(pieces, axis=1, concat_axis=1, form="slice", extra=True):
    """x [1, 16, 4, 4] → Relu → the pieces [(start, end), ...] along `axis` (Slices, or one Split) → a Concat
    along `concat_axis` of the pieces, then (where `extra`) a Sigmoid of the last piece, as a C2f block
    concatenates both halves of its chunk and the bottleneck's output."""
    nodes = [helper.make_node("Relu", ["x"], ["t"])]
    inits, outs = [], []
    if form == "split":
        inits.append(numpy_helper.from_array(np.array([e - s for s, e in pieces], np.int64), "sizes"))
        outs = [f"p{i}" for i in range(len(pieces))]
        nodes.append(helper.make_node("Split", ["t", "sizes"], outs, axis=axis))
    else:
        for i, (start, end) in enumerate(pieces):
            for what, v in (("s", start), ("e", end), ("a", axis)):
                inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{what}{i}"))
            nodes.append(helper.make_node("Slice", ["t", f"s{i}", f"e{i}", f"a{i}"], [f"p{i}"]))
            outs.append(f"p{i}")
    if extra:
        nodes.append(helper.make_node("Sigmoid", [outs[-1]], ["m"]))
    nodes.append(helper.make_node("Concat", outs + (["m"] if extra else []), ["y"], axis=concat_axis))
    return _model(nodes, [1, 16, 4, 4], inits, opset=13)


@pytest.mark.parametrize("form", ["slice", "split"])
@pytest.mark.parametrize("pieces", [[(0, 8), (8, 16)], [(0, 5), (5, 6), (6, 16)], [(0, 8), (8, 2**63 - 1)]])
def test_a_concat_of_slices_that_tile_a_tensor_reads_the_tensor(form, pieces):
    if form == "split" and pieces[-1][1] > 16:
        pieces = [(0, 8), (8, 16)]
    model = _chunk_model(pieces, form=form)
    out, report = _canon(model)
    assert report.canonicalized["Concat of slices that tile a tensor → the tensor"] == 1
    concat = next(n for n in out.graph.node if n.op_type == "Concat")
    assert list(concat.input) == ["t", "m"]  # the last piece stays for the Sigmoid; the others are gone
    assert ops(out).count("Slice") == (1 if form == "slice" else 0)
    _same(model, out, [1, 16, 4, 4])


@pytest.mark.parametrize("pieces", [[(0, 8), (8, 12)],    # not to the end
                                    [(8, 16), (0, 8)],    # out of order
                                    [(2, 8), (8, 16)]])   # not from 0
def test_slices_that_do_not_tile_the_tensor_stay(pieces):
    model = _chunk_model(pieces, extra=False)
    out, report = _canon(model)
    assert not report.canonicalized["Concat of slices that tile a tensor → the tensor"]
    assert ops(out).count("Slice") == len(pieces)
    _same(model, out, [1, 16, 4, 4])


def test_slices_along_another_axis_than_the_concat_stay():
    """Halves of H concatenated along C: the pieces tile H, not the concat's axis."""
    model = _chunk_model([(0, 2), (2, 4)], axis=2, concat_axis=1, extra=False)
    out, report = _canon(model)
    assert not report.canonicalized["Concat of slices that tile a tensor → the tensor"]
    _same(model, out, [1, 16, 4, 4])


def test_a_concat_of_all_the_pieces_alone_becomes_the_tensor():
    model = _chunk_model([(0, 8), (8, 16)], form="split", extra=False)
    out, _ = _canon(model)
    assert "Concat" not in ops(out) and "Split" not in ops(out)
    _same(model, out, [1, 16, 4, 4])


def test_a_split_of_sizes_computed_at_run_time_is_not_a_tiling():
    """The Split's sizes are a graph input: nothing says its pieces tile the tensor as equal parts would."""
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Split", ["t", "sizes"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4]),
                                       helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 13)])))
    report = Report()
    graph = concat_of_slices(canonicalize(graph, report), report)
    assert not report.canonicalized["Concat of slices that tile a tensor → the tensor"]
    assert [n.op for n in graph.nodes] == ["Relu", "Split", "Concat"]
