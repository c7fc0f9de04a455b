"""channel_concat: on ort-cpu (fp32, bf16) a channels-last region's Concat along the channels becomes
epifuse::ChannelConcat with the same result; other targets and precisions keep (or get back) the Concat.
The op itself is checked exactly against numpy, on every copy path the CPU has."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from models import zoo
from optimizer.passes.channel_concat import OP_TYPE, channel_concat
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import ops

REWRITE = f"channels-last Concat → epifuse::{OP_TYPE} (ort-cpu)"
# the copy's paths: AVX-512 (64-byte vectors, a masked tail), AVX2 (32-byte vectors, memcpy's tail)
ISAS = ["avx512", "avx2"]


def _concat_model(shapes, name="cat", bf16=False):
    """ChannelConcat of inputs x0, x1, ... of `shapes`; on bfloat16 data fed and read as float through Casts."""
    inputs = [f"x{i}" for i in range(len(shapes))]
    nodes, data = [], inputs
    if bf16:
        nodes += [helper.make_node("Cast", [x], [f"{x}b"], to=TensorProto.BFLOAT16) for x in inputs]
        data = [f"{x}b" for x in inputs]
    nodes.append(helper.make_node(OP_TYPE, data, ["yb" if bf16 else "y"], name=name, domain="epifuse"))
    if bf16:
        nodes.append(helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(s))
                                                for x, s in zip(inputs, shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


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


@pytest.mark.parametrize("target,precision", [("ort-cuda", "fp32"), ("ort-cpu", "fp16"), ("tensorrt", "fp32")])
def test_other_targets_and_precisions_keep_the_concat(target, precision):
    optimized, report = optimize_model(onnx.shape_inference.infer_shapes(zoo.yolo_tiny()), target=target,
                                       precision=precision, policy=FusionPolicy(mode="always"))
    assert OP_TYPE not in ops(optimized) and not any(OP_TYPE in k for k in report.canonicalized)


def test_the_op_goes_back_to_a_concat_for_another_target():
    graph = gs.import_onnx(_concat_model([(1, 4, 4, 8), (1, 4, 4, 3)]))
    report = Report()
    channel_concat(graph, report, "tensorrt", "fp32")
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
        channel_concat(graph, Report(), "ort-cpu", "fp32")
        assert [n.op for n in graph.nodes] == ["Concat"], (shapes, axis, constant)
