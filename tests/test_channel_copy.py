"""channel_copy: on ort-cpu (fp32, bf16) a channels-last region's Concat along the channels becomes
epifuse::ChannelConcat, and its Split or Slice along them one epifuse::ChannelSlice an output, with the same
result; other targets and precisions keep (or get back) the Concat and Slices. The ops themselves are
checked exactly against numpy, on every copy path the CPU has."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.passes.channel_copy import OP_TYPE, SLICE_OP, channel_copy
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import OTHER_TARGETS, assert_op_stays_out, cpu_flags, ops

REWRITE = f"channels-last Concat → epifuse::{OP_TYPE} (ort-cpu)"
SLICE_REWRITE = f"channels-last Slice → epifuse::{SLICE_OP} (ort-cpu)"
SPLIT_REWRITE = f"channels-last Split → epifuse::{SLICE_OP} an output (ort-cpu)"
# the copy's paths: AVX-512 (64-byte vectors, a masked tail), AVX2 (32-byte vectors, memcpy's tail)
ISAS = [pytest.param("avx512", marks=pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags(),
                                                       reason="the AVX-512 copy needs AVX-512 with BW and VL")),
        pytest.param("avx2", marks=pytest.mark.skipif("avx2" not in cpu_flags(), reason="no AVX2"))]


def _op_model(op, shapes, name, bf16=False, **attrs):
    """The library op `op` of inputs x0, x1, ... of `shapes`; on bfloat16 data fed and read as float through
    Casts."""
    inputs = [f"x{i}" for i in range(len(shapes))]
    nodes, data = [], inputs
    if bf16:
        nodes += [helper.make_node("Cast", [x], [f"{x}b"], to=TensorProto.BFLOAT16) for x in inputs]
        data = [f"{x}b" for x in inputs]
    nodes.append(helper.make_node(op, data, ["yb" if bf16 else "y"], name=name, domain="epifuse", **attrs))
    if bf16:
        nodes.append(helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(s))
                                                for x, s in zip(inputs, shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _concat_model(shapes, name="cat", bf16=False):
    return _op_model(OP_TYPE, shapes, name, bf16)


def _slice_model(shape, start, end, name="slice", bf16=False):
    return _op_model(SLICE_OP, [shape], name, bf16, start=start, end=end)


def _run(model, xs, threads=None):
    sess = ort.InferenceSession(model.SerializeToString(), session_options(threads=threads),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0]


SHAPES = [[(2, 5, 7, 16)] * 3,                               # whole 64-byte rows
          [(1, 3, 4, 3), (1, 3, 4, 5), (1, 3, 4, 17), (1, 3, 4, 64), (1, 3, 4, 1)],  # tails of every size
          [(1, 160, 160, 16), (1, 160, 160, 16), (1, 160, 160, 32)],  # several threads' pieces
          [(1, 20, 20, 100), (1, 20, 20, 0), (1, 20, 20, 28)],  # an input without channels
          [(1, 0, 5, 8), (1, 0, 5, 8)]]                      # no pixels


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shapes", SHAPES)
def test_the_op_concatenates_exactly(isa, shapes, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)  # a cap: the AVX2 path on an AVX-512 CPU
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for x in xs:
        if x.size:
            x.flat[0], x.flat[-1] = np.nan, -np.inf  # moved, never computed
    for threads in (1, 2):
        np.testing.assert_array_equal(_run(_concat_model(shapes), xs, threads), np.concatenate(xs, axis=3))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shapes", SHAPES[:4])
def test_the_op_concatenates_bf16_exactly(isa, shapes, monkeypatch):
    """bfloat16 data: two-byte elements, so odd channel counts leave odd tails of bytes."""
    import ml_dtypes

    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = np.concatenate(xs, axis=3).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(_run(_concat_model(shapes, bf16=True), xs), expected)


def test_inputs_of_other_pixels_are_an_error_naming_the_node():
    shapes = [(1, 4, 4, 8), (1, 4, 5, 8)]
    with pytest.raises(Exception, match=r"epifuse::ChannelConcat node 'bad_cat'.*input 1 \[1, 4, 5, 8\]"):
        _run(_concat_model(shapes, name="bad_cat"), [np.zeros(s, np.float32) for s in shapes])


def test_a_model_with_one_input_fails_at_session_creation():
    """ONNX allows a Concat of one tensor; the op asks for two or more (the pass never writes fewer)."""
    with pytest.raises(Exception, match="ChannelConcat"):
        _run(_concat_model([(1, 4, 4, 8)]), [np.zeros((1, 4, 4, 8), np.float32)])


def test_yolo_concats_become_the_op_with_the_same_result():
    original = onnx.shape_inference.infer_shapes(zoo.yolo_tiny())
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized[REWRITE] > 0 and OP_TYPE in ops(optimized)
    assert verify(original, optimized)["passed"]


def test_a_bf16_model_on_the_cpu_concatenates_its_bf16_data():
    """--precision bf16 on ort-cpu: the concat reads the bf16 FusedConv outputs as they are (no Casts between),
    and the model computes the original within bf16's rounding."""
    original = onnx.shape_inference.infer_shapes(zoo.yolo_tiny())
    optimized, _ = optimize_model(original, target="ort-cpu", precision="bf16", policy=FusionPolicy(mode="always"))
    producers = {o: n.op_type for n in optimized.graph.node for o in n.output}
    concats = [n for n in optimized.graph.node if n.op_type == OP_TYPE]
    assert concats and any(all(producers.get(i) != "Cast" for i in n.input) for n in concats)
    assert verify(original, optimized, precision="bf16")["passed"]


@pytest.mark.parametrize("target,precision", OTHER_TARGETS)
def test_other_targets_and_precisions_keep_the_concat(target, precision):
    assert_op_stays_out(zoo.yolo_tiny(), OP_TYPE, target, precision)


def test_the_op_goes_back_to_a_concat_for_another_target():
    graph = gs.import_onnx(_concat_model([(1, 4, 4, 8), (1, 4, 4, 3)]))
    report = Report()
    channel_copy(graph, report, "tensorrt", "fp32")
    assert [(n.op, n.domain or "", n.attrs) for n in graph.nodes] == [("Concat", "", {"axis": 3})]
    assert report.canonicalized[f"epifuse::{OP_TYPE} → Concat (tensorrt, fp32)"] == 1


def test_concats_of_other_axes_ranks_or_constants_stay():
    def model(shapes, axis, constant=False):
        inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(s)) for i, s in enumerate(shapes)]
        names = [f"x{i}" for i in range(len(shapes))]
        inits = []
        if constant:
            inits = [onnx.numpy_helper.from_array(np.ones(shapes[0], np.float32), "c")]
            names.append("c")
        graph = helper.make_graph([helper.make_node("Concat", names, ["y"], axis=axis)], "m", inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        return gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    for shapes, axis, constant in [([(1, 8, 4, 4), (1, 8, 4, 4)], 1, False),  # NCHW channels
                                   ([(1, 4, 4, 8), (1, 4, 4, 8)], 2, False),  # width
                                   ([(4, 8), (4, 8)], -1, False),             # 2-D
                                   ([(1, 4, 4, 8)], 3, False),                # one input
                                   ([(1, 4, 4, 8)], 3, True)]:                # a constant input
        graph = model(shapes, axis, constant)
        channel_copy(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == ["Concat"], (shapes, axis, constant)


SLICES = [((2, 5, 7, 32), 16, 32),           # the second half: whole 64-byte rows
          ((1, 3, 4, 37), 5, 22),            # odd start and length: tails
          ((1, 160, 160, 32), 0, 16),        # several threads' pieces
          ((1, 20, 20, 100), 60, 2**62),     # an end past C: to the end, as Slice clamps it
          ((1, 0, 5, 8), 2, 4)]              # no pixels


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape,start,end", SLICES)
def test_the_slice_op_copies_exactly(isa, shape, start, end, monkeypatch):
    import ml_dtypes

    monkeypatch.setenv("EPIFUSE_CPU_ISA", isa)
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    if x.size:
        x.flat[0], x.flat[-1] = np.nan, np.inf
    for threads in (1, 2):
        np.testing.assert_array_equal(_run(_slice_model(shape, start, end), [x], threads), x[..., start:end])
    expected = x[..., start:end].astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(_run(_slice_model(shape, start, end, bf16=True), [x]), expected)


def test_a_slice_past_the_channels_is_an_error_naming_the_node():
    with pytest.raises(Exception, match=r"epifuse::ChannelSlice node 'bad_slice'.*\[8, 12\).*\[1, 4, 4, 8\]"):
        _run(_slice_model((1, 4, 4, 8), 8, 12, name="bad_slice"), [np.zeros((1, 4, 4, 8), np.float32)])


@pytest.mark.parametrize("start,end", [(-1, 4), (4, 4)])
def test_a_slice_of_no_channels_fails_at_session_creation(start, end):
    with pytest.raises(Exception, match=r"ChannelSlice node 'slice'"):
        _run(_slice_model((1, 4, 4, 8), start, end), [np.zeros((1, 4, 4, 8), np.float32)])


def _nhwc_chunk_model(form):
    """x [1, 6, 6, 24] → Relu → a Split of the channels into 8 + 16, or two Slices [0:8) and [8:) → Sigmoid of
    each piece → Concat back along the channels: the optimizer's own NHWC form of a C2f chunk."""
    nodes, inits = [helper.make_node("Relu", ["x"], ["t"])], []
    if form == "split":
        inits.append(onnx.numpy_helper.from_array(np.array([8, 16], np.int64), "sizes"))
        nodes.append(helper.make_node("Split", ["t", "sizes"], ["a", "b"], axis=3))
    else:
        for name, start, end in (("a", 0, 8), ("b", 8, 2**63 - 1)):
            for what, v in (("s", start), ("e", end), ("ax", -1)):
                inits.append(onnx.numpy_helper.from_array(np.array([v], np.int64), f"{name}_{what}"))
            nodes.append(helper.make_node("Slice", ["t", f"{name}_s", f"{name}_e", f"{name}_ax"], [name]))
    nodes += [helper.make_node("Sigmoid", ["a"], ["sa"]), helper.make_node("Sigmoid", ["b"], ["sb"]),
              helper.make_node("Concat", ["sb", "sa"], ["y"], axis=3)]
    graph = helper.make_graph(nodes, "chunk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 6, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("form", ["split", "slice"])
def test_channels_last_splits_and_slices_become_the_slice_op_with_the_same_result(form):
    model = onnx.shape_inference.infer_shapes(_nhwc_chunk_model(form))
    graph = gs.import_onnx(model)
    report = Report()
    channel_copy(graph, report, "ort-cpu", "fp32")
    out = gs.export_onnx(graph)
    assert ops(out).count(SLICE_OP) == 2 and OP_TYPE in ops(out) and not {"Split", "Slice", "Concat"} & set(ops(out))
    assert report.canonicalized[SPLIT_REWRITE if form == "split" else SLICE_REWRITE] == (1 if form == "split" else 2)
    x = np.random.default_rng(8).standard_normal((1, 6, 6, 24)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(out.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got.run(None, {"x": x})[0], expected)
    back = gs.import_onnx(out)
    channel_copy(back, Report(), "tensorrt", "fp32")  # and back: standard ops only, the same result
    back_model = gs.export_onnx(back)
    assert not {OP_TYPE, SLICE_OP} & set(ops(back_model))
    np.testing.assert_array_equal(ort.InferenceSession(back_model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, {"x": x})[0], expected)


def test_slices_of_other_axes_or_steps_stay():
    def model(axis, step):
        inits = [onnx.numpy_helper.from_array(np.array([v], np.int64), n)
                 for n, v in (("s", 0), ("e", 2), ("a", axis), ("st", step))]
        graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], "m",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        return gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    for axis, step in [(1, 1), (2, 1), (3, 2)]:
        graph = model(axis, step)
        channel_copy(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == ["Slice"], (axis, step)


def test_yolo_chunks_become_slice_ops_with_the_same_result():
    """yolo_tiny's C2f blocks: after concat_of_slices the chunk's second half is all that is sliced."""
    original = onnx.shape_inference.infer_shapes(zoo.yolo_tiny())
    optimized, _ = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert SLICE_OP in ops(optimized) and not {"Split", "Slice"} & set(ops(optimized))
    assert verify(original, optimized)["passed"]


def test_splits_of_run_time_or_uneven_sizes_and_slices_past_the_channels_stay():
    """Sizes computed at run time, equal parts that do not divide C before opset 18 (an error there, which
    ORT must report), sizes that do not add up to C, a slice starting at or past C: left to ORT."""
    def graph_of(nodes, inits=(), extra_inputs=()):
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 10])] + list(extra_inputs)
        graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                       for o in nodes[-1].output], list(inits))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        return gs.import_onnx(onnx.shape_inference.infer_shapes(model))

    run_time = graph_of([helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=3)],
                        extra_inputs=[helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])])
    uneven = graph_of([helper.make_node("Split", ["x"], ["a", "b", "c"], axis=3)])
    short = graph_of([helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=3)],
                     [onnx.numpy_helper.from_array(np.array([3, 4], np.int64), "sizes")])
    past = graph_of([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                    [onnx.numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 10), ("e", 12),
                                                                                          ("a", 3))])
    for name, graph, op in (("run time", run_time, "Split"), ("uneven", uneven, "Split"), ("short", short, "Split"),
                            ("past C", past, "Slice")):
        channel_copy(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == [op], name
