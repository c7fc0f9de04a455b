"""conv_scale: on ort-cpu a ChannelScale (a squeeze-excite gate) and the FusedConv that reads its product become
one epifuse::FusedConvScaled, the conv of X * S, where the conv's filters are no larger than an image of X.
The op against float64 numpy on the scaled input and against the two nodes it replaces, on each of its ways:
oneDNN scaling its reordered filters in their blocked layout (pixel pieces, padded blocks, groups, one scale
for every image or one each), plain scaled filters for a direct kernel or filters that are graph inputs, X
scaled into a buffer where the filters are the larger tensor (channel and in-place matmul pieces); bf16; bad S
shapes; the pass on zoo models, on shapes either side of its rule, in bf16, not for other targets, on a model
optimized before."""
import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conv_reference import rel_l2
from optimizer.passes.conv_scale import OP_TYPE, SCALE_OP, conv_scale
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.runtime import session_options
from optimizer.verify import verify
from tests.helpers import conv_inputs, cpu_flags, ops
from tests.test_conv_mean import SE_MODELS, _optimized
from tests.test_cpu_onednn import PARAMS, needs_onednn
from tests.test_cpu_winograd import TOL, _reference

BF16 = TensorProto.BFLOAT16


def _model(shape, attrs, w, b, *, scales, elem=TensorProto.FLOAT, merged=True, w_input=False, name="proj"):
    """FusedConvScaled (or ChannelScale + FusedConv) of X [n, h, w, c] and S [scales, 1, 1, c]; W a graph
    input where `w_input`. bf16: the ops' tensors in bfloat16, the graph's float (Casts: ORT's Python API
    takes no bfloat16 arrays)."""
    n, h, wd, c, k, r, s = shape
    bf16 = elem == BF16
    dtype = ml_dtypes.bfloat16 if bf16 else np.float32
    inits = [helper.make_tensor("b", elem, [k], b.astype(dtype).tobytes(), raw=True)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, h, wd, c]),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, [scales, 1, 1, c])]
    if w_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    else:
        inits.append(helper.make_tensor("w", elem, list(w.shape), w.astype(dtype).tobytes(), raw=True))
    data = ["x", "s"] + (["w"] if w_input else [])
    if attrs.get("residual", "none") != "none":
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        data.append("z")
    nodes, cast = [], {}
    for t in data:  # the float inputs as the op's type (a float W input too)
        cast[t] = f"{t}_low" if bf16 else t
        if bf16:
            nodes.append(helper.make_node("Cast", [t], [cast[t]], to=BF16))
    conv_in = [cast["x"], cast.get("w", "w"), "b"]
    z = [cast["z"]] if "z" in cast else []
    out = "y_low" if bf16 else "y"
    attrs = {key: list(v) if isinstance(v, tuple) else v for key, v in attrs.items()}
    if merged:
        nodes.append(helper.make_node(OP_TYPE, [*conv_in, cast["s"], *z], [out], name=name, domain="epifuse", **attrs))
    else:
        nodes += [helper.make_node(SCALE_OP, [cast["x"], cast["s"]], ["gated"], domain="epifuse"),
                  helper.make_node("FusedConv", ["gated", *conv_in[1:], *z], [out], name=name, domain="epifuse",
                                   **attrs)]
    if bf16:
        nodes.append(helper.make_node("Cast", [out], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def _case(shape, attrs, per_image, seed=0):
    x, w, b, z = conv_inputs(np.float32, shape, seed=seed, **attrs)
    n, c = shape[0], shape[3]
    s = np.random.default_rng(seed + 1).uniform(0.05, 1.0, (n if per_image else 1, 1, 1, c)).astype(np.float32)
    return x, w, b, z, s


def _check(shape, attrs, *, per_image, w_input=False, tol=TOL):
    x, w, b, z, s = _case(shape, attrs, per_image)
    feeds = {"x": x, "s": s, "w": w, "z": z}
    y = _run(_model(shape, attrs, w, b, scales=s.shape[0], w_input=w_input), feeds)
    assert rel_l2(y, _reference(x * s.astype(np.float64), w, b, z, **attrs)) <= tol
    two = _run(_model(shape, attrs, w, b, scales=s.shape[0], w_input=w_input, merged=False), feeds)
    assert rel_l2(y, two) <= tol
    return y


# (N, H, W, C, K, R, S), attributes: squeeze-excite projections as MobileNetV3 and EfficientNet have them, and
# each way oneDNN cuts the work and lays out the filters; where the filters outweigh the map, X is scaled.
GEOMETRY = {
    # a 28x28 projection: blocks of 32 output channels of which 8 are padding
    "projection_28x28_padded_blocks": ((1, 28, 28, 120, 40, 1, 1), dict(activation="identity", residual="post")),
    "projection_14x14_pixel_pieces": ((1, 14, 14, 672, 112, 1, 1), dict(activation="identity", residual="post")),
    "projection_7x7_filters_outweigh_the_map": ((1, 7, 7, 960, 160, 1, 1), dict(activation="identity")),
    # uneven output-channel pieces: each piece's filters are a chunk from its first output channel on
    "channel_pieces_uneven": ((1, 1, 1, 960, 240, 1, 1), dict(activation="relu")),
    "channel_pieces_filters_larger_than_input": ((1, 7, 7, 384, 500, 1, 1), dict(activation="gelu", residual="post")),
    # matmuls writing strided rows of y in place: filters in a 2-D layout
    "in_place_pieces": ((1, 14, 14, 448, 600, 1, 1), dict(activation="relu", residual="pre")),
    "dense_3x3_stride2": ((2, 15, 15, 24, 40, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1), activation="silu")),
    "grouped": ((2, 14, 14, 32, 64, 3, 3), dict(group=4, pads=(1, 1, 1, 1), activation="hardswish")),
    "batch_of_three": ((3, 10, 10, 64, 48, 1, 1), dict(activation="hardsigmoid", activation_params=(0.2, 0.5),
                                                       residual="post")),
}


@needs_onednn
@pytest.mark.parametrize("per_image", [True, False], ids=["scale_per_image", "one_scale"])
@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_onednn_scales_its_reordered_filters_or_the_input(name, per_image, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "onednn")
    shape, attrs = GEOMETRY[name]
    _check(shape, attrs, per_image=per_image)


@needs_onednn
@pytest.mark.parametrize("residual", ["none", "pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "leaky_relu", "clip", "hardswish", "silu", "gelu", "mish", "tanh"])
def test_every_epilogue_after_the_scaled_conv(activation, residual):
    attrs = dict(activation=activation, residual=residual)
    if activation in PARAMS:
        attrs["activation_params"] = PARAMS[activation]
    _check((2, 9, 11, 72, 40, 1, 1), attrs, per_image=True)


@needs_onednn
def test_constant_filters_serve_every_run_with_new_scales(monkeypatch):
    """The filters are reordered once and scaled afresh on each run: a second run with other scales and
    images, of another batch size, answers for its own scales."""
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", "onednn")
    shape, attrs = (2, 14, 14, 96, 40, 1, 1), dict(activation="relu", residual="post")
    _, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    session = ort.InferenceSession(_model(shape, attrs, w, b, scales=None).SerializeToString(), session_options(),
                                   providers=["CPUExecutionProvider"])
    for n, seed in ((2, 1), (1, 2), (3, 3)):
        x, _, _, z, s = _case((n, *shape[1:]), attrs, per_image=True, seed=seed)
        y = session.run(None, {"x": x, "s": s, "z": z})[0]
        assert rel_l2(y, _reference(x * s.astype(np.float64), w, b, z, **attrs)) <= TOL


@pytest.mark.parametrize("kernel", ["reference", "auto"])
def test_filters_that_are_a_graph_input_are_scaled_plain(kernel, monkeypatch):
    """Not constant: oneDNN keeps no reordered copy to scale; the plain filters are scaled on each run."""
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)
    _check((2, 12, 12, 48, 32, 1, 1), dict(activation="silu", residual="post"), per_image=True, w_input=True)


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the direct kernels need AVX2 and FMA")
@pytest.mark.parametrize("kernel, shape, attrs", [
    # filters smaller than the map: plain scaled filters (a depthwise conv reading a gate)
    ("depthwise", (2, 13, 13, 48, 48, 3, 3), dict(group=48, pads=(1, 1, 1, 1), activation="relu")),
    # a 1x1 on two pixels, its filters many times the map: X scaled into a buffer
    ("gemv", (2, 1, 2, 256, 320, 1, 1), dict(activation="hardswish", residual="post")),
    ("winograd", (1, 12, 12, 32, 48, 3, 3), dict(pads=(1, 1, 1, 1), activation="silu")),
], ids=["depthwise", "gemv", "winograd"])
def test_direct_kernels_take_plain_scaled_filters_or_a_scaled_input(kernel, shape, attrs, monkeypatch):
    monkeypatch.setenv("EPIFUSE_CPU_KERNEL", kernel)
    _check(shape, attrs, per_image=True)


@needs_onednn
@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags(), reason="bf16 needs AVX-512 with BW and VL")
@pytest.mark.parametrize("name", ["projection_28x28_padded_blocks", "channel_pieces_uneven", "in_place_pieces"])
def test_bf16_as_the_two_nodes_within_bf16_rounding(name, monkeypatch):
    """bf16 filters (oneDNN's layouts interleave pairs of input channels) scaled in fp32 and rounded once, where
    the two nodes round the gated X once: both within bf16's tolerance of float64 on the scaled input."""
    monkeypatch.delenv("EPIFUSE_CPU_ISA", raising=False)
    shape, attrs = GEOMETRY[name]
    x, w, b, z, s = (None if a is None else a.astype(ml_dtypes.bfloat16).astype(np.float32)
                     for a in _case(shape, attrs, per_image=True))
    feeds = {"x": x, "s": s, "z": z}
    y = _run(_model(shape, attrs, w, b, scales=1, elem=BF16), feeds)
    expected = _reference(x * s.astype(np.float64), w, b, z, **attrs)
    assert rel_l2(y, expected) <= 1.6e-2
    assert rel_l2(_run(_model(shape, attrs, w, b, scales=1, elem=BF16, merged=False), feeds), expected) <= 1.6e-2


@pytest.mark.parametrize("scales", [[1, 1, 1, 24], [1, 1, 2, 48], [3, 1, 1, 48], [1, 48]], ids=str)
def test_a_bad_scale_shape_is_an_error_naming_the_node(scales):
    shape, attrs = (2, 6, 6, 48, 16, 1, 1), dict(activation="relu")
    x, w, b, _ = conv_inputs(np.float32, shape, **attrs)
    model = _model(shape, attrs, w, b, scales=None, name="the_projection")
    model.graph.input[1].type.tensor_type.ClearField("shape")
    with pytest.raises(Exception, match=rf"epifuse::{OP_TYPE} node 'the_projection'.*S must be \[N or 1, 1, 1, C\]"):
        _run(model, {"x": x, "s": np.ones(scales, np.float32)})


def _gate_and_conv(h, c, k):
    """ChannelScale of X [1, h, h, c] read by a 1x1 FusedConv of k filters, as a graph for the pass."""
    x = gs.Variable("x", np.float32, [1, h, h, c])
    s = gs.Variable("s", np.float32, [1, 1, 1, c])
    gated, y = gs.Variable("gated", np.float32, [1, h, h, c]), gs.Variable("y", np.float32, [1, h, h, k])
    w = gs.Constant("w", np.zeros((k, 1, 1, c), np.float32))
    b = gs.Constant("b", np.zeros(k, np.float32))
    nodes = [gs.Node(SCALE_OP, "gate", {}, [x, s], [gated], domain="epifuse"),
             gs.Node("FusedConv", "proj", {"activation": "identity"}, [gated, w, b], [y], domain="epifuse")]
    return gs.Graph(nodes=nodes, inputs=[x, s], outputs=[y], opset=17)


@pytest.mark.parametrize("h, c, k, merges", [(28, 120, 40, True), (14, 672, 112, True), (14, 64, 196, True),
                                             (14, 64, 197, False), (7, 960, 160, False)])
def test_the_gate_merges_where_the_filters_are_no_larger_than_the_map(h, c, k, merges):
    graph = conv_scale(_gate_and_conv(h, c, k), Report(), "ort-cpu", "fp32")
    assert [n.op for n in graph.nodes] == ([OP_TYPE] if merges else [SCALE_OP, "FusedConv"])
    if merges:
        assert [t.name for t in graph.nodes[0].inputs] == ["x", "w", "b", "s"]


@pytest.mark.parametrize("name", SE_MODELS)
def test_squeeze_excite_gates_merge_into_the_convs_that_read_them(name):
    original, optimized, report = _optimized(name)
    merged = ops(optimized).count(OP_TYPE)
    assert merged and report.canonicalized[f"{SCALE_OP} + FusedConv → epifuse::{OP_TYPE} (ort-cpu)"] == merged
    consumers = {}
    for node in optimized.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node.op_type)
    for node in optimized.graph.node:  # no gate is left for a FusedConv alone to read
        if node.op_type == SCALE_OP:
            assert consumers.get(node.output[0]) != ["FusedConv"]
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result


def test_bf16_models_merge_too():
    original, optimized, _ = _optimized("efficientnet_tiny", precision="bf16")
    assert OP_TYPE in ops(optimized)
    result = verify(original, optimized, precision="bf16")
    assert result["passed"], result


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_product_and_a_model_optimized_before_splits_again(target):
    """Other targets never get the op (the library's CPU kernels alone run it); a model optimized for
    ort-cpu, optimized again for another target, has it written back as a Mul and a FusedConv."""
    assert OP_TYPE not in ops(_optimized("mobilenetv3_tiny", target=target)[1])
    original, for_cpu, _ = _optimized("mobilenetv3_tiny")
    again, report = optimize_model(for_cpu, precision="fp32", target=target, policy=FusionPolicy(mode="static"))
    assert OP_TYPE not in ops(again) and SCALE_OP not in ops(again) and "Mul" in ops(again)
    assert report.canonicalized[f"epifuse::{OP_TYPE} → {SCALE_OP} + FusedConv"] == ops(for_cpu).count(OP_TYPE)


def test_a_model_optimized_before_optimizes_again_for_the_cpu_with_the_same_answer():
    original, for_cpu, _ = _optimized("mobilenetv3_tiny")
    again, _ = optimize_model(for_cpu, precision="fp32", target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert ops(again).count(OP_TYPE) == ops(for_cpu).count(OP_TYPE)
    result = verify(original, again, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] <= TOL, result
