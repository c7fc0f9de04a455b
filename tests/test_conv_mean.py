"""conv_mean: on ort-cpu a depthwise FusedConv and the ChannelMean of its output (a squeeze-excite block's
pool) become one epifuse::FusedConvMean. The op against the two nodes it replaces and float64 numpy: Y bit
for bit the FusedConv's, the mean summed in the depthwise kernel's registers (both ISAs; bf16) or, on any
other kernel, a pass over Y; the pass on zoo models, in bf16, for other targets, and on a model optimized
before."""
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conv_reference import rel_l2
from models import zoo
from optimizer.passes.conv_mean import MEAN_OP, OP_TYPE
from optimizer.passes.load import validate
from optimizer.passes.pointwise_depthwise import MEAN_OP_TYPE as PAIR_WITH_MEAN
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import conv_inputs, cpu_flags, ops
from tests.test_cpu_winograd import TOL, _reference, isa  # noqa: F401 (isa: the fixture of both ISAs)

pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the depthwise kernel needs AVX2 and FMA")

BF16 = TensorProto.BFLOAT16


def _model(shape, attrs, w, b, elem=TensorProto.FLOAT, merged=True, name="dw"):
    """FusedConvMean (or FusedConv + ChannelMean) of X [n, h, w, c]; outputs y and m. bf16: the op's
    inputs and outputs in bfloat16, the graph's float (Casts: ORT's Python API takes no bfloat16 arrays)."""
    n, h, wd, c, k, r, s = shape
    bf16 = elem == BF16
    dtype = ml_dtypes.bfloat16 if bf16 else np.float32
    inits = [helper.make_tensor(t, elem, list(a.shape), a.astype(dtype).tobytes(), raw=True) for t, a in (("w", w), ("b", b))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, h, wd, c])]
    names = ["xb" if bf16 else "x", "w", "b"]
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=BF16)] if bf16 else []
    if attrs.get("residual", "none") != "none":
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        names.append("zb" if bf16 else "z")
        nodes += [helper.make_node("Cast", ["z"], ["zb"], to=BF16)] if bf16 else []
    outs = ["yb", "mb"] if bf16 else ["y", "m"]
    attrs = {key: list(v) if isinstance(v, tuple) else v for key, v in attrs.items()}
    if merged:
        nodes += [helper.make_node(OP_TYPE, names, outs, name=name, domain="epifuse", **attrs)]
    else:
        nodes += [helper.make_node("FusedConv", names, outs[:1], name=name, domain="epifuse", **attrs),
                  helper.make_node(MEAN_OP, outs[:1], outs[1:], name=f"{name}_mean", domain="epifuse")]
    if bf16:
        nodes += [helper.make_node("Cast", [o], [o[0]], to=TensorProto.FLOAT) for o in outs]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in ("y", "m")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _run(model, x, z, threads=None):
    session = ort.InferenceSession(model.SerializeToString(), session_options(threads=threads),
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": x} if z is None else {"x": x, "z": z}
    return session.run(None, feeds)


# (N, H, W, C, R, S), strides, pads: the unrolled widths and strides, a column at a time, rows too few for
# the pieces (channel groups), bands of rows of channel pairs, partial vectors, batches whose pieces of rows
# span two images
GEOMETRY = {
    "3x3_s1_partial_vector": ((1, 13, 21, 40, 3, 3), (1, 1), (1, 1, 1, 1)),
    "3x3_s2": ((1, 17, 23, 48, 3, 3), (2, 2), (1, 1, 1, 1)),
    "5x5_s2_batch": ((3, 15, 15, 72, 5, 5), (2, 2), (2, 2, 2, 2)),
    "7x7_rows_fewer_than_pieces": ((1, 7, 7, 200, 5, 5), (1, 1), (2, 2, 2, 2)),
    "bands_of_channel_pairs_batch": ((2, 14, 14, 484, 3, 3), (1, 1), (1, 1, 1, 1)),  # a block's input past L1
    "3x4_a_column_at_a_time": ((2, 9, 20, 21, 3, 4), (1, 1), (1, 2, 1, 1)),  # a width it does not unroll
    "one_pixel": ((1, 1, 1, 32, 3, 3), (1, 1), (1, 1, 1, 1)),
}


@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_the_op_is_the_conv_and_the_mean_of_its_output(name, residual, isa, monkeypatch):
    """On the depthwise kernel (forced: with AVX2 alone a first run may time oneDNN faster and take the
    mean in a pass), the mean summed in its registers."""
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "depthwise")
    (n, h, wd, c, r, s), strides, pads = GEOMETRY[name]
    shape = (n, h, wd, c, c, r, s)
    attrs = dict(strides=strides, pads=pads, group=c, activation="hardswish", residual=residual)
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    y, m = _run(_model(shape, attrs, w, b), x, z)
    y2, m2 = _run(_model(shape, attrs, w, b, merged=False), x, z)
    assert np.array_equal(y, y2)  # the same kernel computes Y
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL
    assert m.shape == (n, 1, 1, c)
    expected = y.astype(np.float64).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(m, expected, rtol=2e-6, atol=2e-7 * np.abs(y).max())
    np.testing.assert_allclose(m, m2, rtol=2e-6, atol=2e-7 * np.abs(y).max())


@pytest.mark.parametrize("kernel", ["onednn", "reference"])
def test_on_another_kernel_the_mean_is_a_pass_over_the_output(kernel, monkeypatch):
    """Where the depthwise kernel does not run the conv (forced elsewhere here; a dilated filter, a CPU
    without AVX2), Y comes from that kernel and the mean from the channel-mean kernel over it."""
    if kernel == "onednn":
        from tests.test_cpu_onednn import needs_onednn
        if needs_onednn.args[0]:
            pytest.skip(needs_onednn.kwargs["reason"])
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)
    shape = (2, 11, 13, 24, 24, 3, 3)
    attrs = dict(pads=(1, 1, 1, 1), group=24, activation="silu", residual="post")
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    y, m = _run(_model(shape, attrs, w, b), x, z)
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL
    np.testing.assert_allclose(m, y.astype(np.float64).mean(axis=(1, 2), keepdims=True), rtol=2e-6, atol=1e-7)


# (N, H, W, C, K, R, S), attributes: one image on oneDNN, each piece of the output summed as it is computed:
# row pieces (SiLU's pass cuts more of them), a filter width the direct kernel runs a column at a time
# (MixNet's merged groups), dense 1x1s whose filters outweigh their maps (pieces of output channels,
# computed into a buffer and copied out on 49 pixels, written in place on 196)
ONEDNN_ONE_IMAGE = {
    "dw3x3_silu_post": ((1, 40, 36, 48, 48, 3, 3), dict(pads=(1, 1, 1, 1), group=48, activation="silu",
                                                         residual="post")),
    "dw9x9_s2": ((1, 29, 29, 40, 40, 9, 9), dict(strides=(2, 2), pads=(4, 4, 4, 4), group=40,
                                                  activation="hardswish")),
    "dense1x1_channel_pieces_copied": ((1, 7, 7, 768, 3072, 1, 1), dict(activation="relu", residual="pre")),
    "dense1x1_channel_pieces_in_place": ((1, 14, 14, 384, 1536, 1, 1), dict(activation="gelu")),
}


@pytest.mark.parametrize("name", sorted(ONEDNN_ONE_IMAGE))
def test_on_onednn_one_image_sums_its_pieces_as_they_are_computed(name, monkeypatch):
    """One fp32 image on oneDNN: each piece sums its own output while it is in its core's cache, the
    pieces' sums added in a fixed order; the mean agrees with float64 over the output Y."""
    from tests.test_cpu_onednn import needs_onednn
    if needs_onednn.args[0]:
        pytest.skip(needs_onednn.kwargs["reason"])
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "onednn")
    shape, attrs = ONEDNN_ONE_IMAGE[name]
    x, w, b, z = conv_inputs(np.float32, shape, **attrs)
    y, m = _run(_model(shape, attrs, w, b), x, z)
    assert rel_l2(y, _reference(x, w, b, z, **attrs)) <= TOL
    assert m.shape == (1, 1, 1, shape[4])
    expected = y.astype(np.float64).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(m, expected, rtol=2e-6, atol=2e-7 * np.abs(y).max())
    y1, m1 = _run(_model(shape, attrs, w, b), x, z, threads=1)
    np.testing.assert_allclose(m1, y1.astype(np.float64).mean(axis=(1, 2), keepdims=True), rtol=2e-6,
                               atol=2e-7 * np.abs(y1).max())
    if np.array_equal(y, y1):  # a session may time another of oneDNN's implementations, summing Y otherwise
        assert np.array_equal(m, m1)  # the same pieces whichever threads ran them


@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags(), reason="bf16 needs AVX-512 with BW and VL")
@pytest.mark.parametrize("name", ["3x3_s1_partial_vector", "5x5_s2_batch", "3x4_a_column_at_a_time"])
def test_bf16_output_as_the_conv_and_the_mean_of_its_fp32_values(name, monkeypatch):
    """bf16: Y as the FusedConv's; the mean summed from the fp32 values before their rounding to Y, so
    within bf16's unit roundoff of the mean of Y (and of the ChannelMean of Y), rounded once."""
    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "depthwise")
    (n, h, wd, c, r, s), strides, pads = GEOMETRY[name]
    shape = (n, h, wd, c, c, r, s)
    attrs = dict(strides=strides, pads=pads, group=c, activation="silu")
    x, w, b, _ = (None if a is None else a.astype(ml_dtypes.bfloat16) for a in conv_inputs(np.float32, shape, **attrs))
    x = x.astype(np.float32)  # bf16 values, cast to bf16 again (exactly) in the graph
    y, m = _run(_model(shape, attrs, w, b, elem=BF16), x, None)
    y2, m2 = _run(_model(shape, attrs, w, b, elem=BF16, merged=False), x, None)
    assert np.array_equal(y, y2) and np.array_equal(m, m.astype(ml_dtypes.bfloat16).astype(np.float32))
    scale = np.abs(y.astype(np.float64)).mean()
    expected = y.astype(np.float64).mean(axis=(1, 2), keepdims=True)
    assert np.abs(m.astype(np.float64) - expected).max() <= 2.0 ** -8 * (np.abs(expected).max() + scale)
    assert np.abs(m.astype(np.float64) - m2.astype(np.float64)).max() <= 2.0 ** -7 * (np.abs(expected).max() + scale)


def test_the_mean_does_not_depend_on_the_intra_op_threads():
    """Each piece of rows (cut by the machine's cores, not the session's threads) sums into sums of its own,
    added in a fixed order: one intra-op thread and two agree bit for bit."""
    shape = (1, 56, 56, 144, 144, 3, 3)
    attrs = dict(pads=(1, 1, 1, 1), group=144, activation="relu")
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    model = _model(shape, attrs, w, b)
    for one, two in zip(_run(model, x, None, threads=1), _run(model, x, None, threads=2)):
        np.testing.assert_array_equal(one, two)


def test_a_bad_shape_is_an_error_naming_the_node():
    """X of 8 channels for 16 filters of one channel a group (group 16)."""
    shape = (1, 8, 8, 16, 16, 3, 3)
    attrs = dict(pads=(1, 1, 1, 1), group=16)
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    with pytest.raises(Exception, match=f"epifuse::{OP_TYPE} node 'the_dw'"):
        _run(_model((1, 8, 8, 8, 16, 3, 3), attrs, w, b, name="the_dw"), x[..., :8].copy(), None)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, BF16], ids=["fp32", "bf16"])
def test_a_node_without_its_mean_output_fails_at_session_creation(elem):
    """ONNX Runtime hands the kernel every output it declares: a node without M would crash the run."""
    shape = (1, 8, 8, 16, 16, 3, 3)
    attrs = dict(pads=(1, 1, 1, 1), group=16)
    _, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    model = _model(shape, attrs, w, b, elem=elem, name="the_dw")
    node = next(n for n in model.graph.node if n.op_type == OP_TYPE)
    del node.output[1]
    kept = [n for n in model.graph.node if n.op_type != "Cast" or n.input[0] != "mb"]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.output[1]
    with pytest.raises(Exception, match=f"epifuse::{OP_TYPE} node 'the_dw': output 1 \\(M\\) is missing"):
        ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


SE_MODELS = ["mobilenetv3_tiny", "efficientnet_tiny"]


def _optimized(name, target="ort-cpu", precision="fp32"):
    original = validate(zoo.build(name))
    optimized, report = optimize_model(original, precision=precision, target=target, policy=FusionPolicy(mode="always"))
    return original, optimized, report


@pytest.mark.parametrize("name", SE_MODELS)
def test_squeeze_excite_pools_merge_into_their_depthwise_convs(name):
    original, optimized, report = _optimized(name)
    # an expand 1x1 conv before the depthwise conv may take it into a pair, its pool too
    merged = ops(optimized).count(OP_TYPE) + ops(optimized).count(PAIR_WITH_MEAN)
    assert merged and report.canonicalized[f"depthwise FusedConv + {MEAN_OP} → epifuse::{OP_TYPE} (ort-cpu)"] == merged
    producers = {o: n for n in optimized.graph.node for o in n.output}
    for node in optimized.graph.node:  # no pool is left reading a depthwise (grouped) conv's output
        if node.op_type == MEAN_OP and producers[node.input[0]].op_type == "FusedConv":
            groups = [helper.get_attribute_value(a) for a in producers[node.input[0]].attribute if a.name == "group"]
            assert groups in ([], [1])
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


def test_bf16_models_merge_too():
    original, optimized, _ = _optimized("efficientnet_tiny", precision="bf16")
    assert OP_TYPE in ops(optimized)
    result = verify(original, optimized, precision="bf16")
    assert result["passed"], result


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_pool_and_a_model_optimized_before_splits_again(target):
    """Other targets never get the op (the library's CPU kernels alone run it); a model optimized for
    ort-cpu, optimized again for another target, has it written back as FusedConv and a ReduceMean."""
    assert OP_TYPE not in ops(_optimized("mobilenetv3_tiny", target=target)[1])
    original, for_cpu, _ = _optimized("mobilenetv3_tiny")
    again, report = optimize_model(for_cpu, precision="fp32", target=target, policy=FusionPolicy(mode="static"))
    assert OP_TYPE not in ops(again) and MEAN_OP not in ops(again) and "ReduceMean" in ops(again)
    assert report.canonicalized[f"epifuse::{OP_TYPE} → FusedConv + {MEAN_OP}"] == (
        ops(for_cpu).count(OP_TYPE) + ops(for_cpu).count(PAIR_WITH_MEAN))  # a pair's split back first


def test_a_model_optimized_before_optimizes_again_for_the_cpu_with_the_same_answer():
    original, for_cpu, _ = _optimized("mobilenetv3_tiny")
    again, _ = optimize_model(for_cpu, precision="fp32", target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert ops(again).count(OP_TYPE) == ops(for_cpu).count(OP_TYPE)
    result = verify(original, again, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result
