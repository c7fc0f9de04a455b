"""matmul_as_conv: on ort-cpu, a MatMul of a channels-last map [N, H, W, C] by constant weights, with its
bias, layer scale and activation, becomes a 1x1 FusedConv with the same result (ORT CPU EP, the library's
CPU kernel); a Transpose back to NCHW after it cancels, so the residual Add fuses too. MatMuls that are not
such a layer, and other targets, keep the MatMul; a measured verdict against the rewrite keeps it too."""
import numpy as np
import onnx
import pytest

from models import activations as act
from models.builder import GraphBuilder
from optimizer import contract
from optimizer.costs import Costs, Timing
from optimizer.decide import Decider
from optimizer.passes.matmul_as_conv import REWRITE, matmul_as_conv
from optimizer.pipeline import optimize_model
from optimizer.report import Report
from optimizer.verify import verify
from tests.helpers import any_kernel, gs_graph, ops

ACTIVATIONS = {
    "gelu": act.gelu_erf,
    "gelu_inv_sqrt2": lambda g, x: act.gelu_erf(g, x, multiply_by_inv_sqrt2=True),
    "silu": act.silu,
    "relu": lambda g, x: g.op("Relu", [x]),
    "none": lambda g, x: x,
    "gelu_op": lambda g, x: g.op("Gelu", [x]),  # opset 20's own op, as newer exporters write nn.GELU
}


def _linear(g: GraphBuilder, x: str, c: int, k: int, *, bias_first=True, bias=True) -> str:
    w = g.weight("w", g.rng.normal(0.0, 1.0 / c ** 0.5, (c, k)))
    y = g.op("MatMul", [x, w])
    if bias:
        b = g.weight("b", g.rng.normal(0.0, 0.5, k))
        y = g.op("Add", [b, y] if bias_first else [y, b])
    return y


def _block(activation="gelu", *, dim=8, size=6, batch=1, scale_after_transpose=True, bias_first=True,
           bias=True, norm=True) -> onnx.ModelProto:
    """A ConvNeXt block: 7x7 depthwise → NHWC → LayerNorm → Linear → act → Linear → NCHW → layer scale → + x.
    torchvision scales after the Transpose back ([C, 1, 1]); the zoo's ConvNeXt before it ([C])."""
    g = GraphBuilder("block", opset=20 if activation == "gelu_op" else 17, seed=3)
    x = g.input("x", dim, size, size, batch=batch)
    y = g.op("Transpose", [g.conv(x, dim, dim, 7, group=dim, bias=True, gain=1.0)], perm=[0, 2, 3, 1])
    if norm:
        y = g.op("LayerNormalization", [y, g.weight("ln_w", g.rng.uniform(0.5, 1.5, dim)),
                                        g.weight("ln_b", g.rng.normal(0, 0.1, dim))], axis=-1, epsilon=1e-6)
    y = ACTIVATIONS[activation](g, _linear(g, y, dim, 4 * dim, bias_first=bias_first, bias=bias))
    y = _linear(g, y, 4 * dim, dim, bias_first=bias_first, bias=bias)
    gamma = g.rng.uniform(0.1, 0.5, dim)
    if scale_after_transpose:
        y = g.op("Mul", [g.op("Transpose", [y], perm=[0, 3, 1, 2]), g.weight("gamma", gamma.reshape(dim, 1, 1))])
    else:
        y = g.op("Transpose", [g.op("Mul", [y, g.weight("gamma", gamma)])], perm=[0, 3, 1, 2])
    g.output(g.op("Add", [x, y]), "y")
    return onnx.shape_inference.infer_shapes(g.build())


def _check(original, optimized, inputs=None):
    result = verify(original, optimized, precision="fp32", inputs=inputs)
    assert result["passed"] and result["worst_rel_l2"] <= 1e-5, result


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("scale_after_transpose", [True, False], ids=["scale NCHW", "scale NHWC"])
def test_a_convnext_block_becomes_three_fused_convs_with_the_same_result(activation, scale_after_transpose):
    original = _block(activation, scale_after_transpose=scale_after_transpose)
    optimized, report = optimize_model(original, target="ort-cpu")
    assert report.canonicalized[REWRITE] == 2
    assert ops(optimized).count(contract.OP_TYPE) == 3
    # all that is left: the LayerNorm between the convs and the layout moves at the model's edges (the
    # few-channel input's one epifuse::NchwToNhwc)
    assert sorted(set(ops(optimized))) == sorted({contract.OP_TYPE, "LayerNormalization", "Transpose", "NchwToNhwc"})
    assert ops(optimized).count("Transpose") == 1 and ops(optimized).count("NchwToNhwc") == 1
    fused = [n for n in optimized.graph.node if n.op_type == contract.OP_TYPE]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in fused]
    expected = {"gelu_inv_sqrt2": b"gelu", "gelu_op": b"gelu", "none": b"identity"}.get(activation, activation.encode())
    assert attrs[1].get("activation", b"identity") == expected
    assert attrs[2].get("residual") in (b"pre", b"post")  # the block's Add, the layer scale in the weights
    _check(original, optimized)


def test_dynamic_batch_and_bias_order():
    original = _block("gelu", batch="N", bias_first=False, norm=False)
    optimized, report = optimize_model(original, target="ort-cpu")
    assert report.canonicalized[REWRITE] == 2 and "MatMul" not in ops(optimized)
    _check(original, optimized, {"x": np.random.default_rng(0).standard_normal((3, 8, 6, 6)).astype(np.float32)})


def test_without_bias():
    original = _block("relu", bias=False)
    optimized, report = optimize_model(original, target="ort-cpu")
    assert report.canonicalized[REWRITE] == 2
    _check(original, optimized)


def _matmul_model(x_shape, w_shape, *, output_too=False, second_reader=False, per_channel_after=False):
    g = GraphBuilder("mm", opset=17, seed=1)
    g._inputs.append(onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape))
    y = g.op("MatMul", ["x", g.weight("w", g.rng.normal(0, 0.3, w_shape))])
    y = g.op("Add", [y, g.weight("b", g.rng.normal(0, 0.3, w_shape[-1]))])
    if per_channel_after:  # a non-scalar constant inside an activation-like chain: not movable to NCHW
        y = g.op("Mul", [g.op("Sigmoid", [y]), g.weight("s", g.rng.normal(0, 1, (1, 1, x_shape[2], 1)))])
    g.output(g.op("Relu", [y]), "y")
    if output_too:
        g.output(y, "pre")
    if second_reader:
        g.output(g.op("Neg", [y]), "neg")
    return onnx.shape_inference.infer_shapes(g.build())


@pytest.mark.parametrize("kw", [dict(output_too=True), dict(second_reader=True), dict(per_channel_after=True)],
                         ids=["bias output is a graph output", "bias output read twice", "broadcast Mul after"])
def test_a_matmul_whose_epilogue_cannot_fuse_is_still_rewritten_correctly(kw):
    original = _matmul_model([1, 5, 6, 8], (8, 12), **kw)
    optimized, report = optimize_model(original, target="ort-cpu")
    assert report.canonicalized[REWRITE] == 1 and "MatMul" not in ops(optimized)
    _check(original, optimized)


@pytest.mark.parametrize("x_shape,w_shape", [([2, 6, 8], (8, 12)), ([1, 5, "w", 8], (8, 12)), ([1, 5, 6, 8], (5, 8, 12))],
                         ids=["rank 3", "symbolic width", "batched weights"])
def test_matmuls_that_are_not_a_pointwise_conv_are_left(x_shape, w_shape):
    optimized, report = optimize_model(_matmul_model(x_shape, w_shape), target="ort-cpu")
    assert report.canonicalized[REWRITE] == 0 and "MatMul" in ops(optimized)


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_matmul(target):
    optimized, report = optimize_model(_block(), target=target)
    assert report.canonicalized[REWRITE] == 0 and ops(optimized).count("MatMul") == 2


class _FixedCosts(Costs):
    """Every group timed as given; the groups asked about are kept."""

    description = "fixed"

    def __init__(self, ours_us, runtime_us):
        self.ours_us, self.runtime_us, self.groups = ours_us, runtime_us, []

    def group_timing(self, group):
        self.groups.append(group)
        return Timing(self.ours_us, self.runtime_us, "test", group.desc.N)


@pytest.mark.parametrize("ours,runtime,rewritten", [(50.0, 100.0, 2), (100.0, 50.0, 0)], ids=["faster", "slower"])
def test_the_rewrite_follows_the_measured_verdict(ours, runtime, rewritten):
    costs = _FixedCosts(ours, runtime)
    report = Report()
    graph = matmul_as_conv(gs_graph(_block("gelu", scale_after_transpose=False)), report, "ort-cpu",
                           Decider("ort-cpu", "fp32", "auto", costs), any_kernel)
    assert report.canonicalized[REWRITE] == rewritten
    assert [n.op for n in graph.nodes].count("MatMul") == 2 - rewritten
    # each group is the MatMul with its bias Add and activation (or layer scale), on the NHWC input as it is
    first, second = costs.groups
    assert first.pattern.startswith("MatMul+Add+") and first.desc.activation == "gelu"
    assert sorted(first.pattern.split("+")) == sorted("MatMul+Add+Div+Erf+Add+Mul+Mul".split("+"))
    assert second.pattern == "MatMul+Add+Mul" and second.desc.activation == "identity"  # scale before Transpose
    assert first.x_shape == (1, 6, 6, 8) and first.y_shape == (1, 6, 6, 32)
    assert (first.desc.H, first.desc.W, first.desc.C, first.desc.K) == (6, 6, 8, 32)
    assert len(report.decisions) == 2 - rewritten


def test_unmeasured_a_matmul_stays():
    report = Report()
    graph = matmul_as_conv(gs_graph(_block("gelu")), report, "ort-cpu", Decider("ort-cpu", "fp32", "auto", Costs()),
                           any_kernel)
    assert report.canonicalized[REWRITE] == 0 and [n.op for n in graph.nodes].count("MatMul") == 2


def test_both_micro_models_compute_the_group():
    """What the decision times: the MatMul's nodes as the runtime runs them and the FusedConv, on one NHWC input."""
    from optimizer.measure import fused_model, runtime_model
    from tests.helpers import rel_l2, run_ort
    costs = _FixedCosts(100.0, 50.0)
    matmul_as_conv(gs_graph(_block("gelu", scale_after_transpose=False)), Report(), "ort-cpu",
                   Decider("ort-cpu", "fp32", "auto", costs), any_kernel)
    for group in costs.groups:
        x = np.random.default_rng(2).standard_normal(group.x_shape).astype(np.float32)
        reference = run_ort(runtime_model(group), {"x": x})[0]
        assert reference.shape == group.y_shape
        assert rel_l2(run_ort(fused_model(group), {"x": x}, library=True)[0], reference) < 1e-5, group.pattern
