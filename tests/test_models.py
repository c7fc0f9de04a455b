"""The model zoo: every model is valid, runs on ONNX Runtime CPU, is deterministic and small,
carries non-trivial BatchNorm statistics, and contains the exporter patterns it promises."""
from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from models import DEFAULT_MODEL, ZOO, build, default_model

# Opsets that differ from the usual 17, and why: see each builder's docstring.
EXPECTED_OPSET = {name: 17 for name in ZOO} | {"ppocr_tiny": 11, "act_zoo": 20}
# ConvNeXt normalises with LayerNorm only; every other family has BatchNorm after its convs.
WITHOUT_BATCHNORM = {"convnext_tiny"}


@cache
def _model(name: str) -> onnx.ModelProto:
    return build(name)


@cache
def _session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(_model(name).SerializeToString(),
                                providers=["CPUExecutionProvider"])


class Graph:
    """Producer/consumer/constant look-ups over one model's graph."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes = list(model.graph.node)
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for name in n.input:
                self.consumers.setdefault(name, []).append(n)
        self.values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.values.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                            for n in self.nodes if n.op_type == "Constant"})
        self.outputs = [o.name for o in model.graph.output]

    def of_type(self, op_type: str) -> list[onnx.NodeProto]:
        return [n for n in self.nodes if n.op_type == op_type]

    def op_counts(self) -> Counter:
        return Counter(n.op_type for n in self.nodes)

    def produced_by(self, tensor: str) -> str | None:
        node = self.producer.get(tensor)
        return node.op_type if node is not None else None

    def only_consumer(self, node: onnx.NodeProto) -> onnx.NodeProto:
        (consumer,) = self.consumers[node.output[0]]
        return consumer

    def follow(self, node: onnx.NodeProto, op_types: list[str]) -> list[onnx.NodeProto]:
        """The path from `node` through consumers of types `op_types` (at each step exactly one
        consumer has the type; others, like the x that a decomposed activation reuses, may
        exist), or fail."""
        chain = []
        for op_type in op_types:
            matches = [c for c in self.consumers.get(node.output[0], []) if c.op_type == op_type]
            assert len(matches) == 1, f"expected one {op_type} after {node.name}, got {matches}"
            node = matches[0]
            chain.append(node)
        return chain

    def scalar(self, tensor: str) -> float | None:
        value = self.values.get(tensor)
        return float(value) if value is not None and value.size == 1 else None

    def conv_weight(self, conv: onnx.NodeProto) -> np.ndarray:
        return self.values[conv.input[1]]


def attr(node: onnx.NodeProto, name: str):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                None)


def is_depthwise(g: Graph, conv: onnx.NodeProto) -> bool:
    w = g.conv_weight(conv)
    return w.shape[1] == 1 and attr(conv, "group") == w.shape[0] > 1


# ----------------------------------------------------------------------------- every model
@pytest.mark.parametrize("name", ZOO)
def test_model_passes_full_check_with_expected_opset(name):
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", EXPECTED_OPSET[name])]
    assert model.ir_version in (8, 9)
    (graph_input,) = model.graph.input
    assert graph_input.name in ("images", "input")
    dims = graph_input.type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 3


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("batch", [1, 2])
def test_model_runs_on_onnxruntime_cpu(name, batch):
    session = _session(name)
    (graph_input,) = session.get_inputs()
    rng = np.random.default_rng(batch)
    x = rng.standard_normal([batch, *graph_input.shape[1:]]).astype(np.float32)
    outputs = session.run(None, {graph_input.name: x})
    assert len(outputs) == len(_model(name).graph.output)
    for out in outputs:
        assert out.shape[0] == batch
        assert np.isfinite(out).all()
        assert 1e-3 < out.std() < 1e3


@pytest.mark.parametrize("name", ZOO)
def test_model_is_deterministic_and_small(name):
    serialized = _model(name).SerializeToString()
    assert build(name).SerializeToString() == serialized
    assert len(serialized) < 3 * 1024 * 1024


@pytest.mark.parametrize("name", ZOO)
def test_static_batch_is_written_into_inputs_and_outputs(name):
    model = build(name, batch=1)
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_value == 1


@pytest.mark.parametrize("name", sorted(set(ZOO) - WITHOUT_BATCHNORM))
def test_batchnorm_statistics_are_nontrivial(name):
    g = Graph(_model(name))
    batch_norms = g.of_type("BatchNormalization")
    assert batch_norms
    for bn in batch_norms:
        scale, bias, mean, var = (g.values[t] for t in bn.input[1:])
        assert g.produced_by(bn.input[0]) == "Conv"
        assert 0.5 <= scale.min() and scale.max() <= 1.5 and scale.std() > 0.1
        assert 0.5 <= var.min() and var.max() <= 1.5 and var.std() > 0.1
        assert np.abs(bias).max() > 0.01 and np.abs(mean).max() > 0.01


def test_default_model_is_static_resnet():
    assert DEFAULT_MODEL == "resnet_tiny"
    model = default_model()
    assert model.graph.name == "resnet_tiny"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_unknown_model_name_lists_the_zoo():
    with pytest.raises(KeyError, match="resnet_tiny"):
        build("no_such_model")


def test_main_writes_every_model(tmp_path, monkeypatch):
    from models.__main__ import main
    monkeypatch.setattr("sys.argv", ["models", str(tmp_path)])
    main()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.onnx" for n in ZOO)


# ----------------------------------------------------------------------- promised patterns
def test_resnet_pattern():
    g = Graph(_model("resnet_tiny"))
    assert g.op_counts() == Counter(Conv=9, BatchNormalization=9, Relu=8, Add=3, MaxPool=1,
                                    GlobalAveragePool=1, Flatten=1, Gemm=1)
    stem = g.nodes[0]
    assert attr(stem, "kernel_shape") == [7, 7] and attr(stem, "strides") == [2, 2]
    for add in g.of_type("Add"):  # residual added before the block's final ReLU
        assert g.only_consumer(add).op_type == "Relu"
    downsample = [c for c in g.of_type("Conv")
                  if attr(c, "kernel_shape") == [1, 1] and attr(c, "strides") == [2, 2]]
    assert len(downsample) == 1
    bn = g.only_consumer(downsample[0])
    assert bn.op_type == "BatchNormalization" and g.only_consumer(bn).op_type == "Add"
    assert attr(g.of_type("Gemm")[0], "transB") == 1


def test_yolo_pattern():
    g = Graph(_model("yolo_tiny"))
    counts = g.op_counts()
    assert counts["Sigmoid"] == counts["Mul"] == counts["BatchNormalization"] == 20
    assert (counts["Split"], counts["Concat"], counts["MaxPool"], counts["Resize"]) == (3, 5, 3, 1)
    for sigmoid in g.of_type("Sigmoid"):  # SiLU as Mul(x, Sigmoid(x))
        mul = g.only_consumer(sigmoid)
        assert list(mul.input) == [sigmoid.input[0], sigmoid.output[0]]
    for add in g.of_type("Add"):  # C2f shortcut: added after the bottleneck's activation
        assert [g.produced_by(t) for t in add.input] == ["Split", "Mul"]
    for pool in g.of_type("MaxPool"):  # SPPF: three chained 5x5/1 pools, all concatenated
        assert (attr(pool, "kernel_shape"), attr(pool, "strides"), attr(pool, "pads")) == \
            ([5, 5], [1, 1], [2, 2, 2, 2])
        assert "Concat" in {c.op_type for c in g.consumers[pool.output[0]]}
    assert sorted(g.produced_by(p.input[0]) for p in g.of_type("MaxPool")) == \
        ["MaxPool", "MaxPool", "Mul"]
    (resize,) = g.of_type("Resize")
    assert attr(resize, "mode") == b"nearest"
    assert g.values[resize.input[2]].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert g.only_consumer(resize).op_type == "Concat"
    assert len(g.outputs) == 2
    for output in g.outputs:  # detect head ends in a plain conv with bias, no BN
        head = g.producer[output]
        assert head.op_type == "Conv" and len(head.input) == 3
        assert g.produced_by(head.input[0]) == "Mul"


def _assert_squeeze_excite(g: Graph, pool: onnx.NodeProto, hidden_act: str,
                           gate: str) -> onnx.NodeProto:
    """GlobalAveragePool → Conv(bias) → hidden_act → Conv(bias) → gate → Mul(gate, features);
    returns the gate node."""
    squeeze = g.only_consumer(pool)
    assert squeeze.op_type == "Conv" and len(squeeze.input) == 3
    if hidden_act == "SiLU":  # Sigmoid and Mul both read the conv output
        (sigmoid,) = g.follow(squeeze, ["Sigmoid"])
        (hidden,) = g.follow(squeeze, ["Mul"])
        assert list(hidden.input) == [sigmoid.output[0], squeeze.output[0]]
    else:
        hidden = g.only_consumer(squeeze)
        assert hidden.op_type == hidden_act
    excite, gate_node, scale = g.follow(hidden, ["Conv", gate, "Mul"])
    assert len(excite.input) == 3
    assert list(scale.input) == [gate_node.output[0], pool.input[0]]
    return gate_node


def test_mobilenetv3_pattern():
    g = Graph(_model("mobilenetv3_tiny"))
    counts = g.op_counts()
    assert (counts["HardSwish"], counts["HardSigmoid"], counts["Add"]) == (7, 2, 3)
    depthwise = [c for c in g.of_type("Conv") if is_depthwise(g, c)]
    assert {attr(c, "kernel_shape")[0] for c in depthwise} == {3, 5}
    assert any(attr(c, "strides") == [2, 2] for c in depthwise)
    for conv in depthwise:
        g.follow(conv, ["BatchNormalization"])
    se_pools = [p for p in g.of_type("GlobalAveragePool")
                if g.only_consumer(p).op_type == "Conv"]
    assert len(se_pools) == 2
    for pool in se_pools:
        gate = _assert_squeeze_excite(g, pool, "Relu", "HardSigmoid")
        assert attr(gate, "alpha") == pytest.approx(1 / 6) and attr(gate, "beta") == 0.5
    for add in g.of_type("Add"):  # residual after the linear projection, no activation
        assert g.produced_by(add.input[0]) == "BatchNormalization"
        assert all(c.op_type in ("Conv", "Add") for c in g.consumers[add.output[0]])


def test_efficientnet_pattern():
    g = Graph(_model("efficientnet_tiny"))
    counts = g.op_counts()
    assert (counts["Sigmoid"], counts["Mul"], counts["Add"]) == (21, 21, 3)
    silu_muls = [m for m in g.of_type("Mul")
                 if g.produced_by(m.input[0]) == "Sigmoid"
                 and g.producer[m.input[0]].input[0] == m.input[1]]
    assert len(silu_muls) == 16  # SiLU as Mul(Sigmoid(x), x); the other 5 Muls are SE scales
    depthwise = [c for c in g.of_type("Conv") if is_depthwise(g, c)]
    assert {attr(c, "kernel_shape")[0] for c in depthwise} == {3, 5}
    se_pools = [p for p in g.of_type("GlobalAveragePool")
                if g.only_consumer(p).op_type == "Conv"]
    assert len(se_pools) == 5
    for pool in se_pools:
        _assert_squeeze_excite(g, pool, "SiLU", "Sigmoid")


def test_convnext_pattern():
    g = Graph(_model("convnext_tiny"))
    counts = g.op_counts()
    assert "BatchNormalization" not in counts
    assert (counts["LayerNormalization"], counts["Erf"], counts["MatMul"]) == (6, 3, 6)
    stem = g.nodes[0]
    assert attr(stem, "kernel_shape") == [4, 4] and attr(stem, "strides") == [4, 4]
    g.follow(stem, ["Transpose", "LayerNormalization", "Transpose"])
    for ln in g.of_type("LayerNormalization"):
        assert attr(ln, "axis") == -1
        assert attr(g.producer[ln.input[0]], "perm") == [0, 2, 3, 1]
    depthwise = [c for c in g.of_type("Conv") if is_depthwise(g, c)]
    assert len(depthwise) == 3
    for dw in depthwise:
        assert attr(dw, "kernel_shape") == [7, 7] and attr(dw, "pads") == [3, 3, 3, 3]
        assert len(dw.input) == 3
        block = g.follow(dw, ["Transpose", "LayerNormalization", "MatMul", "Add", "Div", "Erf",
                              "Add", "Mul", "Mul", "MatMul", "Add", "Mul", "Transpose", "Add"])
        div, erf_plus_one, half = block[4], block[6], block[8]
        assert g.scalar(div.input[1]) == pytest.approx(1.4142135)
        assert g.scalar(erf_plus_one.input[1]) == 1.0
        assert g.scalar(half.input[1]) == 0.5
        assert block[-1].input[0] == dw.input[0]  # residual around the whole block


def test_ppocr_pattern():
    g = Graph(_model("ppocr_tiny"))
    counts = g.op_counts()
    assert (counts["Clip"], counts["Div"]) == (10, 9)
    x_first = Counter()
    scalings = Counter()
    for clip in g.of_type("Clip"):  # Add(x, 3) → Clip(·, 0, 6) → Mul → Div 6 | Mul 1/6
        assert [g.scalar(t) for t in clip.input[1:]] == [0.0, 6.0]
        shift = g.producer[clip.input[0]]
        assert shift.op_type == "Add" and g.scalar(shift.input[1]) == 3.0
        x = shift.input[0]
        assert g.produced_by(x) == "BatchNormalization"
        mul = g.only_consumer(clip)
        assert mul.op_type == "Mul" and set(mul.input) == {x, clip.output[0]}
        x_first[mul.input[0] == x] += 1
        scale = g.only_consumer(mul)
        scalings[(scale.op_type, round(g.scalar(scale.input[1]), 6))] += 1
    assert x_first == {True: 8, False: 2}  # Mul(·, x) in one block's two hard-swishes
    assert scalings == {("Div", 6.0): 9, ("Mul", 0.166667): 1}
    (gate,) = g.of_type("HardSigmoid")
    assert attr(gate, "alpha") == pytest.approx(0.2) and attr(gate, "beta") == 0.5
    (squeeze,) = g.of_type("Squeeze")
    assert attr(squeeze, "axes") == [2] and len(squeeze.input) == 1  # opset-11 attribute form
    assert {attr(c, "kernel_shape")[0] for c in g.of_type("Conv") if is_depthwise(g, c)} == {3, 5}


def test_act_zoo_pattern():
    g = Graph(_model("act_zoo"))
    counts = g.op_counts()
    assert counts["Conv"] == counts["BatchNormalization"] == 18
    for op_type in ("Relu", "LeakyRelu", "Elu", "Softplus", "Sigmoid", "Tanh", "HardSigmoid",
                    "Clip", "HardSwish", "Gelu", "Erf", "Pow", "Mish"):
        assert counts[op_type] >= 1, op_type
    assert sorted(attr(n, "approximate") or b"none" for n in g.of_type("Gelu")) == \
        [b"none", b"tanh"]
    (clip,) = g.of_type("Clip")
    assert [g.scalar(t) for t in clip.input[1:]] == [0.0, 6.0]
    (pow_node,) = g.of_type("Pow")
    assert g.scalar(pow_node.input[1]) == 3.0
    (erf,) = g.of_type("Erf")
    assert g.scalar(g.producer[erf.input[0]].input[1]) == pytest.approx(0.70710678)
    hard_swish_mul = [g.only_consumer(h) for h in g.of_type("HardSigmoid")
                      if attr(h, "alpha") == pytest.approx(1 / 6)]
    assert len(hard_swish_mul) == 1 and hard_swish_mul[0].op_type == "Mul"
    mish_tanh = [t for t in g.of_type("Tanh") if g.produced_by(t.input[0]) == "Softplus"]
    assert len(mish_tanh) == 1 and g.only_consumer(mish_tanh[0]).op_type == "Mul"
    silu_orders = {tuple(g.produced_by(t) == "Sigmoid" for t in g.only_consumer(s).input)
                   for s in g.of_type("Sigmoid")
                   if g.only_consumer(s).op_type == "Mul"}
    assert silu_orders == {(False, True), (True, False)}
