"""fold_affine: a constant per-channel Mul / Add / Sub / Div after a Conv or ConvTranspose disappears
into its weights and bias with the same outputs (on ONNX Runtime, random inputs); constants that
broadcast along any other axis, Div by zero, c / y, shared outputs and fp16 overflow stay as they
are; after the fold, the activation behind the affine fuses into the FusedConv."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.fold_affine import fold_affine
from optimizer.pipeline import FusionPolicy, optimize_model
from tests.helpers import ops, rel_l2, run_ort, run_pass

K, C = 6, 4


def _model(tail, consts, dtype=np.float32, conv="Conv", bias=True, outputs=("y",)):
    """x -> conv -> the `tail` nodes (reading "c"); `consts` are named initializers."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, C, 3, 3) if conv == "Conv" else (C, K, 3, 3)).astype(dtype)
    inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(np.asarray(v, dtype), n)
                                               for n, v in consts.items()]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(K).astype(dtype), "b"))
        inputs.append("b")
    attrs = {"pads": [1, 1, 1, 1]} if conv == "Conv" else {"strides": [2, 2]}
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph([helper.make_node(conv, inputs, ["c"], **attrs)] + tail, "t",
                          [helper.make_tensor_value_info("x", elem, [2, C, 8, 8])],
                          [helper.make_tensor_value_info(o, elem, None) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _fold(model):
    return run_pass(fold_affine, model)


def _feeds(dtype=np.float32):
    return {"x": np.random.default_rng(1).standard_normal((2, C, 8, 8)).astype(dtype)}


def _same_outputs(a, b, dtype=np.float32, tol=1e-5):
    for u, v in zip(run_ort(a, _feeds(dtype)), run_ort(b, _feeds(dtype))):
        assert rel_l2(u, v) < tol


rng = np.random.default_rng(2)
SCALE = rng.uniform(0.5, 2.0, (K, 1, 1))
SHIFT = rng.standard_normal((1, K, 1, 1))


@pytest.mark.parametrize("tail, consts", [
    ([helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])],
     {"s": [0.9], "t": [0.5]}),                                   # PP-LCNet's learnable affine block
    ([helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["t", "m"], ["y"])],
     {"s": SCALE, "t": SHIFT}),                                   # per channel, either operand order
    ([helper.make_node("Sub", ["c", "t"], ["y"])], {"t": SHIFT}),
    ([helper.make_node("Sub", ["t", "c"], ["y"])], {"t": 1.5}),   # c - y: scale -1
    ([helper.make_node("Div", ["c", "s"], ["y"])], {"s": SCALE}),
])
@pytest.mark.parametrize("conv", ["Conv", "ConvTranspose"])
def test_affine_folds_into_the_conv(tail, consts, conv):
    model = _model(tail, consts, conv=conv)
    folded, report = _fold(model)
    assert ops(folded) == [conv]
    assert sum(report.affine_folded.values()) == len(tail)
    _same_outputs(folded, model)


def test_folds_into_a_conv_without_bias():
    model = _model([helper.make_node("Add", ["c", "t"], ["y"])], {"t": SHIFT}, bias=False)
    folded, _ = _fold(model)
    assert ops(folded) == ["Conv"]
    _same_outputs(folded, model)


@pytest.mark.parametrize("tail, consts, why", [
    ([helper.make_node("Mul", ["c", "s"], ["y"])], {"s": np.ones((1, 1, 1, 8))}, "varies along W"),
    ([helper.make_node("Add", ["c", "t"], ["y"])], {"t": np.arange(8.0)}, "[W]: along W"),
    ([helper.make_node("Add", ["c", "t"], ["y"])], {"t": np.ones((2, K, 1, 1))}, "varies along the batch"),
    ([helper.make_node("Mul", ["c", "s"], ["y"])], {"s": np.ones((1, 1, 1, 1, 1))}, "widens the rank"),
    ([helper.make_node("Div", ["c", "s"], ["y"])], {"s": np.r_[1.0, 0.0, 1, 1, 1, 1].reshape(K, 1, 1)}, "y / 0"),
    ([helper.make_node("Div", ["s", "c"], ["y"])], {"s": 2.0}, "c / y is not affine"),
    ([helper.make_node("Mul", ["c", "c"], ["y"])], {}, "y * y"),
])
def test_what_is_not_a_per_channel_affine_stays(tail, consts, why):
    model = _model(tail, consts)
    folded, report = _fold(model)
    assert ops(folded) == ops(model), why
    assert not report.affine_folded
    for u, v in zip(run_ort(folded, _feeds()), run_ort(model, _feeds())):
        np.testing.assert_allclose(u, v, rtol=1e-6, equal_nan=True)


def test_a_conv_output_read_twice_is_not_folded():
    tail = [helper.make_node("Mul", ["c", "s"], ["y"]), helper.make_node("Relu", ["c"], ["z"])]
    model = _model(tail, {"s": 2.0}, outputs=("y", "z"))
    folded, _ = _fold(model)
    assert ops(folded) == ["Conv", "Mul", "Relu"]


def test_fp16_fold_that_would_overflow_is_not_made():
    model = _model([helper.make_node("Mul", ["c", "s"], ["y"])], {"s": 60000.0}, dtype=np.float16)
    folded, _ = _fold(model)
    assert ops(folded) == ["Conv", "Mul"]


def test_fp16_fold_matches():
    model = _model([helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])],
                   {"s": SCALE, "t": SHIFT}, dtype=np.float16)
    folded, _ = _fold(model)
    assert ops(folded) == ["Conv"]
    _same_outputs(folded, model, dtype=np.float16, tol=2e-3)


def test_the_activation_behind_the_affine_fuses():
    """conv -> Mul(s, .) -> Add(., t) -> x * Clip(x + 3, 0, 6) / 6: one FusedConv with hardswish."""
    tail = [helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"]),
            helper.make_node("Add", ["a", "three"], ["p"]), helper.make_node("Clip", ["p", "zero", "six"], ["q"]),
            helper.make_node("Mul", ["a", "q"], ["r"]), helper.make_node("Div", ["r", "six"], ["y"])]
    model = _model(tail, {"s": [0.9], "t": [0.5], "three": 3.0, "zero": 0.0, "six": 6.0})
    optimized = optimize_model(model, policy=FusionPolicy(mode="always"))
    optimized = optimized[0] if isinstance(optimized, tuple) else optimized
    fused = [n for n in optimized.graph.node if n.op_type == "FusedConv"]
    assert len(fused) == 1 and not {"Mul", "Add", "Clip", "Div"} & set(ops(optimized))
    assert helper.get_attribute_value(next(a for a in fused[0].attribute if a.name == "activation")) == b"hardswish"
    for u, v in zip(run_ort(optimized, _feeds(), library=True), run_ort(model, _feeds())):
        assert rel_l2(u, v) < 1e-5


def _input_side_model(kernel, pads, group=1):
    """x -> Relu -> Mul(scale per channel) -> Add(shift) -> Conv."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, C // group, kernel, kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(0.5, 2, (1, C, 1, 1)).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal((C, 1, 1)).astype(np.float32), "t")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "s"], ["m"]),
             helper.make_node("Add", ["t", "m"], ["a"]),
             helper.make_node("Conv", ["a", "w", "b"], ["y"], group=group, pads=[pads] * 4)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("kernel, group", [(1, 1), (3, 1), (1, 2), (3, 2)])
def test_affine_before_an_unpadded_conv_folds_into_it(kernel, group):
    model = _input_side_model(kernel, 0, group)
    folded, report = _fold(model)
    assert ops(folded) == ["Relu", "Conv"] and report.affine_folded == {"Mul": 1, "Add": 1}
    _same_outputs(folded, model)


def test_affine_before_a_padded_conv_stays():
    """The padded border is zeros, not the shift: folding would change the border outputs."""
    model = _input_side_model(3, 1)
    folded, report = _fold(model)
    assert ops(folded) == ops(model) and not report.affine_folded


def test_the_last_node_of_an_activation_is_not_folded_into_the_next_conv():
    """conv -> x * Clip(x + 3, 0, 6) / 6 -> 1x1 conv: the Div by 6 is an affine the 1x1 conv could take,
    but then the HardSwish would no longer match; it stays, and fuses into the first conv."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((K, C, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((K, K, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.float32(3), "three"), numpy_helper.from_array(np.float32(0), "zero"),
             numpy_helper.from_array(np.float32(6), "six")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
             helper.make_node("Add", ["a", "three"], ["p"]), helper.make_node("Clip", ["p", "zero", "six"], ["q"]),
             helper.make_node("Mul", ["a", "q"], ["r"]), helper.make_node("Div", ["r", "six"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    folded, report = _fold(model)
    assert ops(folded) == ops(model) and not report.affine_folded
    optimized = optimize_model(model, policy=FusionPolicy(mode="always"))
    optimized = optimized[0] if isinstance(optimized, tuple) else optimized
    assert [helper.get_attribute_value(a) for n in optimized.graph.node if n.op_type == "FusedConv"
            for a in n.attribute if a.name == "activation"] == [b"hardswish", b"identity"]
