"""Split → Convs → Concat (timm's MixedConv2d) as one FusedConv on merged filters: the merged forms compute
what the parts do (ONNX Runtime on both, no epifuse kernel involved); a BN on the Concat folds into the
parts; the fuse pass merges only where measured faster than the runtime running the nodes, in the
fastest form, and the optimized model computes what the original does (ORT's CPU EP on the original
against the library's CPU kernel). Times come from a fake timer: these tests check the decisions and the
rewrite, not this machine's speed."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import contract
from optimizer.passes.fold_batchnorm import fold_batchnorm
from optimizer.passes.fuse_conv import SPLIT_REWRITE, ConvParams, _conv_params
from optimizer.passes.split_convs import find_split_convs, merged_forms
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.verify import verify
from tests.helpers import conv_net, feeds_for, gs_graph, rel_l2, run_pass
from tests.test_decide import FakeTimer, _optimize

MIXED = {  # kind -> [(in channels, out channels, kernel, group) per part]
    "halves": [(24, 20, 1, 1), (24, 20, 1, 1)],
    "halves_square": [(24, 24, 1, 1), (24, 24, 1, 1)],  # as many channels out as in: a residual fits
    "unequal": [(28, 16, 1, 1), (20, 24, 1, 1)],
    "depthwise": [(16, 16, 3, 16), (16, 16, 5, 16), (16, 16, 7, 16)],
    "depthwise_equal": [(24, 24, 3, 24), (24, 24, 3, 24)],
}


def _mixed(kind="halves", stride=1, residual=False, batch=1, activation="Relu", opset=17):
    """1x1 conv (a) → Split → a Conv per part (with a bias) → Concat → BN → activation [→ Add] → 1x1 conv
    (b). The Split as `opset` writes it: sizes as an attribute (11, 12), an input (13-17), or (18, parts of
    one size) the `num_outputs` attribute."""
    parts = MIXED[kind]
    c_in, c_out = sum(p[0] for p in parts), sum(p[1] for p in parts)
    sizes = np.array([p[0] for p in parts], np.int64)

    def build(g, x):
        with g.scope("a"):
            x = g.op("Relu", [g.conv_bn(x, 8, c_in, 1)])
        with g.scope("mixed"):
            if opset < 13:
                pieces = g.op("Split", [x], num_outputs=len(parts), axis=1, split=sizes.tolist())
            elif opset >= 18 and len(set(sizes.tolist())) == 1:
                pieces = g.op("Split", [x], num_outputs=len(parts), axis=-3)
                g._nodes[-1].attribute.append(helper.make_attribute("num_outputs", len(parts)))
            else:
                pieces = g.op("Split", [x, g.constant(sizes, np.int64)], num_outputs=len(parts), axis=1)
            ys = []
            for i, (piece, (ci, co, k, group)) in enumerate(zip(pieces, parts)):
                with g.scope(f"part{i}"):
                    ys.append(g.conv(piece, ci, co, k, group=group, stride=stride, bias=True))
            y = g.batch_norm(g.op("Concat", ys, axis=1), c_out)
            y = g.op("Mul", [y, g.op("Sigmoid", [y])]) if activation == "SiLU" else g.op(activation, [y])
            if residual:
                y = g.op("Add", [y, x])
        with g.scope("b"):
            return g.op("Relu", [g.conv_bn(y, c_out, 16, 1)])

    model = onnx.shape_inference.infer_shapes(conv_net(build, batch=batch, opset=opset))
    split = next(n.name for n in model.graph.node if n.op_type == "Split")
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    return model, split, convs[0], convs[-1], convs[1:-1]


def _times(split, a, b, parts, forms: dict, part=(5.0, 6.0)):
    return {a: (5.0, 10.0), b: (5.0, 10.0), **{p: part for p in parts},
            **{f"{split}_{form}": t for form, t in forms.items()}}


def _fused(optimized):
    return [n for n in optimized.graph.node if n.op_type == contract.OP_TYPE]


def _run_conv(form_fields, x):
    """A conv of these fields as a plain ONNX Conv, run by ORT's CPU EP."""
    w, b = form_fields["weight"], form_fields["bias"]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=form_fields["group"], strides=form_fields["strides"],
                            pads=form_fields["pads"], dilations=form_fields["dilations"])
    graph = helper.make_graph([node], "merged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", list(MIXED))
@pytest.mark.parametrize("stride", [1, 2])
def test_every_merged_form_computes_what_the_parts_do(kind, stride):
    model, *_ = _mixed(kind, stride)
    graph = gs_graph(model)
    (sc,) = find_split_convs(graph)
    parts = [_conv_params(c) for c in sc.convs]
    forms = merged_forms(parts)
    assert forms, kind
    x = np.random.default_rng(1).standard_normal(tuple(sc.split.inputs[0].shape)).astype(np.float32)
    pieces = np.split(x, np.cumsum([p.weight.shape[1] * p.group for p in parts])[:-1], axis=1)
    assert all(p.bias is not None and p.bias.any() for p in parts)
    expected = np.concatenate([_run_conv(dict(weight=p.weight, bias=p.bias, group=p.group, strides=p.strides,
                                              pads=p.pads, dilations=p.dilations), piece)
                               for p, piece in zip(parts, pieces)], axis=1)
    for form, fields, work in forms:
        got = _run_conv(fields, x)
        assert got.shape == expected.shape, form
        assert rel_l2(got, expected) < 1e-6, form
    names = [f for f, _, _ in forms]
    if kind in ("halves", "halves_square", "depthwise_equal"):
        assert forms[0][2] == 1.0 and names[0] in ("grouped", "depthwise")
    if kind == "unequal":
        assert names == ["dense"]
    if kind == "depthwise":
        assert names == ["depthwise"] and forms[0][2] == pytest.approx(3 * 49 / (9 + 25 + 49))


def test_asymmetric_pads_and_dilations_nest_where_every_part_keeps_its_output_positions():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 11, 13)).astype(np.float32)
    cases = [  # (kernel, pads top-left-bottom-right, dilation) per part
        [(3, [1, 0, 1, 2], 1), (5, [2, 1, 2, 3], 1)],  # offsets differ per side
        [(3, [2, 2, 2, 2], 2), (3, [2, 2, 2, 2], 2)],  # dilated, equal
    ]
    for case in cases:
        parts = [ConvParams(rng.standard_normal((4, 1, k, k)).astype(np.float32), rng.standard_normal(4).astype(np.float32),
                            4, [1, 1], pads, [d, d]) for k, pads, d in case]
        (form, fields, _), = merged_forms(parts)
        expected = np.concatenate([_run_conv(dict(weight=p.weight, bias=p.bias, group=4, strides=p.strides, pads=p.pads,
                                                  dilations=p.dilations), piece)
                                   for p, piece in zip(parts, np.split(x, 2, axis=1))], axis=1)
        assert form == "depthwise" and rel_l2(_run_conv(fields, x), expected) < 1e-6, case


def test_parts_that_do_not_nest_do_not_merge():
    w = np.ones((4, 1, 3, 3), np.float32)
    same = ConvParams(w, None, 4, [1, 1], [1, 1, 1, 1], [1, 1])
    assert merged_forms([same, ConvParams(w, None, 4, [2, 2], [1, 1, 1, 1], [1, 1])]) == []  # strides differ
    assert merged_forms([same, ConvParams(w, None, 4, [1, 1], [0, 0, 0, 0], [1, 1])]) == []  # output sizes differ
    dense = ConvParams(np.ones((4, 4, 1, 1), np.float32), None, 1, [1, 1], [0, 0, 0, 0], [1, 1])
    assert merged_forms([same, dense]) == []  # a depthwise part beside a dense one


def test_a_batchnorm_folds_through_a_concat_only_of_convs_read_by_it_alone():
    def build(g, x, *, extra_reader=False, pool=False):
        a = g.conv(x, 8, 8, 3, bias=True)
        b = g.op("MaxPool", [x], kernel_shape=[1, 1]) if pool else g.conv(x, 8, 8, 1)
        y = g.op("Relu", [g.batch_norm(g.op("Concat", [a, b], axis=1), 16)])
        return g.op("Add", [y, g.op("Concat", [a, a], axis=1)]) if extra_reader else y

    for kw in ({"extra_reader": True}, {"pool": True}):
        model = onnx.shape_inference.infer_shapes(conv_net(lambda g, x: build(g, x, **kw)))
        folded, report = run_pass(fold_batchnorm, model)
        assert report.bn_folded["Conv (through Concat)"] == 0 and report.bn_to_affine == 1, kw
        assert rel_l2(_run(folded), _run(model)) < 1e-6, kw


def _run(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds_for(model))[0]


def test_a_batchnorm_on_a_concat_of_convs_folds_into_them():
    model, *_ = _mixed("halves")
    folded, report = run_pass(fold_batchnorm, model)
    assert report.bn_folded["Conv (through Concat)"] == 1
    assert "BatchNormalization" not in [n.op_type for n in folded.graph.node] and report.bn_to_affine == 0
    assert report.activation_bytes_saved > 0
    assert rel_l2(_run(folded), _run(model)) < 1e-6


@pytest.mark.parametrize("kind, form", [("halves", "grouped"), ("halves", "dense"), ("unequal", "dense"),
                                        ("depthwise", "depthwise")])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_split_measured_faster_merged_fuses_once_with_the_same_result(tmp_path, kind, form, precision):
    model, split, a, b, parts = _mixed(kind, activation="SiLU")
    timer = FakeTimer(_times(split, a, b, parts, {"grouped": (30.0, 20.0), "dense": (30.0, 20.0), form: (4.0, 20.0)}
                             if form != "depthwise" else {form: (4.0, 20.0)}))
    optimized, report = _optimize(model, timer, precision=precision, tmp_path=tmp_path)
    assert report.canonicalized[SPLIT_REWRITE.format(form=form)] == 1
    decision = next(d for d in report.decisions if d.node == split)
    assert decision.fused and decision.ours_us == [4.0] and decision.pattern.startswith("Split+Conv+")
    assert not any(d.node in parts for d in report.decisions)  # merged: not decided one by one
    assert not {"Split", "Concat", "Sigmoid"} & {n.op_type for n in optimized.graph.node}
    assert len(_fused(optimized)) == 3
    result = verify(model, optimized, precision=precision)
    assert result["passed"], result


def test_the_fastest_measured_form_wins_and_a_residual_fuses_with_it(tmp_path):
    model, split, a, b, parts = _mixed("halves_square", residual=True)
    timer = FakeTimer(_times(split, a, b, parts, {"grouped": (9.0, 20.0), "dense": (4.0, 20.0)}))
    optimized, report = _optimize(model, timer, precision="fp32", tmp_path=tmp_path)
    assert report.canonicalized[SPLIT_REWRITE.format(form="dense")] == 1
    merged = next(n for n in _fused(optimized) if n.name.startswith(split))
    attrs = {x.name: helper.get_attribute_value(x) for x in merged.attribute}
    assert attrs["group"] == 1 and attrs["residual"] in (b"pre", b"post", "pre", "post")
    assert verify(model, optimized, precision="fp32")["passed"]


def test_a_merge_slower_than_the_runtime_leaves_the_parts_to_be_decided_alone(tmp_path):
    model, split, a, b, parts = _mixed("halves")
    timer = FakeTimer(_times(split, a, b, parts, {"grouped": (25.0, 20.0), "dense": (21.0, 20.0)}))
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    assert not any(k.startswith("Split →") for k in report.canonicalized if report.canonicalized[k])
    assert {d.node for d in report.decisions} >= set(parts)
    decision = next(d for d in report.decisions if d.node == split)  # a measured candidate, not fused
    assert not decision.fused and "split convs not merged" in decision.reason and decision.ours_us == [21.0]
    assert "Split" in {n.op_type for n in optimized.graph.node}
    assert verify(model, optimized, precision="fp16")["passed"]


def test_a_merge_must_be_faster_at_every_batch_size(tmp_path):
    model, split, a, b, parts = _mixed("halves", batch="N")
    slow_at_16 = lambda n: (4.0, 20.0) if n == 1 else (50.0, 40.0)  # noqa: E731
    timer = FakeTimer(_times(split, a, b, parts, {"grouped": slow_at_16, "dense": slow_at_16}))
    _, report = _optimize(model, timer, tmp_path=tmp_path, batches=(1, 16))
    assert not any(d.node == split and d.fused for d in report.decisions)


def test_fuse_always_merges_in_the_form_of_least_work():
    for kind, group in (("halves", 2), ("depthwise_equal", 48), ("unequal", 1), ("depthwise", 48)):
        model, split, *_ = _mixed(kind)
        optimized, report = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="always"))
        assert "Split" not in {n.op_type for n in optimized.graph.node}, kind
        merged = next(n for n in _fused(optimized) if n.name.startswith(split))
        assert next(a.i for a in merged.attribute if a.name == "group") == group, kind
        assert verify(model, optimized, precision="fp16")["passed"], kind


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_every_way_of_writing_the_split_merges_with_the_same_result(tmp_path, opset):
    model, split, a, b, parts = _mixed("halves", opset=opset)
    optimized, report = _optimize(model, FakeTimer(_times(split, a, b, parts, {"grouped": (4.0, 20.0),
                                                                                "dense": (9.0, 20.0)})),
                                  precision="fp32", tmp_path=tmp_path)
    assert report.canonicalized[SPLIT_REWRITE.format(form="grouped")] == 1, opset
    assert verify(model, optimized, precision="fp32")["passed"]


def test_a_group_the_whole_model_check_left_out_leaves_its_convs_to_the_runtime(tmp_path):
    model, split, a, b, parts = _mixed("halves")
    timer = FakeTimer(_times(split, a, b, parts, {"grouped": (4.0, 20.0), "dense": (9.0, 20.0)}, part=(1.0, 20.0)))
    optimized, report = _optimize(model, timer, tmp_path=tmp_path, exclude=frozenset({split}))
    fused = {n.name for n in _fused(optimized)}
    assert "Split" in {n.op_type for n in optimized.graph.node}
    assert not any(name.startswith((split, *parts)) for name in fused), fused
    # a part left out keeps the group from merging; the other part is decided alone
    optimized, report = _optimize(model, timer, tmp_path=tmp_path, exclude=frozenset({parts[0]}))
    fused = {n.name for n in _fused(optimized)}
    assert not any(name.startswith((split, parts[0])) for name in fused) and any(n.startswith(parts[1]) for n in fused)


def test_the_static_policy_never_merges():
    model, *_ = _mixed("halves")
    optimized, report = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="static"))
    assert "Split" in {n.op_type for n in optimized.graph.node}


@pytest.mark.parametrize("kind, opset", [("halves", 11), ("unequal", 13), ("depthwise", 17), ("halves", 18)])
def test_the_micro_models_a_split_is_timed_on_compute_the_group(tmp_path, kind, opset):
    """What the real timers run (optimizer.measure): the original Split, Convs and Concat (the Split in
    the micro-model's opset whatever the model's) against the merged FusedConv, each form."""
    from tests.test_measure import _Capture
    from tests.test_measure import _run as run_model

    model, *_ = _mixed(kind, opset=opset)
    capture = _Capture()
    optimize_model(model, target="ort-cuda", precision="fp32",
                   policy=FusionPolicy(mode="auto", timer=capture, cache_path=str(tmp_path / "c.json")))
    groups = [g for g in capture.groups if g.pattern.startswith("Split")]
    assert groups and all("(as " in g.pattern and " of " in g.pattern for g in groups)
    for group in groups:
        x = np.random.default_rng(1).standard_normal(group.x_shape).astype(np.float32)
        reference = run_model(group.models["runtime"], {"x": x})[0]
        got = run_model(group.models["fused x2"], {"x": np.ascontiguousarray(x.transpose(0, 2, 3, 1))})[0]
        assert rel_l2(got.transpose(0, 3, 1, 2), reference) < 1e-5, group.pattern


def test_groups_that_merge_into_one_conv_are_timed_apart_when_their_parts_differ():
    """The costs key names the parts: 3/5/7 and 7/7/7 depthwise mixes merge into the same 7x7 conv, but
    the runtime runs different convs for them."""
    from optimizer.passes.split_convs import signature

    w = lambda k: np.ones((4, 1, k, k), np.float32)  # noqa: E731
    mixed = [ConvParams(w(k), None, 4, [1, 1], [k // 2] * 4, [1, 1]) for k in (3, 5, 7)]
    equal = [ConvParams(w(7), None, 4, [1, 1], [3] * 4, [1, 1]) for _ in range(3)]
    assert merged_forms(mixed)[0][1]["weight"].shape == merged_forms(equal)[0][1]["weight"].shape
    assert signature(mixed) != signature(equal)
