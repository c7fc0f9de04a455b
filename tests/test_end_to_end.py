"""The issue's "done when" on every zoo model: optimize + verify on ORT CPU with the epifuse
library; no foldable BN left; every supported conv pattern fused; transposes only at region
edges; fp16/bf16 within what their rounding explains."""
import json

import numpy as np
import onnx
import pytest

from models import zoo
from optimizer import contract
from optimizer.cli import main
from optimizer.passes.conv_mean import OP_TYPE as CONV_MEAN
from optimizer.passes.conv_scale import OP_TYPE as CONV_SCALE
from optimizer.passes.layout import ELEMENTWISE, GLOBAL_POOLS, REDUCTIONS
from optimizer.passes.load import validate
from optimizer.passes.matmul_as_conv import REWRITE as MATMUL_AS_CONV
from optimizer.passes.pointwise_depthwise import PAIR_OP_TYPES
from optimizer.pipeline import optimize_model
from optimizer.verify import verify

# Activation ops that legitimately survive: they follow a Gemm/MatMul, not a conv. (ConvNeXt's MLP
# MatMuls become 1x1 convs on ort-cpu, so their GELUs fuse.)
UNFUSED_ACTIVATIONS = {
    "resnet_tiny": {}, "yolo_tiny": {}, "mobilenetv3_tiny": {"HardSwish": 1}, "efficientnet_tiny": {},
    "convnext_tiny": {}, "ppocr_tiny": {"Softmax": 1}, "act_zoo": {},
}
MATMULS_AS_CONVS = {"convnext_tiny": 6}
ACTIVATION_OPS = {"Relu", "LeakyRelu", "Elu", "Softplus", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip", "Gelu",
                  "Mish", "Erf", "Softmax"}
# fp16/bf16: unit roundoff 2^-11 / 2^-8 per rounding of weights, activations and each layer's
# output; through these ≤ 20-layer nets the relative L2 error stays an order below these bounds.
TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
# on ort-cpu a conv with its channel mean is FusedConvMean, one of a gated input FusedConvScaled, an expand 1x1
# conv and the depthwise conv that reads it FusedPointwiseDepthwise, a depthwise conv and the 1x1 conv that reads it
# FusedDepthwisePointwise (two convs each)
FUSED = {contract.OP_TYPE, CONV_MEAN, CONV_SCALE, *PAIR_OP_TYPES}
AGNOSTIC = ELEMENTWISE | REDUCTIONS | set(GLOBAL_POOLS) | {"Concat", "Split", "Slice", "Pad", "Resize", "Transpose"}


def _optimize(name, precision="fp32", target="ort-cpu"):
    original = validate(zoo.build(name))
    optimized, report = optimize_model(original, precision=precision, target=target)
    return original, optimized, report


def _transposes_inside_regions(model: onnx.ModelProto) -> list[str]:
    """Transposes with only FusedConvs on both sides, looking through layout-agnostic ops: those
    could have cancelled. A Transpose that reaches an NCHW-only op or a graph input/output on
    either side is at a region edge."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    inputs = {v.name for v in model.graph.input}
    outputs = {v.name for v in model.graph.output}
    constants = {i.name for i in model.graph.initializer}

    def up_only_fused(tensor, seen):
        if tensor in constants or not tensor:
            return True
        n = producers.get(tensor)
        if n is None or tensor in inputs or id(n) in seen:
            return n is not None and id(n) in seen
        seen.add(id(n))
        if n.op_type in FUSED:
            return True
        return n.op_type in AGNOSTIC and all(up_only_fused(i, seen) for i in n.input)

    def down_only_fused(tensor, seen):
        if tensor in outputs:
            return False
        for c in consumers.get(tensor, []):
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.op_type in FUSED:
                continue
            if c.op_type not in AGNOSTIC or not all(down_only_fused(o, seen) for o in c.output):
                return False
        return True

    return [n.name for n in model.graph.node if n.op_type == "Transpose"
            and up_only_fused(n.input[0], set()) and down_only_fused(n.output[0], set())]


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_model_fp32(name):
    original, optimized, report = _optimize(name)
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL["fp32"], result
    ops = [n.op_type for n in optimized.graph.node]
    assert "BatchNormalization" not in ops
    assert "Conv" not in ops
    assert report.canonicalized[MATMUL_AS_CONV] == MATMULS_AS_CONVS.get(name, 0)
    convs = [n.op_type for n in original.graph.node].count("Conv")
    convs_in_nodes = sum(ops.count(op) for op in FUSED) + sum(map(ops.count, PAIR_OP_TYPES))  # a pair: two
    assert convs_in_nodes == convs + MATMULS_AS_CONVS.get(name, 0)
    left = {op: ops.count(op) for op in ACTIVATION_OPS if ops.count(op)}
    assert left == UNFUSED_ACTIVATIONS[name]
    assert _transposes_inside_regions(optimized) == []
    assert ops.count("Transpose") < report.transposes_inserted
    assert report.activation_bytes_saved > 0 or name == "convnext_tiny"  # no BN, no activation after a conv


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(set(zoo.ZOO) - {"ppocr_tiny"}))
def test_zoo_model_low_precision(name, precision):
    original, optimized, _ = _optimize(name, precision)
    result = verify(original, optimized, precision=precision)
    assert result["worst_rel_l2"] <= TOL[precision], result
    graph = optimized.graph
    assert [i.type.tensor_type.elem_type for i in graph.input] == [i.type.tensor_type.elem_type
                                                                    for i in original.graph.input]
    low = onnx.TensorProto.FLOAT16 if precision == "fp16" else onnx.TensorProto.BFLOAT16
    weights = {i.name: i.data_type for i in graph.initializer}
    fused = [n for n in graph.node if n.op_type == contract.OP_TYPE]
    assert fused and all(weights[n.input[1]] == low for n in fused)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda", "tensorrt"])
def test_every_optimized_zoo_model_passes_onnx_full_check(target, precision):
    """ONNX's checker with strict shape and type inference on every target and precision: a node in a
    type its schema does not admit at the model's opset (a bfloat16 MaxPool at opset 17) is an invalid
    model that no runtime loads, whatever verify on the CPU can say about it."""
    for name in sorted(zoo.ZOO):
        if precision == "bf16" and name == "ppocr_tiny":  # opset 11: refused with a clear error (below)
            continue
        _, optimized, _ = _optimize(name, precision, target=target)
        onnx.checker.check_model(optimized, full_check=True)


def test_bf16_on_an_opset_11_model_is_a_clear_error():
    from optimizer.errors import EpifuseError

    with pytest.raises(EpifuseError, match="opset 13"):
        _optimize("ppocr_tiny", "bf16")


@pytest.mark.parametrize("name", ["resnet_tiny", "yolo_tiny"])
def test_gpu_targets_cast_only_at_the_graph_edges(name):
    _, optimized, _ = _optimize(name, "fp16", target="ort-cuda")
    casts = [n for n in optimized.graph.node if n.op_type == "Cast"]
    io = {v.name for v in optimized.graph.input} | {v.name for v in optimized.graph.output}
    assert all(n.input[0] in io or n.output[0] in io for n in casts)


def test_tensorrt_target_writes_what_the_onnx_parser_expects(tmp_path):
    _, optimized, _ = _optimize("yolo_tiny", target="tensorrt")
    assert any(o.domain == "epifuse" and o.version == 1 for o in optimized.opset_import)
    fused = [n for n in optimized.graph.node if n.op_type == "FusedConv"]
    assert fused
    kinds = {"strides": onnx.AttributeProto.INTS, "pads": onnx.AttributeProto.INTS,
             "dilations": onnx.AttributeProto.INTS, "group": onnx.AttributeProto.INT,
             "activation": onnx.AttributeProto.STRING, "residual": onnx.AttributeProto.STRING,
             "plugin_namespace": onnx.AttributeProto.STRING, "plugin_version": onnx.AttributeProto.STRING,
             "activation_params": onnx.AttributeProto.FLOATS, "allow_tf32": onnx.AttributeProto.INT}
    for n in fused:
        attrs = {a.name: a for a in n.attribute}
        assert set(attrs) <= set(kinds) and {"plugin_namespace", "plugin_version", "activation"} <= set(attrs)
        assert all(attrs[k].type == kinds[k] for k in attrs)
        assert attrs["plugin_namespace"].s == b"epifuse" and attrs["plugin_version"].s == b"1"
        assert attrs["allow_tf32"].i == 1  # fp32 for TensorRT: TF32 allowed, as TensorRT's own convs
        assert n.domain == "epifuse"
        assert all(name for name in n.input), "no empty optional inputs"
        assert len(n.input) == (4 if attrs["residual"].s != b"none" else 3)
    init = {i.name for i in optimized.graph.initializer}
    assert all(n.input[1] in init and n.input[2] in init for n in fused)


def test_cli_optimize_verify_report(tmp_path, capsys):
    src, out, rep = tmp_path / "m.onnx", tmp_path / "m.epifuse.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("efficientnet_tiny"), src)
    assert main(["optimize", str(src), "-o", str(out), "--verify", "--report", str(rep)]) == 0
    text = capsys.readouterr().out
    assert "FusedConv nodes" in text and "PASS" in text
    report = json.loads(rep.read_text())
    assert report["fusions"]["silu/none"] == 16 and report["bn_folded"] == {"Conv": 16}
    assert report["verify"]["passed"] and report["nodes_after"] < report["nodes_before"]
    onnx.checker.check_model(onnx.load(out))


def test_cli_verify_with_inputs_file(tmp_path, capsys):
    src, out, npz = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "in.npz"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    np.savez(npz, input=np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32))
    assert main(["verify", str(src), str(out), "--inputs", str(npz)]) == 0
    assert '"passed": true' in capsys.readouterr().out


def test_cli_verify_detects_a_wrong_model(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("resnet_tiny"), src)
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    broken = onnx.load(out)
    w = next(i for i in broken.graph.initializer if i.name.endswith("W_krsc"))
    arr = onnx.numpy_helper.to_array(w).copy()
    arr.flat[0] += 1.0
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    onnx.save(broken, out)
    assert main(["verify", str(src), str(out)]) == 1


def _offset_model(offset: float) -> onnx.ModelProto:
    """y = (x + 1000.3) - (1000 - offset) = x + 0.3 + offset in fp32. In fp16 the constant 1000.3 rounds
    to 1000.5 (the spacing there is 0.5), so x ~ N(0, 1) comes back 0.2 off: a relative error of about
    0.2 that is the precision's (its rounding of the model's constants), not a bug's."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])
    constants = [onnx.numpy_helper.from_array(np.array(1000.3, np.float32), "shift"),
                 onnx.numpy_helper.from_array(np.array(1000.0 - offset, np.float32), "back")]
    nodes = [helper.make_node("Add", ["x", "shift"], ["s"]), helper.make_node("Sub", ["s", "back"], ["y"])]
    graph = helper.make_graph(nodes, "offset", [x], [y], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_low_precision_verify_allows_twice_the_precisions_own_error_and_no_more(tmp_path, capsys):
    from optimizer.pipeline import unfused_model

    original = _offset_model(0.0)
    fp16 = unfused_model(original, "ort-cpu", "fp16")
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in fp16.graph.initializer)
    assert not verify(original, fp16, precision="fp16")["passed"]  # 0.2 > 1e-2: the precision's own error
    result = verify(original, fp16, precision="fp16", baseline=fp16)
    assert result["passed"] and 0.05 < result["precision_own_rel_l2"]["y"] < 0.5
    # off by 1 on top of fp16's rounding: past twice the precision's error, still caught
    wrong = unfused_model(_offset_model(1.0), "ort-cpu", "fp16")
    assert not verify(original, wrong, precision="fp16", baseline=fp16)["passed"]
    # the CLI converts the original for the target itself
    onnx.save(original, tmp_path / "m.onnx")
    onnx.save(fp16, tmp_path / "o.onnx")
    onnx.save(wrong, tmp_path / "w.onnx")
    assert main(["verify", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--precision", "fp16"]) == 0
    assert main(["verify", str(tmp_path / "m.onnx"), str(tmp_path / "w.onnx"), "--precision", "fp16"]) == 1


def test_cli_inspect_lists_fusions_and_refusals(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("mobilenetv3_tiny"), src)
    assert main(["inspect", str(src)]) == 0
    text = capsys.readouterr().out
    assert "hardswish" in text and "not fused" in text and "consumers" in text


def test_cli_demo(tmp_path, capsys):
    assert main(["demo", "--output-dir", str(tmp_path)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert (tmp_path / f"{zoo.DEFAULT_MODEL}.epifuse.onnx").exists()


def test_full_size_yolov8s_fuses_every_conv_and_verifies():
    from models.yolo import yolov8

    original = validate(yolov8("s", batch=1, size=320))
    optimized, report = optimize_model(original)
    result = verify(original, optimized, precision="fp32")
    assert result["passed"], result
    ops = [n.op_type for n in optimized.graph.node]
    assert ops.count(contract.OP_TYPE) == [n.op_type for n in original.graph.node].count("Conv") == 63
    assert "Sigmoid" not in ops and "BatchNormalization" not in ops
    assert report.fusions["silu/post"] == 6  # the backbone C2f bottlenecks' shortcuts
    assert _transposes_inside_regions(optimized) == []
