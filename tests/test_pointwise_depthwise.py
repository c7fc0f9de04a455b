"""epifuse::FusedPointwiseDepthwise, an expand 1x1 conv and the depthwise conv that reads it as one node on ort-cpu:
the op through ONNX Runtime against a float64 numpy reference of the two convs, run in bands (each thread's 1x1
rows in a window of its own) and separately, over every activation of either conv, maps whose bands, pieces
and padding fall differently, batches and thread counts; its errors at session creation; the pass that makes
it and the one that splits it again; and the whole-model check that keeps the pairs only where not slower."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conv_reference import fused_conv, rel_l2
from models import zoo
from optimizer import contract
from optimizer.contract import ACTIVATIONS
from optimizer.passes.load import validate
from optimizer.passes.pointwise_depthwise import DEPTHWISE_FIRST_OP_TYPE, MEAN_OP_TYPE, OP_TYPE
from optimizer.pipeline import FusionPolicy, _pairs_check, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import cpu_flags
from tests.test_cpu_onednn import PARAMS

TOL = 1e-5  # fp32
pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the bands' kernels need AVX2 and FMA")


def _inputs(n, h, w, c, k, r):
    """X (its own random stream) and the filters and biases (the same for every batch size)."""
    x = np.random.default_rng(1).standard_normal((n, h, w, c)).astype(np.float32)
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((k, 1, 1, c)) / np.sqrt(c)).astype(np.float32)
    b1 = (rng.standard_normal(k) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((k, r, r, 1)) / r).astype(np.float32)
    b2 = (rng.standard_normal(k) * 0.3).astype(np.float32)
    return x, w1, b1, w2, b2


def _pair_model(h, w, c, k, r, *, strides=(1, 1), pads=None, activation="relu", pointwise="relu",
                pointwise_params=None, activation_params=None, **extra) -> onnx.ModelProto:
    pads = list(pads if pads is not None else [r // 2] * 4)
    _, w1, b1, w2, b2 = _inputs(1, h, w, c, k, r)
    attrs = dict(strides=list(strides), pads=pads, group=k, activation=activation, pointwise_activation=pointwise,
                 **extra)
    if pointwise_params is not None:
        attrs["pointwise_activation_params"] = list(pointwise_params)
    if activation_params is not None:
        attrs["activation_params"] = list(activation_params)
    node = helper.make_node(OP_TYPE, ["x", "w", "b", "dw", "db"], ["y"], name="pair", domain="epifuse", **attrs)
    inits = [helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.tobytes(), raw=True)
             for name, a in (("w", w1), ("b", b1), ("dw", w2), ("db", b2))]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", h, w, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _reference(x, w1, b1, w2, b2, *, strides, pads, activation, pointwise, pointwise_params=(), activation_params=()):
    mid = fused_conv(x, w1, b1, activation=pointwise, activation_params=pointwise_params)
    return fused_conv(mid, w2, b2, strides=strides, pads=pads, group=w2.shape[0], activation=activation,
                      activation_params=activation_params)


def set_way(monkeypatch, way):
    """The pairs run `way`: "separate" forced, else the library's own way (bands where they can run); read
    when a session creates its kernels."""
    if way == "separate":
        monkeypatch.setenv("EPIFUSE_POINTWISE_DEPTHWISE", way)
    else:
        monkeypatch.delenv("EPIFUSE_POINTWISE_DEPTHWISE", raising=False)


def _check(monkeypatch, way, n, h, w, c, k, r, *, threads=None, strides=(1, 1), pads=None, activation="relu",
           pointwise="relu"):
    """The op run `way` ("bands", the library's own way where the bands' kernels run the problem, or
    "separate") against the reference."""
    set_way(monkeypatch, way)
    pads = tuple(pads if pads is not None else [r // 2] * 4)
    pw_params, dw_params = PARAMS.get(pointwise, ()), PARAMS.get(activation, ())
    model = _pair_model(h, w, c, k, r, strides=strides, pads=pads, activation=activation, pointwise=pointwise,
                        pointwise_params=pw_params or None, activation_params=dw_params or None)
    session = ort.InferenceSession(model.SerializeToString(), session_options(threads=threads),
                                   providers=["CPUExecutionProvider"])
    x, w1, b1, w2, b2 = _inputs(n, h, w, c, k, r)
    for _ in range(2):  # the second run: filters prepared, windows of the call before
        y = session.run(None, {"x": x})[0]
    ref = _reference(x, w1, b1, w2, b2, strides=strides, pads=pads, activation=activation, pointwise=pointwise,
                     pointwise_params=pw_params, activation_params=dw_params)
    assert y.shape == ref.shape
    assert rel_l2(y, ref) <= TOL, (way, rel_l2(y, ref))


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_of_the_1x1_conv(monkeypatch, way, activation):
    """The 1x1 conv's epilogue on its tile in registers (one switch a tile); 20 input and 44 output channels
    end in partial vectors."""
    _check(monkeypatch, way, 1, 9, 11, 20, 44, 3, pointwise=activation, activation="relu")


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_of_the_depthwise_conv(monkeypatch, activation):
    _check(monkeypatch, "bands", 1, 9, 11, 20, 44, 3, pointwise="identity", activation=activation)


# (N, H, W, C, K, R, strides, pads): each exercises another part of the bands
GEOMETRY = {
    "mobilenet_stride_2_batch_2": (2, 17, 15, 16, 40, 3, (2, 2), None),
    "several_bands_5x5": (1, 30, 30, 24, 72, 5, (1, 1), None),
    "many_bands_widest_input": (1, 120, 8, 128, 256, 3, (1, 1), None),  # C at the 1x1 kernel's limit
    "one_row_a_band_stride_1": (1, 9, 600, 3, 64, 3, (1, 1), None),  # rows past the window: bands of one row
    "one_row_a_band_stride_2": (1, 9, 600, 3, 64, 3, (2, 2), None),
    "bottom_right_padding_only": (1, 16, 16, 16, 48, 3, (2, 2), (0, 0, 1, 1)),
    "top_left_padding_only": (2, 15, 15, 16, 32, 3, (2, 2), (1, 1, 0, 0)),
    "unpadded": (1, 12, 10, 8, 24, 3, (1, 1), (0, 0, 0, 0)),
    "7x7_filter": (1, 14, 14, 32, 64, 7, (1, 1), None),
    "tiny_map": (1, 1, 2, 5, 17, 3, (1, 1), None),
    "bands_of_four_pixels": (1, 4, 4, 16, 32, 3, (1, 1), None),  # a row a piece: 1x1 rows of 4 pixels
    "bands_of_three_pixels": (1, 5, 3, 8, 16, 3, (1, 1), None),
    "more_channels_than_the_1x1_kernel_takes": (1, 10, 10, 160, 96, 3, (1, 1), None),  # separate, forced or not
    "many_output_panels": (1, 6, 5, 24, 1100, 3, (2, 2), None),  # AVX2's 2-vector panels: 69 of them
    # 16 and 32 input channels: the 1x1 kernel's tiles with C fixed when compiled
    "sixteen_channels_one_vector": (1, 9, 11, 16, 16, 3, (1, 1), None),
    "sixteen_channels_five_vectors": (1, 9, 13, 16, 80, 3, (1, 1), None),
    "sixteen_channels_panels_of_four": (2, 7, 9, 16, 100, 3, (2, 2), None),
    "thirty_two_channels_two_vectors": (1, 9, 11, 32, 24, 3, (1, 1), None),
    "thirty_two_channels_three_vectors": (1, 8, 10, 32, 48, 3, (1, 1), None),
    "thirty_two_channels_five_vectors": (1, 8, 10, 32, 80, 5, (1, 1), None),
    "thirty_two_channels_panels_of_four": (1, 7, 9, 32, 100, 3, (2, 2), None),
}


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(monkeypatch, name, threads, way):
    n, h, w, c, k, r, strides, pads = GEOMETRY[name]
    _check(monkeypatch, way, n, h, w, c, k, r, threads=threads, strides=strides, pads=pads, activation="hardswish",
           pointwise="silu")


def test_batches_of_another_size_reuse_the_prepared_filters(monkeypatch):
    monkeypatch.delenv("EPIFUSE_POINTWISE_DEPTHWISE", raising=False)
    model = _pair_model(13, 13, 24, 72, 3, strides=(2, 2))
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    _, w1, b1, w2, b2 = _inputs(1, 13, 13, 24, 72, 3)
    for n in (1, 3, 2, 1):
        x = np.random.default_rng(n).standard_normal((n, 13, 13, 24)).astype(np.float32)
        ref = _reference(x, w1, b1, w2, b2, strides=(2, 2), pads=(1, 1, 1, 1), activation="relu", pointwise="relu")
        assert rel_l2(session.run(None, {"x": x})[0], ref) <= TOL


@pytest.mark.parametrize("change, message", [
    (dict(residual="post"), "no residual"),
    (dict(group=1), "the depthwise conv (DW, DB"),
    (dict(pointwise_activation="swish"), "swish"),
    (dict(strides=[0, 1]), "stride"),
])
def test_bad_nodes_fail_at_session_creation_naming_the_node(change, message):
    model = _pair_model(8, 8, 16, 32, 3, **{k: v for k, v in change.items() if k not in ("group", "strides",
                                                                                           "pointwise_activation")})
    for attr in model.graph.node[0].attribute:
        if attr.name in change and attr.name in ("group", "strides", "pointwise_activation"):
            value = change[attr.name]
            attr.CopyFrom(helper.make_attribute(attr.name, value))
    with pytest.raises(Exception) as e:
        ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    assert "FusedPointwiseDepthwise node 'pair'" in str(e.value) and message in str(e.value), str(e.value)


def test_a_1x1_filter_that_is_not_1x1_fails():
    model = _pair_model(8, 8, 16, 32, 3)
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, [32, 3, 3, 16], np.zeros(32 * 9 * 16, np.float32)))
    with pytest.raises(Exception) as e:
        ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    assert "FusedPointwiseDepthwise node 'pair'" in str(e.value) and "1x1" in str(e.value), str(e.value)


def test_input_of_the_wrong_channels_fails_at_run_time():
    model = _pair_model(8, 8, 16, 32, 3)
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "c"  # unknown until run time
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception) as e:
        session.run(None, {"x": np.zeros((1, 8, 8, 12), np.float32)})
    assert "FusedPointwiseDepthwise node 'pair'" in str(e.value), str(e.value)


# --- the pass ---

def _block(c=16, k=48, *, consumers=1, mid_output=False, residual=False, stride=2) -> onnx.ModelProto:
    """NCHW Conv 1x1 + Relu (+ a residual Add) -> depthwise Conv 3x3 + Relu -> Conv 1x1: an inverted-residual
    block as torchvision exports it, one image 32x32."""
    rng = np.random.default_rng(0)
    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"], kernel_shape=[1, 1])]
    expanded = "e"
    if residual:  # the 1x1 conv with a residual: not a pair's first conv
        nodes.append(helper.make_node("Add", ["e", "r"], ["er"]))
        expanded = "er"
    nodes += [helper.make_node("Relu", [expanded], ["m"]),
              helper.make_node("Conv", ["m", "w2", "b2"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=k,
                               strides=[stride] * 2),
              helper.make_node("Relu", ["d"], ["dr"]),
              helper.make_node("Conv", ["dr", "w3", "b3"], ["y"], kernel_shape=[1, 1])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if consumers > 1:
        nodes.append(helper.make_node("Conv", ["m", "w4", "b4"], ["y2"], kernel_shape=[1, 1]))
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    if mid_output:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 32, 32])]
    inits = [init("w1", k, c, 1, 1), init("b1", k), init("w2", k, 1, 3, 3), init("b2", k), init("w3", 8, k, 1, 1),
             init("b3", 8), init("w4", 8, k, 1, 1), init("b4", 8)]
    if residual:
        inits.append(init("r", 1, k, 32, 32))
    graph = helper.make_graph(nodes, "block", inputs, outputs, inits)
    return validate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _always(model, target="ort-cpu", precision="fp32"):
    return optimize_model(model, target=target, precision=precision, policy=FusionPolicy(mode="always"))


def _ops(model):
    return [n.op_type for n in model.graph.node]


def test_an_expand_and_its_depthwise_conv_become_one_node():
    model = _block()
    optimized, report = _always(model)
    assert _ops(optimized).count(OP_TYPE) == 1 and _ops(optimized).count(contract.OP_TYPE) == 1
    node = next(n for n in optimized.graph.node if n.op_type == OP_TYPE)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["pointwise_activation"] == b"relu" and attrs["activation"] == b"relu"
    assert attrs["group"] == 48 and list(attrs["strides"]) == [2, 2] and "residual" not in attrs
    assert any(OP_TYPE in key for key in report.canonicalized)
    result = verify(model, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


@pytest.mark.parametrize("why, model, target, precision", [
    ("the 1x1 conv reads more channels than the bands' kernel", _block(c=160), "ort-cpu", "fp32"),
    ("the 1x1 conv writes more channels than MAX_EXPANDED_CHANNELS", _block(k=512), "ort-cpu", "fp32"),
    ("another node reads the expanded tensor", _block(consumers=2), "ort-cpu", "fp32"),
    ("the expanded tensor is a graph output", _block(mid_output=True), "ort-cpu", "fp32"),
    ("the 1x1 conv adds a residual", _block(residual=True), "ort-cpu", "fp32"),
    ("bf16: the bands have no bf16 kernel", _block(), "ort-cpu", "bf16"),
], ids=["c160", "k512", "two_consumers", "graph_output", "residual", "bf16"])
def test_pairs_are_left_as_two_convs(why, model, target, precision):
    optimized, _ = _always(model, target, precision)
    assert OP_TYPE not in _ops(optimized), why
    ops = _ops(optimized)  # a depthwise conv and the 1x1 conv after it may still be the other pair: two convs
    convs = ops.count(contract.OP_TYPE) + 2 * ops.count(DEPTHWISE_FIRST_OP_TYPE)
    assert convs == 3 + (1 if "two_consumers" in why or "another" in why else 0)


def test_a_cuda_target_gets_no_pairs():
    optimized, _ = _always(_block(), target="ort-cuda")
    assert OP_TYPE not in _ops(optimized)


def test_an_optimized_model_optimized_again_has_its_pairs_split_and_made_again():
    model = _block()
    once, _ = _always(model)
    twice, report = _always(once)
    assert _ops(twice).count(OP_TYPE) == 1
    assert any(key.startswith(f"epifuse::{OP_TYPE} →") for key in report.canonicalized)
    result = verify(model, twice, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


@pytest.mark.parametrize("name", ["mobilenetv3_tiny", "ppocr_tiny"])
def test_zoo_models_verify_with_their_pairs_in_bands_and_separate(monkeypatch, name):
    original = validate(zoo.build(name))
    optimized, _ = _always(original)
    assert OP_TYPE in _ops(optimized)
    for way in ("bands", "separate"):  # bands: the library's own way
        monkeypatch.setenv("EPIFUSE_POINTWISE_DEPTHWISE", way)
        result = verify(original, optimized, precision="fp32")
        assert result["passed"] and result["worst_rel_l2"] <= TOL, (way, result)


class FakeCheck:
    """The whole-model check's timer: `speedups` by thread count, the model with pairs against the one without."""

    def __init__(self, speedups):
        self.speedups, self.calls = speedups, []

    def __call__(self, reference, model, *, backend, batch, precision, rounds, threads=None):
        ops = lambda m: [n.op_type for n in m.graph.node]  # noqa: E731
        assert OP_TYPE in ops(model) and OP_TYPE not in ops(reference)
        self.calls.append(threads)
        s = self.speedups[threads]
        return {"batch": batch, "threads": threads, "speedup": s, "speedup_q1": s - 0.01, "speedup_q3": s + 0.01,
                "slower": s + 0.01 < 1.0}


@pytest.mark.parametrize("speedups, kept", [({None: 1.05, 1: 1.01}, True), ({None: 1.05, 1: 0.97}, False),
                                            ({None: 0.98, 1: 1.02}, False)])
def test_the_check_keeps_pairs_only_where_not_slower(monkeypatch, speedups, kept):
    monkeypatch.setattr("optimizer.pipeline.cpu_cores", lambda: 2)  # the default threads and one checked
    model = _block()
    optimized, _ = _always(model)
    report = Report()
    check = FakeCheck(speedups)
    result = _pairs_check(check, model, optimized, "ort-cpu", "fp32", FusionPolicy(mode="always"), report)
    assert (OP_TYPE in _ops(result)) == kept
    assert (result is optimized) == kept
    assert check.calls == ([None, 1] if speedups[None] >= 1.0 else [None])
    if not kept:
        assert _ops(result).count(contract.OP_TYPE) == 3
        assert any("kept as two FusedConvs each" in n for n in report.notes), report.notes
        assert verify(model, result, precision="fp32")["passed"]


@pytest.mark.parametrize("name", ["mobilenet_stride_2_batch_2", "one_row_a_band_stride_1", "many_output_panels",
                                  "top_left_padding_only"])
def test_geometry_on_avx2(monkeypatch, name):
    """The bands' kernels in AVX2 (EPIFUSE_CPU_ISA caps the ISA at session creation): 8-lane vectors, 6x2 tiles."""
    monkeypatch.setenv("EPIFUSE_CPU_ISA", "avx2")
    n, h, w, c, k, r, strides, pads = GEOMETRY[name]
    _check(monkeypatch, "bands", n, h, w, c, k, r, threads=2, strides=strides, pads=pads, activation="relu",
           pointwise="hardswish")


# --- the pair whose depthwise conv feeds a squeeze-excite pool: FusedPointwiseDepthwiseMean ---

def _mean_model(h, w, c, k, r, *, strides=(1, 1), pads=None) -> onnx.ModelProto:
    model = _pair_model(h, w, c, k, r, strides=strides, pads=pads, activation="hardswish", pointwise="relu")
    node = model.graph.node[0]
    node.op_type = MEAN_OP_TYPE
    node.output.append("m")
    model.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["mobilenet_stride_2_batch_2", "several_bands_5x5", "one_row_a_band_stride_1",
                                  "top_left_padding_only", "7x7_filter", "bands_of_four_pixels",
                                  "more_channels_than_the_1x1_kernel_takes"])
def test_the_mean_of_the_depthwise_output(monkeypatch, name, threads, way):
    """M, summed band by band in the depthwise kernel's registers, against the reference's mean; in bands, the
    same bits on one thread as on two (the bands' sums are added in a fixed order; the separate way's 1x1 conv
    is oneDNN's, whose sums over C may split by thread count)."""
    set_way(monkeypatch, way)
    n, h, w, c, k, r, strides, pads = GEOMETRY[name]
    pads = tuple(pads if pads is not None else [r // 2] * 4)
    model = _mean_model(h, w, c, k, r, strides=strides, pads=pads)
    x, w1, b1, w2, b2 = _inputs(n, h, w, c, k, r)
    ref = _reference(x, w1, b1, w2, b2, strides=strides, pads=pads, activation="hardswish", pointwise="relu")
    results = []
    for t in (threads, 3 - threads):
        session = ort.InferenceSession(model.SerializeToString(), session_options(threads=t),
                                       providers=["CPUExecutionProvider"])
        for _ in range(2):
            y, m = session.run(None, {"x": x})
        results.append(m)
        assert m.shape == (n, 1, 1, k)
        assert rel_l2(y, ref) <= TOL
        assert rel_l2(m, ref.mean(axis=(1, 2), keepdims=True)) <= TOL, rel_l2(m, ref.mean(axis=(1, 2), keepdims=True))
    if way == "bands" and c <= 128:
        assert np.array_equal(results[0], results[1])


def _se_block(c=16, k=48) -> onnx.ModelProto:
    """NCHW Conv 1x1 + Relu -> depthwise Conv 3x3 + Relu -> squeeze-excite (GlobalAveragePool, 1x1 Convs,
    HardSigmoid, Mul) -> Conv 1x1: MobileNetV3's blocks 4-6 as torchvision exports them, one image 32x32."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["e"], ["er"]),
             helper.make_node("Conv", ["er", "w2", "b2"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=k),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("GlobalAveragePool", ["dr"], ["p"]),
             helper.make_node("Conv", ["p", "w3", "b3"], ["s1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["s1"], ["s1r"]),
             helper.make_node("Conv", ["s1r", "w4", "b4"], ["s2"], kernel_shape=[1, 1]),
             helper.make_node("HardSigmoid", ["s2"], ["g"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["dr", "g"], ["gated"]),
             helper.make_node("Conv", ["gated", "w5", "b5"], ["y"], kernel_shape=[1, 1])]
    inits = [init("w1", k, c, 1, 1), init("b1", k), init("w2", k, 1, 3, 3), init("b2", k), init("w3", 8, k, 1, 1),
             init("b3", 8), init("w4", k, 8, 1, 1), init("b4", k), init("w5", c, k, 1, 1), init("b5", c)]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return validate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_an_expand_and_its_depthwise_conv_with_its_pool_become_one_node_and_split_again():
    model = _se_block()
    optimized, report = _always(model)
    ops = _ops(optimized)
    assert ops.count(MEAN_OP_TYPE) == 1 and "FusedConvMean" not in ops and OP_TYPE not in ops
    node = next(n for n in optimized.graph.node if n.op_type == MEAN_OP_TYPE)
    assert len(node.output) == 2 and len(node.input) == 5
    result = verify(model, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result
    twice, report = _always(optimized)  # split into FusedConv + FusedConvMean, then made again
    assert _ops(twice).count(MEAN_OP_TYPE) == 1
    assert any(key.startswith(f"epifuse::{MEAN_OP_TYPE} →") for key in report.canonicalized)
    assert verify(model, twice, precision="fp32")["passed"]


def test_the_mean_pair_without_its_second_output_fails_at_session_creation():
    model = _mean_model(8, 8, 16, 32, 3)
    del model.graph.node[0].output[1]
    del model.graph.output[1]
    with pytest.raises(Exception) as e:
        ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    assert f"{MEAN_OP_TYPE} node 'pair': output 1 (M) is missing" in str(e.value), str(e.value)
