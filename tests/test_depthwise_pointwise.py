"""epifuse::FusedDepthwisePointwise, a depthwise conv and the 1x1 conv that reads its output (with that conv's
residual) as one node on ort-cpu: the op through ONNX Runtime against a float64 numpy reference of the two
convs, run in bands (each band's depthwise rows in the thread's window, then the 1x1 conv of them) and
separately, over every activation of either conv, both residual kinds, maps whose bands, pieces and padding
fall differently, batches and thread counts; its errors; and the pass that makes it and the one that splits it."""
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
from optimizer.passes.pointwise_depthwise import DEPTHWISE_FIRST_OP_TYPE as OP_TYPE
from optimizer.passes.pointwise_depthwise import OP_TYPE as EXPAND_FIRST_OP_TYPE
from optimizer.pipeline import FusionPolicy
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import cpu_flags
from tests.test_cpu_onednn import PARAMS
from tests.test_pointwise_depthwise import _always, _block, _ops, set_way

TOL = 1e-5  # fp32
pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the bands' kernels need AVX2 and FMA")


def _output_size(h, r, stride, pad_a, pad_b):
    return (h + pad_a + pad_b - r) // stride + 1


def _tensors(n, h, w, c, k, r, strides, pads):
    """X and Z (their own random streams) and the filters and biases (the same for every batch size)."""
    rng = np.random.default_rng(0)
    dw = (rng.standard_normal((c, r, r, 1)) / r).astype(np.float32)
    db = (rng.standard_normal(c) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((k, 1, 1, c)) / np.sqrt(c)).astype(np.float32)
    b1 = (rng.standard_normal(k) * 0.3).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((n, h, w, c)).astype(np.float32)
    p = _output_size(h, r, strides[0], pads[0], pads[2])
    q = _output_size(w, r, strides[1], pads[1], pads[3])
    z = np.random.default_rng(2).standard_normal((n, p, q, k)).astype(np.float32)
    return x, dw, db, w1, b1, z


def _pair_model(h, w, c, k, r, *, strides=(1, 1), pads=None, activation="relu", pointwise="identity",
                residual="none", activation_params=None, pointwise_params=None, **extra) -> onnx.ModelProto:
    pads = list(pads if pads is not None else [r // 2] * 4)
    _, dw, db, w1, b1, _ = _tensors(1, h, w, c, k, r, strides, pads)
    attrs = dict(strides=list(strides), pads=pads, group=c, activation=activation, pointwise_activation=pointwise,
                 **extra)
    if residual != "none":
        attrs["pointwise_residual"] = residual
    if pointwise_params is not None:
        attrs["pointwise_activation_params"] = list(pointwise_params)
    if activation_params is not None:
        attrs["activation_params"] = list(activation_params)
    inputs = ["x", "dw", "db", "w", "b"] + (["z"] if residual != "none" else [])
    node = helper.make_node(OP_TYPE, inputs, ["y"], name="pair", domain="epifuse", **attrs)
    inits = [helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.tobytes(), raw=True)
             for name, a in (("dw", dw), ("db", db), ("w", w1), ("b", b1))]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", h, w, c])]
    if residual != "none":
        graph_inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", None, None, k]))
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _check(monkeypatch, way, n, h, w, c, k, r, *, threads=None, strides=(1, 1), pads=None, activation="relu",
           pointwise="identity", residual="none"):
    """The op run `way` ("bands", the library's own way where the bands' kernels run the problem, or
    "separate") against the reference."""
    set_way(monkeypatch, way)
    pads = tuple(pads if pads is not None else [r // 2] * 4)
    pw_params, dw_params = PARAMS.get(pointwise, ()), PARAMS.get(activation, ())
    model = _pair_model(h, w, c, k, r, strides=strides, pads=pads, activation=activation, pointwise=pointwise,
                        residual=residual, pointwise_params=pw_params or None, activation_params=dw_params or None)
    session = ort.InferenceSession(model.SerializeToString(), session_options(threads=threads),
                                   providers=["CPUExecutionProvider"])
    x, dw, db, w1, b1, z = _tensors(n, h, w, c, k, r, strides, pads)
    feeds = {"x": x, **({"z": z} if residual != "none" else {})}
    for _ in range(2):  # the second run: filters prepared
        y = session.run(None, feeds)[0]
    mid = fused_conv(x, dw, db, strides=strides, pads=pads, group=c, activation=activation,
                     activation_params=dw_params)
    ref = fused_conv(mid, w1, b1, z if residual != "none" else None, activation=pointwise,
                     activation_params=pw_params, residual=residual)
    assert y.shape == ref.shape
    assert rel_l2(y, ref) <= TOL, (way, rel_l2(y, ref))


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_of_the_1x1_conv(monkeypatch, way, activation):
    """The 1x1 conv's epilogue on its tile in registers; 20 input and 44 output channels end in partial vectors."""
    _check(monkeypatch, way, 1, 9, 11, 20, 44, 3, pointwise=activation, activation="relu")


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_of_the_depthwise_conv(monkeypatch, activation):
    _check(monkeypatch, "bands", 1, 9, 11, 20, 44, 3, activation=activation)


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("residual", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "hardswish", "identity"])
def test_the_1x1_conv_adds_its_residual(monkeypatch, way, residual, activation):
    """MobileNetV3's first block: the 1x1 conv's output plus the block's input, before or after its activation."""
    _check(monkeypatch, way, 2, 13, 12, 16, 16, 3, pointwise=activation, residual=residual, threads=2)


# (N, H, W, C, K, R, strides, pads): each exercises another part of the bands
GEOMETRY = {
    "mobilenet_stride_2_batch_2": (2, 17, 15, 16, 40, 3, (2, 2), None),
    "several_bands_5x5": (1, 30, 30, 24, 72, 5, (1, 1), None),
    "widest_input": (1, 40, 8, 128, 256, 3, (1, 1), None),  # C at the 1x1 kernel's limit
    "one_row_a_band": (1, 9, 600, 64, 16, 3, (1, 1), None),  # rows past the window: bands of one row
    "one_row_a_band_stride_2": (1, 9, 1200, 64, 16, 3, (2, 2), None),
    "bottom_right_padding_only": (1, 16, 16, 16, 48, 3, (2, 2), (0, 0, 1, 1)),
    "top_left_padding_only": (2, 15, 15, 16, 32, 3, (2, 2), (1, 1, 0, 0)),
    "unpadded": (1, 12, 10, 8, 24, 3, (1, 1), (0, 0, 0, 0)),
    "7x7_filter": (1, 14, 14, 32, 64, 7, (1, 1), None),
    "tiny_map": (1, 1, 2, 5, 17, 3, (1, 1), None),
    "bands_of_four_pixels": (1, 4, 4, 16, 32, 3, (1, 1), None),
    "more_channels_than_the_1x1_kernel_takes": (1, 10, 10, 160, 96, 3, (1, 1), None),  # separate, forced or not
    "many_output_panels": (1, 6, 5, 24, 1100, 3, (2, 2), None),  # AVX2's 2-vector panels: 69 of them
    "mobilenet_v2_first_block": (1, 15, 17, 32, 16, 3, (1, 1), None),  # the 1x1's C fixed when compiled: 32
}


@pytest.mark.parametrize("way", ["bands", "separate"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_geometry(monkeypatch, name, threads, way):
    n, h, w, c, k, r, strides, pads = GEOMETRY[name]
    _check(monkeypatch, way, n, h, w, c, k, r, threads=threads, strides=strides, pads=pads, activation="hardswish",
           pointwise="silu", residual="post" if strides == (1, 1) and k == c else "none")


@pytest.mark.parametrize("name", ["mobilenet_stride_2_batch_2", "one_row_a_band", "many_output_panels",
                                  "top_left_padding_only"])
def test_geometry_on_avx2(monkeypatch, name):
    """The bands' kernels in AVX2 (EPIFUSE_CPU_ISA caps the ISA at session creation): 8-lane vectors, 6x2 tiles."""
    monkeypatch.setenv("EPIFUSE_CPU_ISA", "avx2")
    n, h, w, c, k, r, strides, pads = GEOMETRY[name]
    _check(monkeypatch, "bands", n, h, w, c, k, r, threads=2, strides=strides, pads=pads, activation="relu",
           pointwise="hardswish")


def test_batches_of_another_size_reuse_the_prepared_filters(monkeypatch):
    monkeypatch.delenv("EPIFUSE_POINTWISE_DEPTHWISE", raising=False)
    model = _pair_model(13, 13, 24, 24, 3, residual="pre")
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    for n in (1, 3, 2, 1):
        x, dw, db, w1, b1, z = _tensors(n, 13, 13, 24, 24, 3, (1, 1), (1, 1, 1, 1))
        x = x + n  # another X each size
        mid = fused_conv(x, dw, db, pads=(1, 1, 1, 1), group=24, activation="relu")
        ref = fused_conv(mid, w1, b1, z, residual="pre")
        assert rel_l2(session.run(None, {"x": x, "z": z})[0], ref) <= TOL


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("change, message", [
    (dict(residual="post"), "no residual"),
    (dict(pointwise_residual="post"), "needs input Z"),
    (dict(pointwise_activation="swish"), "swish"),
    (dict(group=1), "the depthwise conv (X, DW, DB"),
])
def test_bad_nodes_fail_at_session_creation_naming_the_node(change, message):
    model = _pair_model(8, 8, 16, 32, 3)
    node = model.graph.node[0]
    for name, value in change.items():
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(name, value)])
    with pytest.raises(Exception) as e:
        _session(model)
    assert f"{OP_TYPE} node 'pair'" in str(e.value) and message in str(e.value), str(e.value)


def test_a_residual_of_the_wrong_shape_fails_at_run_time_naming_the_1x1_conv():
    model = _pair_model(8, 8, 16, 16, 3, residual="post")
    with pytest.raises(Exception) as e:
        _session(model).run(None, {"x": np.zeros((1, 8, 8, 16), np.float32), "z": np.zeros((1, 4, 8, 16), np.float32)})
    assert f"{OP_TYPE} node 'pair'" in str(e.value) and "the 1x1 conv (W, B, Z" in str(e.value), str(e.value)


def test_a_1x1_filter_that_is_not_1x1_fails():
    model = _pair_model(8, 8, 16, 32, 3)
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, [32, 3, 3, 16], np.zeros(32 * 9 * 16, np.float32)))
    with pytest.raises(Exception) as e:
        _session(model)
    assert f"{OP_TYPE} node 'pair'" in str(e.value) and "1x1" in str(e.value), str(e.value)


# --- the pass ---

def _separable(c=16, k=24, *, residual=False, consumers=1, mid_output=False, stride=1) -> onnx.ModelProto:
    """NCHW depthwise Conv 3x3 + BN-free Relu -> Conv 1x1 (+ the input, where `residual`): MobileNetV3's first
    block as torchvision exports it, one image 32x32."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=c,
                              strides=[stride] * 2),
             helper.make_node("Relu", ["d"], ["m"]),
             helper.make_node("Conv", ["m", "w2", "b2"], ["p"], kernel_shape=[1, 1])]
    nodes.append(helper.make_node("Add", ["p", "x"], ["y"]) if residual else helper.make_node("Identity", ["p"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if consumers > 1:
        nodes.append(helper.make_node("Conv", ["m", "w3", "b3"], ["y2"], kernel_shape=[1, 1]))
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    if mid_output:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 32, 32])]
    inits = [init("w1", c, 1, 3, 3), init("b1", c), init("w2", k, c, 1, 1), init("b2", k), init("w3", 8, c, 1, 1),
             init("b3", 8)]
    graph = helper.make_graph(nodes, "separable", inputs, outputs, inits)
    return validate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("residual", [False, True])
def test_a_depthwise_conv_and_the_1x1_conv_that_reads_it_become_one_node(residual):
    model = _separable(c=16, k=16 if residual else 24, residual=residual)
    optimized, report = _always(model)
    assert _ops(optimized).count(OP_TYPE) == 1 and contract.OP_TYPE not in _ops(optimized)
    node = next(n for n in optimized.graph.node if n.op_type == OP_TYPE)
    attrs = _attrs(node)
    assert attrs["activation"] == b"relu" and attrs["pointwise_activation"] == b"identity" and attrs["group"] == 16
    assert "residual" not in attrs
    assert (attrs.get("pointwise_residual") == b"pre") == residual  # the Add, before an identity activation
    assert len(node.input) == (6 if residual else 5)
    assert any(OP_TYPE in key for key in report.canonicalized)
    result = verify(model, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


@pytest.mark.parametrize("why, model, target, precision", [
    ("the 1x1 conv reads more channels than the bands' kernel", _separable(c=160), "ort-cpu", "fp32"),
    ("another node reads the depthwise output", _separable(consumers=2), "ort-cpu", "fp32"),
    ("the depthwise output is a graph output", _separable(mid_output=True), "ort-cpu", "fp32"),
    ("bf16: the bands have no bf16 kernel", _separable(), "ort-cpu", "bf16"),
    ("a CUDA target", _separable(), "ort-cuda", "fp32"),
], ids=["c160", "two_consumers", "graph_output", "bf16", "cuda"])
def test_pairs_are_left_as_two_convs(why, model, target, precision):
    optimized, _ = _always(model, target, precision)
    assert OP_TYPE not in _ops(optimized), why


def test_an_inverted_residual_block_pairs_its_expand_first():
    """1x1 -> depthwise -> 1x1: the expand and the depthwise conv become one pair, the project conv stays alone."""
    optimized, _ = _always(_block(stride=1))
    assert _ops(optimized).count(EXPAND_FIRST_OP_TYPE) == 1 and OP_TYPE not in _ops(optimized)


def test_an_optimized_model_optimized_again_has_its_pairs_split_and_made_again():
    model = _separable(c=16, k=16, residual=True)
    once, _ = _always(model)
    twice, report = _always(once)
    assert _ops(twice).count(OP_TYPE) == 1
    assert any(key.startswith(f"epifuse::{OP_TYPE} →") for key in report.canonicalized)
    assert _attrs(next(n for n in twice.graph.node if n.op_type == OP_TYPE))["pointwise_residual"] == b"pre"
    result = verify(model, twice, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


@pytest.mark.parametrize("name", ["mobilenetv3_tiny", "ppocr_tiny"])
def test_zoo_models_verify_with_their_pairs_in_bands_and_separate(monkeypatch, name):
    original = validate(zoo.build(name))
    optimized, _ = _always(original)
    if OP_TYPE not in _ops(optimized):
        pytest.skip(f"{name} has no depthwise conv read by a 1x1 conv alone")
    for way in ("bands", "separate"):  # bands: the library's own way
        monkeypatch.setenv("EPIFUSE_POINTWISE_DEPTHWISE", way)
        result = verify(original, optimized, precision="fp32")
        assert result["passed"] and result["worst_rel_l2"] <= TOL, (way, result)


def _both_kinds() -> onnx.ModelProto:
    """A separable block (depthwise, then 1x1) and an inverted-residual one (1x1, depthwise, 1x1): one pair of
    each kind."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4, group=16),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w2", "b2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["b", "w3", "b3"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c"], ["cr"]),
             helper.make_node("Conv", ["cr", "w4", "b4"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=48),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("Conv", ["dr", "w5", "b5"], ["y"], kernel_shape=[1, 1])]
    inits = [init("w1", 16, 1, 3, 3), init("b1", 16), init("w2", 16, 16, 1, 1), init("b2", 16),
             init("w3", 48, 16, 1, 1), init("b3", 48), init("w4", 48, 1, 3, 3), init("b4", 48),
             init("w5", 8, 48, 1, 1), init("b5", 8)]
    graph = helper.make_graph(nodes, "both", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return validate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


class FakeCheck:
    """The whole-model check's timer: a speed-up by the pair kinds the model has, and by thread count."""

    def __init__(self, speedups):
        self.speedups, self.calls = speedups, []

    def __call__(self, reference, model, *, backend, batch, precision, rounds, threads=None):
        assert not {n.op_type for n in reference.graph.node} & {OP_TYPE, EXPAND_FIRST_OP_TYPE}
        kinds = tuple(sorted({n.op_type for n in model.graph.node} & {OP_TYPE, EXPAND_FIRST_OP_TYPE}))
        self.calls.append((kinds, threads))
        s = self.speedups[kinds][threads]
        return {"batch": batch, "threads": threads, "speedup": s, "speedup_q1": s - 0.01, "speedup_q3": s + 0.01,
                "slower": s + 0.01 < 1.0}


BOTH = (OP_TYPE, EXPAND_FIRST_OP_TYPE)


@pytest.mark.parametrize("both, expand_first, kept", [
    ({None: 1.05, 1: 1.01}, None, BOTH),  # both kinds not slower: kept, the fallback never timed
    ({None: 1.05, 1: 0.98}, {None: 1.04, 1: 1.00}, (EXPAND_FIRST_OP_TYPE,)),  # the expand-first pairs alone
    ({None: 0.97, 1: 1.01}, {None: 0.99, 1: 1.01}, ()),  # neither: no pairs
])
def test_the_check_falls_back_to_the_expand_first_pairs(monkeypatch, both, expand_first, kept):
    from optimizer.pipeline import _pairs_check
    from optimizer.report import Report
    monkeypatch.setattr("optimizer.pipeline.cpu_cores", lambda: 2)  # the default threads and one checked
    model = _both_kinds()
    optimized, _ = _always(model)
    assert {OP_TYPE, EXPAND_FIRST_OP_TYPE} <= set(_ops(optimized))
    check = FakeCheck({BOTH: both, (EXPAND_FIRST_OP_TYPE,): expand_first})
    report = Report()
    result = _pairs_check(check, model, optimized, "ort-cpu", "fp32", FusionPolicy(mode="always"), report)
    assert tuple(sorted(set(_ops(result)) & set(BOTH))) == kept
    assert check.calls[0] == (BOTH, None) and ((BOTH, 1) in check.calls) == (both[None] >= 1.0)
    assert any(kinds == (EXPAND_FIRST_OP_TYPE,) for kinds, _ in check.calls) == (expand_first is not None)
    assert sum(map(_ops(result).count, [contract.OP_TYPE])) + 2 * sum(map(_ops(result).count, BOTH)) == 5
    assert verify(model, result, precision="fp32")["passed"]
    if kept != BOTH:  # the report describes the model kept
        assert report.ops_after.get(OP_TYPE, 0) == 0
        assert report.ops_after.get(EXPAND_FIRST_OP_TYPE, 0) == _ops(result).count(EXPAND_FIRST_OP_TYPE)


def test_the_fusions_are_judged_without_the_pairs(monkeypatch):
    """Fusions that win on two threads (1.5x) and not lose on one (1.01x), and pairs that lose on one thread
    (0.985x): the whole-model check keeps every fusion and drops the pairs, where judging both at once (0.995x
    on one thread) would have dropped the fusions too."""
    from optimizer.pipeline import _whole_model_check
    monkeypatch.setattr("optimizer.pipeline.cpu_cores", lambda: 2)  # the default threads and one checked
    model = _both_kinds()
    optimized, report = _always(model)
    fused = {contract.OP_TYPE, *BOTH}

    def speed(m, threads):
        ops = set(_ops(m))
        if not ops & fused:
            return 1.0
        fusions = 1.5 if threads is None else 1.01
        return fusions * (1.04 if threads is None else 0.985) if ops & set(BOTH) else fusions

    def check(reference, m, *, backend, batch, precision, rounds, threads=None):
        s = speed(m, threads) / speed(reference, threads)
        return {"batch": batch, "threads": threads, "speedup": s, "speedup_q1": s - 0.005, "speedup_q3": s + 0.005,
                "slower": s + 0.005 < 1.0}
    result = _whole_model_check(check, model, optimized, "ort-cpu", "fp32", FusionPolicy(mode="always"), report)
    ops = _ops(result)
    assert not set(ops) & set(BOTH) and ops.count(contract.OP_TYPE) == 5
    assert report.fused_count() == 5 and not set(report.ops_after) & set(BOTH)
    assert any("kept as two FusedConvs each" in n for n in report.notes), report.notes
    assert verify(model, result, precision="fp32")["passed"]
