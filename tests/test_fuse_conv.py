"""fuse_conv: which patterns become one epifuse::FusedConv, with which attributes, and which are
refused (and why); never duplicated work; the kernel registry decides what may fuse."""
import numpy as np
import pytest

from models import activations as act
from optimizer import contract
from optimizer.passes.fuse_conv import fuse_conv
from optimizer.report import Report
from tests.helpers import any_kernel, conv_net, gs_graph


def _fuse(model, kernel_query=any_kernel, target="ort-cpu"):
    report = Report()
    graph = fuse_conv(gs_graph(model), report, target, kernel_query)
    return graph, report


def _fused(graph):
    return [n for n in graph.nodes if n.op == contract.OP_TYPE]


def _only_fused(graph):
    fused = _fused(graph)
    assert len(fused) == 1
    return fused[0]


def test_conv_relu_fuses_with_contract_attributes():
    graph, report = _fuse(conv_net(lambda g, x: g.op("Relu", [g.conv(x, 8, 16, 3, stride=2)])))
    node = _only_fused(graph)
    assert node.domain == "epifuse"
    assert node.attrs["activation"] == "relu" and node.attrs["residual"] == "none"
    assert node.attrs["strides"] == [2, 2] and node.attrs["pads"] == [1, 1, 1, 1]
    assert node.attrs["plugin_namespace"] == "epifuse" and node.attrs["plugin_version"] == "1"
    assert "activation_params" not in node.attrs
    w = node.inputs[1].values
    assert w.shape == (16, 3, 3, 8)  # KRSC
    assert node.inputs[2].values.shape == (16,)  # zero bias written when the conv had none
    assert len(node.inputs) == 3
    assert not [n for n in graph.nodes if n.op in ("Conv", "Relu")]
    assert report.fusions == {"relu/none": 1}


def test_krsc_filter_is_the_oihw_filter_transposed():
    model = conv_net(lambda g, x: g.conv(x, 8, 4, (3, 5)))
    oihw = next(i for i in model.graph.initializer if i.name.endswith("weight"))
    graph, _ = _fuse(model)
    from onnx import numpy_helper
    np.testing.assert_array_equal(_only_fused(graph).inputs[1].values,
                                  numpy_helper.to_array(oihw).transpose(0, 2, 3, 1))


def test_residual_before_activation_is_pre():
    def build(g, x):
        return g.op("Relu", [g.op("Add", [g.conv(x, 8, 8, 3), x])])

    node = _only_fused(_fuse(conv_net(build))[0])
    assert (node.attrs["activation"], node.attrs["residual"]) == ("relu", "pre")
    assert len(node.inputs) == 4


def test_residual_after_activation_is_post():
    def build(g, x):
        return g.op("Add", [x, act.silu(g, g.conv(x, 8, 8, 3))])

    node = _only_fused(_fuse(conv_net(build))[0])
    assert (node.attrs["activation"], node.attrs["residual"]) == ("silu", "post")


def test_activation_params_are_written():
    node = _only_fused(_fuse(conv_net(lambda g, x: g.op("LeakyRelu", [g.conv(x, 8, 8, 1)], alpha=0.2)))[0])
    assert node.attrs["activation_params"] == pytest.approx([0.2])


def test_conv_output_with_another_consumer_fuses_nothing_after_it():
    def build(g, x):
        c = g.conv(x, 8, 8, 3)
        return g.op("Add", [g.op("Relu", [c]), g.op("Sigmoid", [c])])

    graph, report = _fuse(conv_net(build))
    node = _only_fused(graph)
    assert node.attrs["activation"] == "identity"
    assert {"Relu", "Sigmoid"} <= {n.op for n in graph.nodes}
    assert "2 consumers" in report.skipped[0].reason


def test_pre_activation_sum_with_another_consumer_keeps_the_activation_separate():
    def build(g, x):
        s = g.op("Add", [g.conv(x, 8, 8, 3), x])
        return g.op("Mul", [g.op("Relu", [s]), s])

    graph, _ = _fuse(conv_net(build))
    node = _only_fused(graph)
    assert (node.attrs["activation"], node.attrs["residual"]) == ("identity", "pre")
    assert "Relu" in {n.op for n in graph.nodes}


def test_broadcast_add_is_not_a_residual():
    def build(g, x):
        per_channel = g.op("ReduceMean", [x], axes=[2, 3])  # [N, C, 1, 1]: broadcast, not a residual
        return g.op("Relu", [g.op("Add", [g.conv(x, 8, 8, 3), per_channel])])

    graph, _ = _fuse(conv_net(build))
    node = _only_fused(graph)
    assert node.attrs["residual"] == "none" and node.attrs["activation"] == "identity"


def test_residual_computed_from_the_conv_itself_is_refused():
    def build(g, x):
        c = g.conv(x, 8, 8, 3)
        return g.op("Add", [c, g.op("Sigmoid", [c])])

    graph, _ = _fuse(conv_net(build))
    assert _only_fused(graph).attrs["residual"] == "none"


def test_activation_output_that_is_a_graph_output_is_not_swallowed():
    def build(g, x):
        sig = g.op("Sigmoid", [g.conv(x, 8, 8, 3)])
        y = g.op("Relu", [sig])
        g.output(sig, "sig")
        return y

    graph, _ = _fuse(conv_net(build))
    node = _only_fused(graph)
    assert node.attrs["activation"] == "sigmoid"
    assert {o.name for o in graph.outputs} == {"sig", "y"}


def test_registry_refusal_falls_back_and_is_reported():
    def no_silu(target, desc):
        return (0, "no kernel for silu") if desc["activation"] == "silu" else (1, "")

    graph, report = _fuse(conv_net(lambda g, x: act.silu(g, g.conv(x, 8, 8, 3))), kernel_query=no_silu)
    node = _only_fused(graph)
    assert node.attrs["activation"] == "identity"
    assert "no kernel for silu" in report.skipped[0].reason
    assert {"Sigmoid", "Mul"} <= {n.op for n in graph.nodes}


def test_no_kernel_at_all_leaves_the_conv():
    graph, report = _fuse(conv_net(lambda g, x: g.op("Relu", [g.conv(x, 8, 8, 3)])),
                          kernel_query=lambda t, d: (0, "no kernel for dtype"))
    assert not _fused(graph) and "Conv" in {n.op for n in graph.nodes}
    assert report.skipped[0].reason.startswith("not fused")


def test_the_registry_sees_the_whole_problem():
    seen = []

    def record(target, desc):
        seen.append((target, desc))
        return 1, ""

    _fuse(conv_net(lambda g, x: g.op("Clip", [g.conv(x, 8, 16, 3, stride=2, group=2), g.constant(0.0),
                                              g.constant(6.0)]), batch="n"), kernel_query=record, target="tensorrt")
    target, d = seen[0]
    assert target == "tensorrt"
    assert (d["C"], d["K"], d["R"], d["S"], d["group"], d["stride_h"]) == (8, 16, 3, 3, 2, 2)
    assert d["N"] == -1 and d["H"] == 12 and d["dtype"] == 1
    assert d["activation"] == "clip" and d["activation_params"] == (0.0, 6.0)


def test_non_constant_filter_is_reported():
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                       helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2, 1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph, report = _fuse(model)
    assert not _fused(graph)
    assert "filter is not a constant" in report.skipped[0].reason


@pytest.mark.parametrize("shape", [(256, 128, 3, 3), (2048, 1, 13, 13), (512, 512, 1, 1), (300, 96, 5, 3), (96, 1, 7, 7)])
def test_a_large_filter_is_transposed_in_place_to_krsc(shape):
    """Filters of 1 MiB and more that one conv alone reads are transposed in place (no second copy)."""
    from optimizer.passes.fuse_conv import _krsc

    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
    buffer = w.__array_interface__["data"][0]
    got = _krsc(w.copy() if w.nbytes < 1 << 20 else w, sole_reader=True)
    np.testing.assert_array_equal(got, expected)
    if w.nbytes >= 1 << 20:
        assert got.__array_interface__["data"][0] == buffer
    shared = np.random.default_rng(1).standard_normal((256, 256, 3, 3)).astype(np.float32)
    before = shared.copy()
    _krsc(shared, sole_reader=False)
    np.testing.assert_array_equal(shared, before)  # another conv still reads it: untouched


@pytest.mark.parametrize("target, precision, allow, expected", [
    ("ort-cuda", "fp32", True, 1), ("tensorrt", "fp32", True, 1),
    ("ort-cuda", "fp32", False, 0),   # --precision fp32-strict
    ("ort-cpu", "fp32", True, 0),     # the CPU kernels compute fp32 either way
    ("ort-cuda", "fp16", True, 0),
])
def test_allow_tf32_is_written_for_fp32_on_the_cuda_targets(target, precision, allow, expected):
    """The node and the registry's problem both say whether the kernel may compute in TF32."""
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.registry import ConvDesc, kernel_names

    seen = []

    def record(target, desc):
        seen.append(desc["allow_tf32"])
        return 1, ""

    model = conv_net(lambda g, x: g.op("Relu", [g.conv(x, 8, 16, 3)]), batch=1)
    optimized, _ = optimize_model(model, target=target, precision=precision, kernel_query=record,
                                  policy=FusionPolicy(mode="always", allow_tf32=allow))
    nodes = [n for n in optimized.graph.node if n.op_type == contract.OP_TYPE]
    assert len(nodes) == 1 and seen and set(seen) == {expected}
    attrs = {a.name: a.i for a in nodes[0].attribute if a.name == "allow_tf32"}
    assert attrs == ({"allow_tf32": 1} if expected else {})
    tf32 = [k for k in kernel_names(target, ConvDesc(dtype=1, N=1, H=12, W=12, C=8, K=16, R=3, S=3, pad_top=1,
                                                      pad_left=1, pad_bottom=1, pad_right=1, allow_tf32=expected))
            if "_tf32_" in k]
    assert bool(tf32) == (bool(expected) and target != "ort-cpu")
