"""A grouped conv of few groups fused as one dense conv on block-diagonal filters (ort-cuda): only where
measured faster than both the runtime's grouped conv and our grouped kernel, never unmeasured, never for
many groups or depthwise convs; and the dense model computes what the original does (ORT's CPU EP on the
original against the library's CPU kernel). Times come from a fake timer: these tests check the
decision and the rewrite, not this machine's speed."""
import numpy as np
import onnx
import pytest

from optimizer import contract
from optimizer.passes.fuse_conv import DENSE_REWRITE, MAX_DENSE_GROUPS, block_diagonal
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.verify import verify
from tests.helpers import conv_net
from tests.test_decide import FakeTimer, _optimize


def _grouped(channels=48, group=2, batch=1):
    """1x1 conv → grouped 3x3 conv (BN, Relu) → 1x1 conv, the grouped one as RegNet writes it."""
    def build(g, x):
        with g.scope("a"):
            x = g.op("Relu", [g.conv_bn(x, 8, channels, 1)])
        with g.scope("grouped"):
            x = g.op("Relu", [g.conv_bn(x, channels, channels, 3, group=group)])
        with g.scope("b"):
            return g.op("Relu", [g.conv_bn(x, channels, 16, 1)])

    model = onnx.shape_inference.infer_shapes(conv_net(build, batch=batch))
    a, grouped, b = [n.name for n in model.graph.node if n.op_type == "Conv"]
    return model, a, grouped, b


def _fused_group_of(optimized, name):
    node = next(n for n in optimized.graph.node if n.op_type == contract.OP_TYPE and n.name.startswith(name))
    return next(a.i for a in node.attribute if a.name == "group")


def test_block_diagonal_puts_each_groups_filters_on_its_own_input_channels():
    w = np.arange(6 * 2 * 1 * 1, dtype=np.float32).reshape(6, 2, 1, 1) + 1  # 3 groups: 2 in, 2 out each
    dense = block_diagonal(w, 3)
    assert dense.shape == (6, 6, 1, 1)
    for k in range(6):
        g = k // 2
        assert np.array_equal(dense[k, 2 * g:2 * g + 2], w[k])
        assert not np.delete(dense[k], [2 * g, 2 * g + 1], axis=0).any()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_grouped_conv_measured_faster_dense_fuses_dense_with_the_same_result(tmp_path, precision):
    model, a, grouped, b = _grouped()
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (30.0, 20.0), f"{grouped}_dense": (8.0, 20.0)})
    optimized, report = _optimize(model, timer, precision=precision, tmp_path=tmp_path)
    assert report.canonicalized[DENSE_REWRITE] == 1
    decision = next(d for d in report.decisions if d.node == grouped)
    assert decision.fused and decision.ours_us == [8.0] and "dense" in decision.reason
    assert _fused_group_of(optimized, grouped) == 1
    result = verify(model, optimized, precision=precision)
    assert result["passed"], result


def test_our_grouped_kernel_is_kept_where_it_beats_the_dense_conv(tmp_path):
    model, a, grouped, b = _grouped()
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (6.0, 20.0), f"{grouped}_dense": (8.0, 20.0)})
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    assert report.canonicalized[DENSE_REWRITE] == 0
    assert _fused_group_of(optimized, grouped) == 2


def test_dense_must_be_faster_at_every_batch_size(tmp_path):
    model, a, grouped, b = _grouped(batch="N")
    dense = lambda n: (8.0, 20.0) if n == 1 else (50.0, 40.0)  # noqa: E731 (loses at batch 16)
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (30.0, 20.0), f"{grouped}_dense": dense})
    _, report = _optimize(model, timer, tmp_path=tmp_path, batches=(1, 16))
    assert report.canonicalized[DENSE_REWRITE] == 0
    assert not next(d for d in report.decisions if d.node == grouped).fused


def test_a_dense_conv_slower_than_the_runtime_leaves_the_grouped_conv_to_it(tmp_path):
    model, a, grouped, b = _grouped()
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (30.0, 20.0), f"{grouped}_dense": (25.0, 20.0)})
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    assert report.canonicalized[DENSE_REWRITE] == 0
    assert not next(d for d in report.decisions if d.node == grouped).fused
    conv = next(n for n in optimized.graph.node if n.op_type == "Conv")
    assert next(a.i for a in conv.attribute if a.name == "group") == 2


@pytest.mark.parametrize("channels, group", [(64, MAX_DENSE_GROUPS * 2), (48, 48)])
def test_many_groups_and_depthwise_convs_are_never_tried_dense(tmp_path, channels, group):
    model, a, grouped, b = _grouped(channels, group)
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (30.0, 20.0), f"{grouped}_dense": (1.0, 20.0)})
    _, report = _optimize(model, timer, tmp_path=tmp_path)
    assert f"{grouped}_dense" not in {name for name, _ in timer.calls}
    assert report.canonicalized[DENSE_REWRITE] == 0


@pytest.mark.parametrize("mode", ["static", "always"])
def test_unmeasured_policies_keep_grouped_convs_grouped(mode):
    model, _, grouped, _ = _grouped()
    optimized, report = optimize_model(model, target="ort-cuda", policy=FusionPolicy(mode=mode))
    assert report.canonicalized[DENSE_REWRITE] == 0
    fused = [n for n in optimized.graph.node if n.op_type == contract.OP_TYPE and n.name.startswith(grouped)]
    assert all(next(a.i for a in n.attribute if a.name == "group") == 2 for n in fused)


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_other_targets_never_try_dense(tmp_path, target):
    model, a, grouped, b = _grouped()
    timer = FakeTimer({a: (5.0, 10.0), b: (5.0, 10.0), grouped: (30.0, 20.0), f"{grouped}_dense": (1.0, 20.0)})
    _, report = _optimize(model, timer, target=target, precision="fp32", tmp_path=tmp_path)
    assert f"{grouped}_dense" not in {name for name, _ in timer.calls}
