"""The cost decision (optimizer.decide): which candidates fuse given their times, per region, within a
measuring budget, and by the static policy where nothing is known. The times come from a fake timer
and the budget runs on a fake clock: these tests check the decisions, not this machine's speed."""
from collections import Counter

import numpy as np
import onnx
import pytest

from models import activations as act
from optimizer import contract, pipeline
from optimizer.costs import CostTable
from optimizer.decide import FUSE_MARGIN, Decider, static_verdict
from optimizer.errors import EpifuseError
from optimizer.pipeline import FusionPolicy, optimize_file, optimize_model
from tests.helpers import conv_net, feeds_for, run_ort


class FakeTimer:
    """Times by conv name: `times[name] = (ours_us, runtime_us)` or a function of the batch size."""

    device, library = "fake accelerator", "fake runtime 1.0"

    def __init__(self, times: dict, transpose_us: float = 0.0, clock=None, seconds_per_call: float = 0.0):
        self.times, self.transpose_us = times, transpose_us
        self.clock, self.seconds_per_call = clock, seconds_per_call
        self.calls: list[tuple[str, int]] = []

    def group_times(self, group):
        self.calls.append((group.name, group.desc.N))
        if self.clock is not None:
            self.clock.advance(self.seconds_per_call)
        t = self.times[group.name]
        t = t(group.desc.N) if callable(t) else t
        return t.pop(0) if isinstance(t, list) else t  # a list: one reading per call

    def transpose_times(self, shape, dtype):
        return self.transpose_us


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def _chain(n_convs: int, *, pool_between: bool = False, batch=1):
    """Conv → BN → Relu, `n_convs` times (a MaxPool between them splits the NHWC region); convs c0, c1, …
    each with its own width, so each is its own problem (equal problems share their times)."""
    def build(g, x):
        for i in range(n_convs):
            with g.scope(f"c{i}"):
                x = g.op("Relu", [g.conv_bn(x, 8 * max(i, 1), 8 * (i + 1), 3)])
            if pool_between and i < n_convs - 1:
                x = g.op("MaxPool", [x], kernel_shape=[1, 1])
        return x

    model = onnx.shape_inference.infer_shapes(conv_net(build, batch=batch))
    names = [n.name for n in model.graph.node if n.op_type == "Conv"]
    return model, names


def _optimize(model, timer, *, target="ort-cuda", precision="fp16", tmp_path, **policy):
    if target == "ort-cpu":  # one check run per batch size: the one-thread run has tests of its own
        policy.setdefault("threads", 2)
    policy = FusionPolicy(mode="auto", timer=timer, cache_path=str(tmp_path / "cache.json"), **policy)
    return optimize_model(model, target=target, precision=precision, policy=policy)


def _fused_convs(report):
    return [d.node for d in report.decisions if d.fused]


def test_fuses_only_the_candidates_measured_faster(tmp_path):
    model, (a, b) = _chain(2, pool_between=True)
    timer = FakeTimer({a: (10.0, 20.0), b: (30.0, 20.0)})
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    assert _fused_convs(report) == [a]
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == 1
    by_node = {d.node: d for d in report.decisions}
    assert by_node[a].ours_us == [10.0] and by_node[a].runtime_us == [20.0] and by_node[a].reason == "faster"
    assert by_node[b].ours_us == [30.0] and not by_node[b].fused and by_node[b].reason == "slower"
    assert by_node[a].pattern == "Conv+Relu" and by_node[a].batches == [1]
    assert "measured (fake accelerator)" in by_node[a].source


@pytest.mark.parametrize("ratio, fused", [(1.01, False), (0.99, True)])
def test_a_candidate_fuses_only_when_faster_by_the_margin(tmp_path, ratio, fused):
    model, (a,) = _chain(1)
    _, report = _optimize(model, FakeTimer({a: (FUSE_MARGIN * 20.0 * ratio, 20.0)}), tmp_path=tmp_path)
    assert _fused_convs(report) == ([a] if fused else [])


def test_a_symbolic_batch_fuses_only_where_faster_at_every_batch_asked_for(tmp_path):
    model, (a, b) = _chain(2, pool_between=True, batch="N")
    timer = FakeTimer({a: lambda n: (10.0, 20.0) if n == 1 else (300.0, 200.0), b: (10.0 * 1, 20.0)})
    _, report = _optimize(model, timer, tmp_path=tmp_path, batches=(1, 16))
    assert _fused_convs(report) == [b]
    assert sorted(set(timer.calls)) == [(a, 1), (a, 16), (b, 1), (b, 16)]
    assert {d.node: d.batches for d in report.decisions}[a] == [1, 16]


def test_a_static_batch_is_decided_at_its_own_size(tmp_path):
    model, (a,) = _chain(1, batch=3)
    timer = FakeTimer({a: (10.0, 20.0)})
    _optimize(model, timer, tmp_path=tmp_path, batches=(1, 16))
    assert set(timer.calls) == {(a, 3)}


def test_region_keeps_a_slightly_slower_conv_fused_between_two_fast_ones(tmp_path):
    model, (a, b, c) = _chain(3)
    times = {a: (10.0, 30.0), b: (21.0, 20.0), c: (10.0, 30.0)}
    _, alone = _optimize(model, FakeTimer(times, transpose_us=0.0), tmp_path=tmp_path)
    assert _fused_convs(alone) == [a, c]  # Transposes free: the local choices stand
    _, region = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(
        mode="auto", timer=FakeTimer(times, transpose_us=5.0), cache_path=str(tmp_path / "r.json")))
    assert _fused_convs(region) == [a, b, c]
    reason = {d.node: d.reason for d in region.decisions}[b]
    assert reason.startswith("slower alone; region:") and "saved by fusing it" in reason


def test_region_leaves_an_isolated_small_win_when_its_transposes_cost_more(tmp_path):
    model, (a,) = _chain(1)
    _, report = _optimize(model, FakeTimer({a: (10.0, 12.0)}, transpose_us=3.0), tmp_path=tmp_path)
    assert _fused_convs(report) == []
    assert report.decisions[0].reason == "faster alone; region: 6.0 µs of Transposes saved by not fusing it at batch 1"


def test_region_reason_names_the_transposes_of_every_batch_size(tmp_path):
    model, (a,) = _chain(1, batch="N")
    timer = FakeTimer({a: (10.0, 12.0)})
    timer.transpose_times = lambda shape, dtype: 0.5 * shape[0]  # a Transpose's time grows with the batch
    _, report = _optimize(model, timer, tmp_path=tmp_path, batches=(4, 16))
    assert _fused_convs(report) == []
    assert report.decisions[0].reason == ("faster alone; region: 4.0 / 16.0 µs of Transposes saved by not fusing "
                                          "it at batch 4 / 16")


def test_region_counts_the_models_own_transposes_that_a_fusion_cancels(tmp_path):
    """ConvNeXt's block: conv, then the exporter's permute to NHWC for a channels-last op (here a MatMul)
    and back. Fused, the conv's NHWC output cancels that permute: one Transpose added (its input), one
    of the model's removed, so the small win stands where an island conv's two Transposes would eat it."""
    def build(g, x):
        with g.scope("c0"):
            y = g.op("Relu", [g.conv_bn(x, 8, 8, 3)])
        nhwc = g.op("Transpose", [y], perm=[0, 2, 3, 1])
        mixed = g.op("MatMul", [nhwc, g.weight("mix", np.eye(8, dtype=np.float32))])
        return g.op("Transpose", [mixed], perm=[0, 3, 1, 2])

    model = onnx.shape_inference.infer_shapes(conv_net(build))
    (a,) = [n.name for n in model.graph.node if n.op_type == "Conv"]
    optimized, report = _optimize(model, FakeTimer({a: (10.0, 12.0)}, transpose_us=3.0), tmp_path=tmp_path)
    assert _fused_convs(report) == [a] and report.decisions[0].reason == "faster"
    # the layout pass did cancel them: the model's closing Transpose remains (the input's is a graph
    # input's, converted by its own op)
    assert [n.op_type for n in optimized.graph.node].count("Transpose") == 1


def test_region_follows_the_models_permutes_through_a_residual_add(tmp_path):
    """ConvNeXt-style blocks: dwconv → permute to NHWC → MatMul → permute back → Add(block input). With
    the convs fused the layout pass moves the permutes back through the Adds and 6 model Transposes go
    (2 left: the graph input's and output's); each conv alone is within the 5% margin (10.0 vs 10.5 µs),
    so only the region's Transposes make fusing them worth it."""
    def build(g, x):
        with g.scope("stem"):
            y = g.conv(x, 8, 8, 3, bias=True)
        for b in range(3):
            with g.scope(f"b{b}"):
                d = g.conv(y, 8, 8, 3, group=8, bias=True)
            mixed = g.op("MatMul", [g.op("Transpose", [d], perm=[0, 2, 3, 1]),
                                    g.weight(f"mix{b}", np.eye(8, dtype=np.float32))])
            y = g.op("Add", [g.op("Transpose", [mixed], perm=[0, 3, 1, 2]), y])
        return y

    model = onnx.shape_inference.infer_shapes(conv_net(build))
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    optimized, report = _optimize(model, FakeTimer({c: (10.0, 10.5) for c in convs}, transpose_us=3.0),
                                  tmp_path=tmp_path)
    assert _fused_convs(report) == convs
    assert all(d.reason.startswith("slower alone; region:") for d in report.decisions)
    assert [n.op_type for n in optimized.graph.node].count("Transpose") == 1  # the output's (the input has its op)


def _conv_then_pool(size):
    """conv → Relu → GlobalAveragePool over a size x size map: the model and the conv's and pool's names."""
    def build(g, x):
        with g.scope("c0"):
            y = g.op("Relu", [g.conv_bn(x, 8, 16, 3)])
        return g.op("GlobalAveragePool", [y])

    model = onnx.shape_inference.infer_shapes(conv_net(build, size=size))
    (conv,) = [n.name for n in model.graph.node if n.op_type == "Conv"]
    pool = next(n.name for n in model.graph.node if n.op_type == "GlobalAveragePool")
    return model, conv, pool


@pytest.mark.parametrize("conv_fuses", [True, False])
def test_a_small_pool_is_weighed_in_the_layout_it_will_sit_in(tmp_path, conv_fuses):
    """conv → Relu → 7x7 GlobalAveragePool on ort-cuda: after a fused conv the pool reads an NHWC tensor
    and is weighed against its unfused NHWC form (here 15 µs: ours 3 fuses); after a conv left to the
    runtime it reads NCHW and stays ORT's pool, unmeasured (a FusedConv would need the input transposed)."""
    model, conv, pool = _conv_then_pool(size=7)
    timer = FakeTimer({conv: (10.0, 20.0) if conv_fuses else (30.0, 20.0), f"{pool}_depthwise": (3.0, 15.0)})
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    decisions = {d.node: d for d in report.decisions}
    if conv_fuses:
        assert list(dict.fromkeys(c[0] for c in timer.calls)) == [conv, f"{pool}_depthwise"]  # in that order
        assert decisions[f"{pool}_depthwise"].fused
        assert "GlobalAveragePool" not in [n.op_type for n in optimized.graph.node]
    else:
        assert {c[0] for c in timer.calls} == {conv}
        assert not decisions[pool].fused and decisions[pool].reason.startswith("its input is NCHW here")
        assert "GlobalAveragePool" in [n.op_type for n in optimized.graph.node]


@pytest.mark.parametrize("pool_us,fused", [(3.0, True), (30.0, False), (None, False)])
def test_a_large_pool_becomes_a_fused_conv_only_where_measured_faster(tmp_path, pool_us, fused):
    """A 16x16 pool (more than 64 pixels) after a fused conv: rewritten where measured faster than the
    NHWC pool the model would run; slower, or unmeasured (the budget spent before it: the static policy
    would approve any depthwise kernel), it stays a pool."""
    model, conv, pool = _conv_then_pool(size=16)
    times = {conv: (10.0, 20.0)}
    if pool_us is not None:
        times[f"{pool}_depthwise"] = (pool_us, 15.0)
        optimized, report = _optimize(model, FakeTimer(times), tmp_path=tmp_path)
    else:
        clock = FakeClock()
        timer = FakeTimer(times, clock=clock, seconds_per_call=5.0)
        optimized, report = _optimize(model, timer, tmp_path=tmp_path, measure_budget_s=7.0, clock=clock)
    decisions = {d.node: d for d in report.decisions}
    assert decisions[conv].fused
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == 1 + fused  # else nhwc_pools' GEMV
    if fused:
        assert decisions[f"{pool}_depthwise"].fused
    elif pool_us is None:
        assert decisions[pool].reason.startswith("a pool of 16x16 pixels (more than 64)")
    else:
        assert decisions[pool].reason == "slower"


def test_a_measured_win_is_confirmed_by_a_second_reading_or_a_third_where_they_disagree(tmp_path):
    model, (a, b, c) = _chain(3, pool_between=True)
    timer = FakeTimer({a: [(5.0, 20.0), (30.0, 19.0), (31.0, 18.0)],  # a win, then two losses
                       b: [(5.0, 20.0), (6.0, 21.0)],  # two wins: the worse of them
                       c: [(5.0, 20.0), (40.0, 19.0), (7.0, 22.0)]})  # a slow spell in the second reading
    _, report = _optimize(model, timer, tmp_path=tmp_path)
    decisions = {d.node: d for d in report.decisions}
    assert not decisions[a].fused and decisions[a].ours_us == [30.0] and decisions[a].runtime_us == [19.0]
    assert decisions[b].fused and decisions[b].ours_us == [6.0] and decisions[b].runtime_us == [20.0]
    assert decisions[c].fused and decisions[c].ours_us == [7.0] and decisions[c].runtime_us == [20.0]
    assert timer.calls == [(a, 1)] * 3 + [(b, 1)] * 2 + [(c, 1)] * 3


def test_measuring_stops_at_the_budget_and_the_rest_follows_the_static_policy(tmp_path):
    model, names = _chain(4, pool_between=True)
    clock = FakeClock()
    timer = FakeTimer({n: (1.0, 100.0) for n in names}, clock=clock, seconds_per_call=5.0)
    _, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32",
                          measure_budget_s=15.0, clock=clock)
    assert len(set(timer.calls)) == 2  # started at 0 and 10 s (a win is read twice), then past the budget
    decisions = {d.node: d for d in report.decisions}
    assert [decisions[n].fused for n in names] == [True, True, False, False]
    assert "budget of 15 s spent" in decisions[names[3]].reason
    assert decisions[names[3]].source == "static policy"


def test_the_cache_makes_a_second_run_measure_nothing(tmp_path):
    model, (a, b) = _chain(2, pool_between=True)
    first = FakeTimer({a: (10.0, 20.0), b: (30.0, 20.0)})
    _, r1 = _optimize(model, first, tmp_path=tmp_path)
    assert len(set(first.calls)) == 2
    second = FakeTimer({})  # raises KeyError if asked
    _, r2 = _optimize(model, second, tmp_path=tmp_path)
    assert second.calls == [] and _fused_convs(r2) == _fused_convs(r1) == [a]
    entries = CostTable.load(tmp_path / "cache.json").entries
    assert {d for d, _, _ in entries} == {"fake accelerator"}


def test_a_timer_that_fails_leaves_the_candidate_to_the_static_policy(tmp_path):
    model, (a,) = _chain(1)

    class Failing(FakeTimer):
        def group_times(self, group):
            raise RuntimeError("ORT refused the micro-model")

    _, report = _optimize(model, Failing({}), tmp_path=tmp_path, target="ort-cpu", precision="fp32")
    assert not report.decisions[0].fused
    assert "not measurable: ORT refused the micro-model" in report.decisions[0].reason


def test_symbolic_spatial_dims_cannot_be_measured(tmp_path):
    model, (a,) = _chain(1)
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        for d in vi.type.tensor_type.shape.dim[2:]:
            d.dim_param = "side"
    timer = FakeTimer({a: (1.0, 100.0)})
    _, report = _optimize(model, timer, tmp_path=tmp_path)
    assert timer.calls == []
    assert report.decisions[0].source == "static policy" and "shapes not known" in report.decisions[0].reason


@pytest.mark.parametrize("target, dtype, kernels, fuse", [
    ("ort-cpu", "fp32", ["cpu_eigen"], False),
    ("tensorrt", "fp16", ["sm90_f16_conv_128x64x64_c1x1_pingpong"], False),
    ("ort-cuda", "fp32", ["sm80_f32_3xtf32_128x64x16_4st", "cuda_direct"], False),
    ("ort-cuda", "fp16", ["cuda_direct"], False),
    ("ort-cuda", "fp16", ["sm80_f16_grouped_128x32x32_4st", "sm80_f16_grouped_64x8x32_4st", "cuda_direct"], False),
    ("ort-cuda", "fp16", ["sm80_f16_unaligned_64x64x32_2st", "cuda_direct"], False),
    ("ort-cuda", "fp16", ["cuda_depthwise_scalar", "cuda_direct"], False),
    ("ort-cuda", "fp16", ["sm90_f16_conv_128x64x64_c1x1_pingpong", "cuda_direct"], True),
    ("ort-cuda", "fp16", ["cuda_depthwise_tile", "cuda_depthwise_scalar", "cuda_direct"], True),
])
def test_static_policy(target, dtype, kernels, fuse):
    decided, why = static_verdict(target, dtype, kernels)
    assert decided is fuse and why.startswith("static:")


def test_static_mode_on_the_registry_refuses_grouped_convs():
    """32 groups of 2 channels have only the direct kernel on the CUDA targets; ResNeXt's 32 groups of 4
    have the grouped tensor-core kernels too, not known to beat cuDNN's without timing: both stay ORT's.
    The dense conv between them would then sit alone in NHWC, a Transpose on each side: it stays ORT's too."""
    def build(g, x):
        with g.scope("grouped2"):
            y = g.op("Relu", [g.conv(x, 64, 64, 3, group=32)])
        with g.scope("dense"):
            y = g.op("Relu", [g.conv(y, 64, 128, 3)])
        with g.scope("grouped4"):
            return g.op("Relu", [g.conv(y, 128, 128, 3, group=32)])

    model = onnx.shape_inference.infer_shapes(conv_net(build, channels=64))
    _, report = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="static"))
    fused = {d.node.split("/")[1]: d.fused for d in report.decisions}
    assert fused == {"grouped2": False, "dense": False, "grouped4": False}
    assert "grouped" in next(d.reason for d in report.decisions if "grouped4" in d.node)
    assert "adds 2 Transposes" in next(d.reason for d in report.decisions if "dense" in d.node)
    assert report.costs.startswith("static")


def _shuffle_branch(channels: int):
    """ShuffleNetV2's branch: 1x1 conv + Relu, depthwise 3x3 (+ BN), 1x1 conv + Relu, twice."""
    def build(g, x):
        for block in ("b0", "b1"):
            with g.scope(block):
                with g.scope("pw1"):
                    x = g.op("Relu", [g.conv(x, channels, channels, 1)])
                with g.scope("dw"):
                    x = g.conv(x, channels, channels, 3, group=channels)
                with g.scope("pw2"):
                    x = g.op("Relu", [g.conv(x, channels, channels, 1)])
        return x

    return onnx.shape_inference.infer_shapes(conv_net(build, channels=channels))


def test_static_policy_leaves_unaligned_channels_and_what_they_isolate_to_the_runtime():
    """116 channels (ShuffleNetV2 1.0's stage 3) have only the unaligned tile and the direct kernel, both
    slower than cuDNN there when measured; the depthwise convs between them would each add two Transposes.
    Nothing fuses. At 58 (stage 2) the depthwise convs have only the scalar kernel, slower than cuDNN there
    too. At 128 channels every conv fuses."""
    _, report = optimize_model(_shuffle_branch(116), target="ort-cuda", precision="fp16",
                               policy=FusionPolicy(mode="static"))
    reasons = {d.node.split("/")[2]: d.reason for d in report.decisions if d.node.startswith("/b0/")}
    assert not any(d.fused for d in report.decisions), reasons
    assert "unaligned" in reasons["pw1"] and "adds 2 Transposes" in reasons["dw"], reasons
    _, stage2 = optimize_model(_shuffle_branch(58), target="ort-cuda", precision="fp16",
                               policy=FusionPolicy(mode="static"))
    dw = next(d for d in stage2.decisions if d.node.startswith("/b0/dw/"))
    assert not any(d.fused for d in stage2.decisions) and "scalar depthwise" in dw.reason, dw.reason
    _, aligned = optimize_model(_shuffle_branch(128), target="ort-cuda", precision="fp16",
                                policy=FusionPolicy(mode="static"))
    assert all(d.fused for d in aligned.decisions), [(d.node, d.reason) for d in aligned.decisions]


def test_static_policy_keeps_an_rgb_stem_whose_maxpool_stays_nchw():
    """ResNet's stem conv reads the RGB input and feeds a MaxPool that stays NCHW: fused, it adds two
    Transposes, but the few-channel stem kernel beats cuDNN's by far more (the static rule keeps it)."""
    from models import zoo

    model = onnx.shape_inference.infer_shapes(zoo.build("resnet_tiny", batch=1))
    _, report = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="static"))
    stem = next(d for d in report.decisions if "stem" in d.node)
    assert stem.fused and "stem" in stem.reason, stem.reason
    assert all(d.fused for d in report.decisions)


def test_always_fuses_wherever_a_kernel_exists_and_auto_without_times_is_static():
    model, (a,) = _chain(1)
    _, always = optimize_model(model, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert _fused_convs(always) == [a] and always.decisions[0].source == "fuse=always"
    _, trt = optimize_model(model, target="tensorrt", policy=FusionPolicy(mode="auto"))
    assert _fused_convs(trt) == [] and "TensorRT fuses" in trt.decisions[0].reason


def test_unfused_model_still_gets_its_batchnorm_folded_and_computes_the_same(tmp_path):
    model, (a, b) = _chain(2, pool_between=True)
    optimized, report = _optimize(model, FakeTimer({a: (30.0, 20.0), b: (30.0, 20.0)}), tmp_path=tmp_path,
                                  target="ort-cpu", precision="fp32")
    ops = [n.op_type for n in optimized.graph.node]
    assert "BatchNormalization" not in ops and contract.OP_TYPE not in ops and "Transpose" not in ops
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_decider_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="unknown fusion mode"):
        Decider("ort-cpu", "fp32", mode="sometimes")


def test_activation_patterns_are_timed_as_the_exporter_wrote_them(tmp_path):
    """The runtime's side of a SiLU written as x*Sigmoid(x) is those two nodes, not an idealised op."""
    model = onnx.shape_inference.infer_shapes(conv_net(lambda g, x: act.silu(g, g.conv(x, 8, 8, 3))))
    conv = next(n.name for n in model.graph.node if n.op_type == "Conv")
    _, report = _optimize(model, FakeTimer({conv: (1.0, 2.0)}), tmp_path=tmp_path)
    assert report.decisions[0].pattern in ("Conv+Sigmoid+Mul", "Conv+Mul+Sigmoid")


def _sliced_by_shape_arithmetic(g, x):
    """A conv, then its channels halved the way torch exports `chunk` of a C2f: Shape → Gather → Add →
    Div → Mul → Slice, which leaves the second conv's input shape unknown while the batch is symbolic."""
    with g.scope("first"):
        y = g.op("Relu", [g.conv(x, 8, 8, 3)])
    shape = g.op("Shape", [y])
    channels = g.op("Gather", [shape, g.constant(np.array(1, np.int64), np.int64)], axis=0)
    half = g.op("Div", [g.op("Add", [channels, g.constant(np.array(1, np.int64), np.int64)]),
                        g.constant(np.array(2, np.int64), np.int64)])
    end = g.op("Unsqueeze", [g.op("Mul", [half, g.constant(np.array(1, np.int64), np.int64)]),
                             g.constant(np.array([0], np.int64), np.int64)])
    sliced = g.op("Slice", [y, g.constant(np.array([0], np.int64), np.int64), end,
                            g.constant(np.array([1], np.int64), np.int64)])
    with g.scope("second"):
        return g.op("Relu", [g.conv(sliced, 4, 8, 3)])


def test_shapes_behind_exporters_shape_arithmetic_are_inferred_per_batch(tmp_path):
    model = onnx.shape_inference.infer_shapes(conv_net(_sliced_by_shape_arithmetic, batch="N"))
    second = next(n for n in model.graph.node if n.op_type == "Conv" and "second" in n.name)
    inferred = {v.name: v for v in model.graph.value_info}
    assert not inferred[second.input[0]].type.tensor_type.shape.dim[1].HasField("dim_value")  # onnx alone: unknown
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    timer = FakeTimer({c: (1.0, 2.0) for c in convs})
    _, report = _optimize(model, timer, tmp_path=tmp_path, batches=(3,))
    assert sorted(set(timer.calls)) == sorted((c, 3) for c in convs)
    assert all(d.fused for d in report.decisions)


def _classifier():
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm, and the names of its conv, pool and Gemm."""
    def build(g, x):
        pooled = g.op("Flatten", [g.op("GlobalAveragePool", [g.op("Relu", [g.conv(x, 8, 16, 3, stride=2)])])])
        return g.gemm(pooled, 16, 10)

    model = onnx.shape_inference.infer_shapes(conv_net(build))
    conv, pool, gemm = (next(n.name for n in model.graph.node if n.op_type == op)
                        for op in ("Conv", "GlobalAveragePool", "Gemm"))
    return model, conv, pool, gemm


@pytest.mark.parametrize("batches, rewritten", [((1,), True), ((1, 16), False)])
def test_static_policy_rewrites_a_large_classifier_only_at_batch_1(batches, rewritten):
    """A 2048 -> 1000 classifier (ResNet-50's) as a 1x1 conv: 2M multiply-adds at batch 1, where the GEMV
    beat cuBLAS when measured; 33M at batch 16, where cuBLAS won. Decided for batch 1 and 16 it stays a Gemm."""
    def build(g, x):
        return g.gemm(g.op("Flatten", [g.op("GlobalAveragePool", [g.op("Relu", [g.conv(x, 8, 2048, 1)])])]),
                      2048, 1000)

    model = onnx.shape_inference.infer_shapes(conv_net(build, size=4, batch="N"))
    optimized, report = optimize_model(model, target="ort-cuda", precision="fp16",
                                       policy=FusionPolicy(mode="static", batches=batches))
    assert ("Gemm" not in [n.op_type for n in optimized.graph.node]) is rewritten
    if not rewritten:
        gemm = next(d for d in report.decisions if d.pattern == "Gemm (as a 1x1 FusedConv)")
        assert "32768000 multiply-adds" in gemm.reason, gemm.reason


@pytest.mark.parametrize("faster", [True, False])
def test_a_classifier_gemm_becomes_a_conv_only_where_the_fused_conv_wins(tmp_path, faster):
    model, conv, pool, gemm = _classifier()
    won = (1.0, 5.0) if faster else (5.0, 1.0)
    timer = FakeTimer({conv: (1.0, 5.0), f"{gemm}_conv": won, f"{pool}_depthwise": won})
    optimized, report = _optimize(model, timer, tmp_path=tmp_path)
    ops = [n.op_type for n in optimized.graph.node]
    assert ("Gemm" in ops) is not faster
    assert ops.count(contract.OP_TYPE) == (3 if faster else 1)
    if not faster:
        kept = {d.node: d for d in report.decisions if not d.fused}
        assert kept[gemm].pattern == "Gemm (as a 1x1 FusedConv)" and kept[gemm].reason == "slower"
        assert kept[pool].pattern == "GlobalAveragePool (as a depthwise FusedConv)"
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=2e-2, atol=2e-2)


class FakeModelCheck:
    """The whole-model check's timer, as optimizer.compare.compare reports: `speedup(ks, batch)` gives
    the speed-up of a model whose FusedConvs have the output widths `ks` (which candidates fused)."""

    def __init__(self, speedup, error: Exception | None = None):
        self.speedup, self.error = speedup, error
        self.calls: list[tuple[tuple[int, ...], int]] = []
        self.threads: list[int | None] = []  # each call's ort-cpu thread count

    @property
    def batches(self) -> list[int]:
        return [b for _, b in self.calls]

    @staticmethod
    def widths(model) -> tuple[int, ...]:
        if isinstance(model, str):  # optimize_file's check reads the written output
            model = onnx.load(model)
        weights = {t.name: t.dims for t in model.graph.initializer}
        return tuple(sorted(weights[n.input[1]][0] for n in model.graph.node if n.op_type == contract.OP_TYPE))

    def __call__(self, original, optimized, *, backend, batch, precision, rounds, threads=None):
        ks, base = self.widths(optimized), self.widths(original)
        self.calls.append((ks, batch))
        self.threads.append(threads)
        if self.error is not None:
            raise self.error
        # against a model with fusions of its own (the near-miss variant against the checked model): the ratio
        s = self.speedup(ks, batch) / (self.speedup(base, batch) if base else 1.0)
        return {"batch": batch, "speedup": s, "speedup_q1": s - 0.01, "speedup_q3": s + 0.01, "slower": s + 0.01 < 1.0,
                "threads": threads}


def _by_batch(speedups: dict[int, float]):
    return lambda ks, batch: speedups[batch]


def test_a_model_slower_as_a_whole_at_one_batch_size_comes_back_unfused(tmp_path):
    model, (a, b) = _chain(2, batch="N")
    check = FakeModelCheck(lambda ks, batch: {1: 1.3, 16: 0.93}[batch] if ks else 1.0)
    optimized, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                                  target="ort-cpu", precision="fp32", batches=(1, 16), model_check=check)
    # all, then the smaller half, then the model with nothing fused against the original (at 1.0x, within
    # the confirming margin of the floor: each batch size checked twice)
    assert check.calls == [((8, 16), 1), ((8, 16), 16), ((8,), 1), ((8,), 16), ((), 1), ((), 1), ((), 16), ((), 16)]
    ops = [n.op_type for n in optimized.graph.node]
    assert contract.OP_TYPE not in ops and "BatchNormalization" not in ops and "Transpose" not in ops
    assert _fused_convs(report) == [] and report.fused_count() == 0
    assert all("dropped: the model with all 2 fusions ran 0.930x the original's speed at batch 16" in d.reason
               for d in report.decisions)
    assert any("every fusion dropped" in n for n in report.notes)
    feeds = feeds_for(model, batch=2)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fast_enough, kept", [({8, 16}, (8, 16)), ({8}, (8,))])
def test_a_slower_model_keeps_the_fusions_on_its_smallest_tensors_where_those_are_not_slower(tmp_path, fast_enough, kept):
    """Four convs widening 8 -> 32 channels: the last ones move the most data. The fused model loses at
    batch 16; the check tries the smaller half of the fusions by data (c0, c1), then the smallest
    quarter (c0), and keeps the first that is not slower."""
    model, names = _chain(4, batch="N")
    check = FakeModelCheck(lambda ks, batch: 1.1 if batch == 1 or set(ks) <= fast_enough else 0.9)
    optimized, report = _optimize(model, FakeTimer({n: (10.0, 20.0) for n in names}), tmp_path=tmp_path,
                                  target="ort-cpu", precision="fp32", batches=(1, 16), model_check=check)
    assert [ks for ks, _ in check.calls][-1] == kept
    assert tuple(sorted(8 * (int(n.split("/")[1][1:]) + 1) for n in _fused_convs(report))) == kept
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == len(kept)
    left_out = [d for d in report.decisions if not d.fused]
    assert left_out and all(d.reason.startswith("left out by the whole-model check") for d in left_out)
    assert report.notes[-1] == (f"the model with all 4 fusions ran 0.900x the original's speed at batch 16, 2 threads: "
                                f"kept the {len(kept)} fusion{'s' if len(kept) > 1 else ''} on the smallest tensors")
    assert report.fused_count() == len(kept)
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


class SecondOpinionCheck(FakeModelCheck):
    """A model with fusions reads `first` at the first check of one (the call is already in `calls` when
    its speed-up is asked for) and `then` at every later one; the model with nothing fused reads 1.0."""

    def __init__(self, first: float, then: float):
        super().__init__(lambda ks, batch: (first if len([c for c in self.calls if c[0]]) == 1 else then)
                         if ks else 1.0)


@pytest.mark.parametrize("first, then, checks, kept", [
    (1.01, 0.98, 2, False),  # passed narrowly, then slower: dropped
    (1.01, 1.02, 2, True),  # passed narrowly twice
    (1.05, 0.90, 1, True),  # passed clearly: not run again
])
def test_a_cpu_model_passing_narrowly_is_checked_again(tmp_path, first, then, checks, kept):
    model, (a, b) = _chain(2)
    check = SecondOpinionCheck(first, then)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", model_check=check)
    assert [ks for ks, _ in check.calls][:checks] == [(8, 16)] * checks
    assert _fused_convs(report) == ([a, b] if kept else [])
    assert sum(n.startswith("whole-model check, the model with all 2 fusions, again") for n in report.notes) == checks - 1


@pytest.mark.parametrize("target, precision, kept", [("ort-cpu", "fp32", False), ("ort-cuda", "fp16", True)])
def test_a_whole_model_at_099x_is_slower_on_the_cpu_only(tmp_path, target, precision, kept):
    """The check's floor by target: 0.98x on a GPU, whose rounds agree; 1.0x on a CPU, whose spread."""
    model, (a, b) = _chain(2)
    check = FakeModelCheck(lambda ks, batch: 0.99)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target=target, precision=precision, model_check=check)
    assert _fused_convs(report) == ([a, b] if kept else [])


@pytest.mark.parametrize("half, kept", [(1.005, False), (1.02, True)])
def test_a_fallback_variant_must_gain_as_a_near_miss_variant_must(tmp_path, half, kept):
    model, (a, b) = _chain(2)
    check = FakeModelCheck(lambda ks, batch: 0.9 if len(ks) == 2 else half)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", model_check=check)
    assert _fused_convs(report) == ([a] if kept else [])


def test_a_model_not_slower_as_a_whole_keeps_its_fusions(tmp_path):
    model, (a, b) = _chain(2, batch="N")
    check = FakeModelCheck(_by_batch({1: 1.2, 16: 0.995}))  # within noise of 1: not slower
    optimized, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                                  batches=(1, 16), model_check=check)
    assert _fused_convs(report) == [a, b] and check.batches == [1, 16]
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == 2
    assert [n for n in report.notes if n.startswith("whole-model check")] == [
        "whole-model check, the model with all 2 fusions, batch 1: 1.200x (interquartile 1.190-1.210x)",
        "whole-model check, the model with all 2 fusions, batch 16: 0.995x (interquartile 0.985-1.005x)"]


@pytest.mark.parametrize("with_it, kept", [(1.32, True), (1.205, False)])
def test_a_near_miss_fuses_where_the_whole_model_with_it_runs_faster(tmp_path, with_it, kept):
    """c1 is 10% slower alone than ORT's nodes (a near miss) and the region estimate, its Transposes free
    here, leaves it out; the check then runs the model with it fused against the checked one and keeps
    that only where it is faster by MODEL_CHECK_GAIN (the Transposes it saves cost more in the model)."""
    model, (a, b, c) = _chain(3)
    check = FakeModelCheck(lambda ks, batch: with_it if len(ks) == 3 else 1.2)
    optimized, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (10.0, 20.0)}),
                                  tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert check.calls == [((8, 24), 1), ((8, 16, 24), 1)]  # the decided model, then the variant against it
    assert _fused_convs(report) == ([a, b, c] if kept else [a, c])
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == (3 if kept else 2)
    assert report.fused_count() == (3 if kept else 2)
    reason = {d.node: d.reason for d in report.decisions}[b]
    assert reason.startswith("slower") and ("fused: the model with the near misses ran 1.100x" in reason) == kept
    assert ("kept the model with 1 near miss fused" in report.notes) == kept
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_them, kept", [(1.05, True), (1.0, False)])
def test_near_misses_are_tried_where_nothing_fused(tmp_path, with_them, kept):
    """Both convs a little slower alone than ORT's nodes: nothing fuses, and the model with both fused
    runs against the unfused one; it is kept only where faster by MODEL_CHECK_GAIN."""
    model, (a, b) = _chain(2)
    check = FakeModelCheck(lambda ks, batch: with_them if ks else 1.0)
    optimized, report = _optimize(model, FakeTimer({a: (11.0, 10.0), b: (11.5, 10.0)}), tmp_path=tmp_path,
                                  target="ort-cpu", precision="fp32", model_check=check)
    # where the variant is not kept, the model with nothing fused runs against the original (twice: at
    # 1.0x it passes by less than the confirming margin)
    assert check.calls == [((8, 16), 1)] + ([] if kept else [((), 1), ((), 1)])
    assert _fused_convs(report) == ([a, b] if kept else [])
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == (2 if kept else 0)
    assert ("kept the model with 2 near misses fused" in report.notes) == kept
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_a_classifier_gemm_and_pool_as_near_misses_are_tried_under_their_conv_names(tmp_path):
    """The Gemm and the pool are decided under their own names where they stay unfused and under the
    conv they become where they fuse: the variant with them fused is still the one asked for."""
    model, conv, pool, gemm = _classifier()
    timer = FakeTimer({conv: (1.0, 5.0), f"{gemm}_conv": (5.5, 5.0), f"{pool}_depthwise": (5.5, 5.0)})
    check = FakeModelCheck(lambda ks, batch: 1.1 * 1.05 ** (len(ks) - 1))
    optimized, report = _optimize(model, timer, tmp_path=tmp_path, model_check=check)
    assert [len(ks) for ks, _ in check.calls] == [1, 3]
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == 3 and report.fused_count() == 3
    assert all(d.fused for d in report.decisions) and "kept the model with 2 near misses fused" in report.notes


def test_no_near_miss_variant_where_the_whole_model_check_could_not_run(tmp_path):
    model, (a, b, c) = _chain(3)
    check = FakeModelCheck(lambda ks, batch: 1.3, error=RuntimeError("CUDA graph capture failed"))
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (10.0, 20.0)}),
                          tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert len(check.calls) == 1 and _fused_convs(report) == [a, c]


def test_every_candidate_is_tried_against_the_model_with_the_near_misses_kept(tmp_path):
    model, (a, b, c) = _chain(3)
    check = FakeModelCheck(lambda ks, batch: {1: 1.2, 2: 1.3, 3: 1.45}[len(ks)])
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (13.0, 10.0)}),
                          tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert check.calls == [((8,), 1), ((8, 16), 1), ((8, 16, 24), 1)]  # the last against (8, 16): 1.115x
    assert _fused_convs(report) == [a, b, c]
    assert "kept the model with 1 near miss fused" in report.notes
    assert "kept the model with every candidate fused (1 more)" in report.notes


def test_every_candidate_is_tried_where_the_near_misses_were_not_kept(tmp_path):
    model, (a, b, c) = _chain(3)
    check = FakeModelCheck(lambda ks, batch: {1: 1.2, 2: 1.2, 3: 1.35}[len(ks)])
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (13.0, 10.0)}),
                          tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert check.calls == [((8,), 1), ((8, 16), 1), ((8, 16, 24), 1)]
    assert _fused_convs(report) == [a, b, c] and "kept the model with every candidate fused (2 more)" in report.notes


@pytest.mark.parametrize("with_it, kept", [(1.32, True), (1.2, False)])
def test_a_candidate_much_slower_alone_is_tried_with_every_candidate_fused(tmp_path, with_it, kept):
    """b is 30% slower alone: no near miss, but the model with every candidate fused still runs against
    the checked one, and is kept only where faster by MODEL_CHECK_GAIN."""
    model, (a, b, c) = _chain(3)
    check = FakeModelCheck(lambda ks, batch: with_it if len(ks) == 3 else 1.2)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (13.0, 10.0), c: (10.0, 20.0)}),
                          tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert check.calls == [((8, 24), 1), ((8, 16, 24), 1)]
    assert _fused_convs(report) == ([a, b, c] if kept else [a, c])
    assert ("kept the model with every candidate fused (1 more)" in report.notes) == kept
    reason = {d.node: d.reason for d in report.decisions}[b]
    assert ("fused: the model with every candidate ran 1.100x" in reason) == kept


def test_the_whole_model_check_runs_a_static_batch_at_its_own_size_only(tmp_path):
    model, (a,) = _chain(1, batch=3)
    check = FakeModelCheck(_by_batch({3: 1.1}))
    _optimize(model, FakeTimer({a: (10.0, 20.0)}), tmp_path=tmp_path, batches=(1, 16), model_check=check)
    assert check.batches == [3]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("unfused, original_kept", [(0.95, True), (1.0, False)])
def test_where_nothing_fuses_the_model_still_runs_against_the_original(tmp_path, unfused, original_kept, precision):
    """The rewrites that are not fusions (BatchNorms folded, ...) change the model too: where nothing
    fused and it runs slower than the original, the original is written as it is (fp32; and bf16 on the
    CPU EP, where nothing but the FusedConvs would run in bf16)."""
    model, (a,) = _chain(1)
    check = FakeModelCheck(lambda ks, batch: unfused)
    optimized, report = _optimize(model, FakeTimer({a: (30.0, 20.0)}), tmp_path=tmp_path, target="ort-cpu",
                                  precision=precision, model_check=check)
    # the variant with every candidate fused first (not faster than the model without), then that model
    # (a second time where it passed by less than the confirming margin)
    assert check.calls == [((8,), 1)] + [((), 1)] * (1 if original_kept else 2) and _fused_convs(report) == []
    assert ("BatchNormalization" in [n.op_type for n in optimized.graph.node]) == original_kept
    assert (optimized.graph == model.graph) == original_kept
    assert any(n.endswith("the original kept as it is") for n in report.notes) == original_kept
    assert report.original_kept == original_kept
    assert (report.nodes_after == report.nodes_before and not report.bn_folded) == original_kept


def test_no_whole_model_check_without_a_measured_candidate_or_when_turned_off(tmp_path):
    model, (a,) = _chain(1)
    check = FakeModelCheck(_by_batch({1: 0.5}))
    optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="static", model_check=check))
    assert check.batches == []  # the static policy timed nothing here
    _, off = _optimize(model, FakeTimer({a: (10.0, 20.0)}), tmp_path=tmp_path / "x", model_check=False)
    assert _fused_convs(off) == [a]
    assert FusionPolicy(timer=FakeTimer({})).model_checker() is None  # a test's timer: no real run by default


def test_a_whole_model_check_that_cannot_run_leaves_the_measured_decisions(tmp_path):
    model, (a,) = _chain(1)
    check = FakeModelCheck(_by_batch({}), error=RuntimeError("CUDA graph capture failed"))
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0)}), tmp_path=tmp_path, model_check=check)
    assert _fused_convs(report) == [a]
    assert "whole-model check not run: RuntimeError: CUDA graph capture failed" in report.notes


def test_a_timer_that_reads_each_win_several_times_is_not_asked_twice(tmp_path):
    model, (a,) = _chain(1)
    timer = FakeTimer({a: [(5.0, 20.0), (30.0, 19.0)]})
    timer.confirms_wins = True
    _, report = _optimize(model, timer, tmp_path=tmp_path)
    assert timer.calls == [(a, 1)] and _fused_convs(report) == [a]


def test_optimize_file_checks_the_written_model_and_rewrites_it_with_the_kept_fusions(tmp_path):
    model, names = _chain(4, batch="N")
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    check = FakeModelCheck(lambda ks, batch: 1.1 if set(ks) <= {8, 16} else 0.9)
    policy = FusionPolicy(mode="auto", timer=FakeTimer({n: (10.0, 20.0) for n in names}), model_check=check,
                          cache_path=str(tmp_path / "cache.json"), threads=2)
    report = optimize_file(str(src), str(out), target="ort-cpu", policy=policy)
    assert [ks for ks, _ in check.calls] == [(8, 16, 24, 32), (8, 16)]
    written = onnx.load(out)
    assert [n.op_type for n in written.graph.node].count(contract.OP_TYPE) == 2 == report.fused_count()
    feeds = feeds_for(model)
    np.testing.assert_allclose(run_ort(written, feeds, library=True)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_optimize_file_writes_the_original_where_the_model_with_nothing_fused_is_slower(tmp_path):
    model, (a,) = _chain(1)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    check = FakeModelCheck(lambda ks, batch: 0.95)
    policy = FusionPolicy(mode="auto", timer=FakeTimer({a: (30.0, 20.0)}), model_check=check,
                          cache_path=str(tmp_path / "cache.json"))
    report = optimize_file(str(src), str(out), target="ort-cpu", policy=policy)
    assert check.calls[-1] == ((), 1) and report.fused_count() == 0
    written, original = onnx.load(out).graph, onnx.load(src).graph
    assert list(written.node) == list(original.node)  # BatchNormalization and all, as the input had them
    assert {t.name: onnx.numpy_helper.to_array(t).tolist() for t in written.initializer} == \
        {t.name: onnx.numpy_helper.to_array(t).tolist() for t in original.initializer}
    assert [p.name for p in tmp_path.iterdir() if p.name not in ("in.onnx", "out.onnx", "cache.json")] == []


@pytest.mark.parametrize("with_it, kept", [(1.32, True), (1.2, False)])
def test_optimize_file_checks_the_near_miss_variant_from_a_file_beside_the_output(tmp_path, with_it, kept):
    model, (a, b, c) = _chain(3)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    seen = []

    def speedup(ks, batch):
        return with_it if len(ks) == 3 else 1.2

    class FileCheck(FakeModelCheck):
        def __call__(self, original, optimized, **kw):
            seen.append((original, optimized))
            return super().__call__(original, optimized, **kw)

    policy = FusionPolicy(mode="auto", timer=FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (10.0, 20.0)}),
                          model_check=FileCheck(speedup), cache_path=str(tmp_path / "cache.json"))
    report = optimize_file(str(src), str(out), target="ort-cpu", policy=policy)
    assert all(isinstance(m, str) for pair in seen[1:] for m in pair)  # the variant and the checked model: files
    assert [n.op_type for n in onnx.load(out).graph.node].count(contract.OP_TYPE) == (3 if kept else 2)
    assert report.fused_count() == (3 if kept else 2)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cache.json", "in.onnx", "out.onnx"]


def test_an_interrupted_whole_model_check_leaves_the_previous_output_as_it_was(tmp_path):
    model, (a,) = _chain(1)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    out.write_bytes(b"the previous output")
    policy = FusionPolicy(mode="auto", timer=FakeTimer({a: (10.0, 20.0)}), cache_path=str(tmp_path / "cache.json"),
                          model_check=FakeModelCheck(_by_batch({}), error=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        optimize_file(str(src), str(out), target="ort-cpu", policy=policy)
    assert out.read_bytes() == b"the previous output" and src.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "in.onnx", "out.onnx"]  # no checking file


def test_a_variant_never_fuses_what_the_full_model_did_not_nor_measures_anew(tmp_path):
    """The measuring budget lets the first run time c0 and c1 only (c2-c5 follow the CPU's static
    policy: not fused). The variant with the smaller half (c0) is optimized from those times alone."""
    model, names = _chain(6, batch="N")
    clock = FakeClock()
    timer = FakeTimer({n: (10.0, 20.0) for n in names}, clock=clock, seconds_per_call=1.0)
    timer.confirms_wins = True  # one reading a candidate
    check = FakeModelCheck(lambda ks, batch: 1.1 if ks == (8,) else 0.9)
    optimized, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32",
                                  model_check=check, measure_budget_s=1.5, clock=clock)
    assert [c for c, _ in timer.calls] == names[:2]  # nothing measured for the variant
    assert [ks for ks, _ in check.calls] == [(8, 16), (8,)]
    assert _fused_convs(report) == [names[0]]
    left_out = {d.node: d for d in report.decisions}[names[1]]
    assert left_out.reason.startswith("left out by the whole-model check")
    assert left_out.ours_us == [10.0] and left_out.runtime_us == [20.0]  # still with its measured times
    assert report.ops_after == dict(Counter(n.op_type for n in optimized.graph.node))


def test_a_model_dropped_to_unfused_reports_the_model_it_returns(tmp_path):
    model, names = _chain(2, batch="N")
    check = FakeModelCheck(lambda ks, batch: 0.9)
    optimized, report = _optimize(model, FakeTimer({n: (10.0, 20.0) for n in names}), tmp_path=tmp_path,
                                  model_check=check)
    assert report.ops_after == dict(Counter(n.op_type for n in optimized.graph.node))
    assert report.fused_count() == 0 and report.nodes_after == len(optimized.graph.node)


def test_unnamed_convs_get_names_the_decisions_and_the_check_can_tell_apart(tmp_path):
    model, names = _chain(4, batch="N")
    for node in model.graph.node:
        node.name = ""
    check = FakeModelCheck(lambda ks, batch: 1.1 if set(ks) <= {8, 16} else 0.9)
    timer = FakeTimer({})
    timer.group_times = lambda group: (10.0, 20.0)
    optimized, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32",
                                  model_check=check)
    decided = [d.node for d in report.decisions]
    assert len(decided) == 4 and all(decided) and len(set(decided)) == 4
    assert [ks for ks, _ in check.calls] == [(8, 16, 24, 32), (8, 16)]
    assert report.canonicalized["unnamed or duplicate node name → unique name"] == len(model.graph.node)


def test_the_cli_turns_the_whole_model_check_off_on_request():
    from optimizer.cli import _policy, build_parser

    parse = build_parser().parse_args
    assert _policy(parse(["optimize", "m.onnx", "-o", "o.onnx", "--no-model-check"])).model_checker() is None
    assert _policy(parse(["optimize", "m.onnx", "-o", "o.onnx"])).model_check is None  # the default: checked
    assert _policy(parse(["inspect", "m.onnx", "--no-model-check"])).model_check is False


def test_a_variant_no_faster_than_nothing_fused_is_not_kept(tmp_path):
    model, names = _chain(4, batch="N")
    check = FakeModelCheck(lambda ks, batch: 0.9 if len(ks) == 4 else 0.99)  # within the noise floor, below 1
    optimized, report = _optimize(model, FakeTimer({n: (10.0, 20.0) for n in names}), tmp_path=tmp_path,
                                  model_check=check)
    assert [ks for ks, _ in check.calls] == [(8, 16, 24, 32), (8, 16), (8,)]
    assert report.fused_count() == 0 and contract.OP_TYPE not in [n.op_type for n in optimized.graph.node]


class SpreadCheck(FakeModelCheck):
    """Rounds spread by `spread` below the median (the median as FakeModelCheck's)."""

    def __init__(self, speedup, spread: float):
        super().__init__(speedup)
        self.spread = spread

    def __call__(self, *args, **kwargs):
        r = super().__call__(*args, **kwargs)
        return dict(r, speedup_q1=r["speedup"] - self.spread)


@pytest.mark.parametrize("everything, spread, kept", [(1.1, 0.01, True), (1.005, 0.01, False), (1.05, 0.08, False)],
                         ids=["faster", "by less than the gain", "rounds spread below 1"])
def test_where_the_measured_choice_loses_the_model_with_every_candidate_fused_is_tried(tmp_path, everything, spread,
                                                                                       kept):
    """c2 and c3 are slower alone, so c0 and c1 fuse; that model and its smaller half lose to the original,
    and the model with all four fused runs against the original too: kept where faster by MODEL_CHECK_GAIN
    (ORT's reorders around convs left to it are not in the candidates' own times) in two readings with three
    rounds in four faster, else nothing fuses."""
    model, names = _chain(4)
    times = {n: (10.0, 20.0) if i < 2 else (22.0, 20.0) for i, n in enumerate(names)}
    check = SpreadCheck(lambda ks, batch: everything if len(ks) == 4 else 0.9 if ks else 1.0, spread)
    optimized, report = _optimize(model, FakeTimer(times), tmp_path=tmp_path, target="ort-cpu", precision="fp32",
                                  model_check=check)
    # the variant with every candidate is read twice where it passes
    assert [ks for ks, _ in check.calls][:5 if kept else 3] == [(8, 16), (8,)] + [(8, 16, 24, 32)] * (2 if kept else 1)
    assert _fused_convs(report) == (names if kept else [])
    assert [n.op_type for n in optimized.graph.node].count(contract.OP_TYPE) == (4 if kept else 0)
    assert (report.notes[-1] == "the model with all 2 fusions ran 0.900x the original's speed at batch 1, 2 threads: kept the "
                                "model with every candidate fused (4)") == kept
    if kept:
        assert "fused: the model with every candidate fused (4) ran faster" in {d.node: d.reason
                                                                              for d in report.decisions}[names[3]]
        feeds = feeds_for(model)
        np.testing.assert_allclose(run_ort(optimized, feeds, library=True)[0], run_ort(model, feeds)[0],
                                   rtol=1e-4, atol=1e-5)


class ReorderTimer(FakeTimer):
    """A CPU timer that also times the runtime's reorders of each group's input and output
    (`reorders[name] = (in_us, out_us)`) and says which tensors the model reorders (`reordered`)."""

    times_reorders = True

    def __init__(self, times: dict, reorders: dict, reordered=(set(), set())):
        super().__init__(times)
        self.reorders, self.reordered = reorders, reordered
        self.models = []

    def group_times(self, group):
        return (*super().group_times(group), self.reorders[group.name])

    def reordered_tensors(self, model: bytes):
        self.models.append(onnx.load_from_string(model))
        return self.reordered


def _edges(model, conv):
    """The input of conv `conv` and the output of the Relu after it (past its BatchNormalization): the
    group's x and y."""
    node = next(n for n in model.graph.node if n.name == conv)
    t = node.output[0]
    while (node := next(n for n in model.graph.node if t in n.input)).op_type != "Relu":
        t = node.output[0]
    return next(n for n in model.graph.node if n.name == conv).input[0], node.output[0]


@pytest.mark.parametrize("reordered_edge, fused", [("none", False), ("input", True), ("output", True)])
def test_the_runtimes_reorders_at_a_candidates_edges_count_on_its_side_where_the_model_has_them(
        tmp_path, reordered_edge, fused):
    """10% slower alone; the runtime's 20 µs reorder of its input (or output) goes with fusing it, but
    only where the whole model reorders there."""
    model, (a, b) = _chain(2, pool_between=True)
    x, y = _edges(model, a)
    reordered = {"none": (set(), set()), "input": ({x}, set()), "output": (set(), {y})}[reordered_edge]
    timer = ReorderTimer({a: (110.0, 100.0), b: (300.0, 100.0)}, {a: (20.0, 20.0), b: (1.0, 1.0)}, reordered)
    _, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=False)
    decisions = {d.node: d for d in report.decisions}
    assert decisions[a].fused == fused and not decisions[b].fused
    assert decisions[a].runtime_us == [120.0 if fused else 100.0]
    assert ("reorders here counted" in decisions[a].reason) == fused
    # what the timer was asked about: the model as the fuse pass saw it, its convs not yet fused
    (seen,) = timer.models
    assert [n.op_type for n in seen.graph.node].count("Conv") == 2


def test_a_cached_time_without_the_reorders_is_measured_again_by_a_timer_that_reads_them(tmp_path):
    model, (a, b) = _chain(2, pool_between=True)
    _optimize(model, FakeTimer({a: (10.0, 20.0), b: (30.0, 20.0)}), tmp_path=tmp_path, target="ort-cpu",
              precision="fp32", model_check=False)
    timer = ReorderTimer({a: (10.0, 20.0), b: (30.0, 20.0)}, {a: (1.0, 2.0), b: (3.0, 4.0)})
    _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=False)
    assert {name for name, _ in timer.calls} == {a, b}
    entries = {k: v for (_, _, k), v in CostTable.load(tmp_path / "cache.json").entries.items()
               if not k.startswith("Transpose")}
    assert sorted((v["reorder_in_us"], v["reorder_out_us"]) for v in entries.values()) == [(1.0, 2.0), (3.0, 4.0)]
    again = ReorderTimer({}, {})  # raises KeyError if asked: the cache now has them
    _optimize(model, again, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=False)
    assert again.calls == []


def test_the_reorders_are_not_read_for_a_model_over_the_size_a_second_session_may_hold(tmp_path, monkeypatch):
    from optimizer import pipeline

    monkeypatch.setattr(pipeline, "MODEL_CHECK_MAX_BYTES", 16)
    model, (a, b) = _chain(2, pool_between=True)
    timer = ReorderTimer({a: (110.0, 100.0), b: (300.0, 100.0)}, {a: (20.0, 20.0), b: (1.0, 1.0)},
                         ({_edges(model, a)[0]}, set()))
    _, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=False)
    assert timer.models == [] and not any(d.fused for d in report.decisions)
    assert any(n.startswith("the runtime's layout reorders not read:") and "GiB of weights" in n for n in report.notes)


@pytest.mark.parametrize("model_reorders_there", [False, True])
def test_region_counts_the_reorders_the_runtime_adds_beside_a_lone_fusion(tmp_path, model_reorders_there):
    """c1 alone is 10% faster, but fused between c0 and c2 (left to ORT, slower fused) it takes its edges
    out of ORT's NCHWc region: ORT then reorders c0's output out and c2's input in (20 µs each), more than
    the fusion saves. Where the model already reorders there, those are in c0's and c2's times already."""
    model, (c0, c1, c2) = _chain(3)
    c1_x, c1_y = _edges(model, c1)
    reordered = ({c1_y}, {c1_x}) if model_reorders_there else (set(), set())
    timer = ReorderTimer({c0: (300.0, 100.0), c1: (90.0, 100.0), c2: (300.0, 100.0)},
                         {c0: (5.0, 20.0), c1: (5.0, 5.0), c2: (20.0, 5.0)}, reordered)
    _, report = _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=False)
    decisions = {d.node: d for d in report.decisions}
    assert not decisions[c0].fused and not decisions[c2].fused
    assert decisions[c1].fused == model_reorders_there
    if not model_reorders_there:
        assert decisions[c1].reason == ("faster alone; region: 0.0 µs of Transposes and 40.0 µs of the runtime's "
                                        "reorders saved by not fusing it at batch 1")


def test_the_whole_model_checks_variants_read_the_runtimes_reorders_no_more(tmp_path):
    """Each variant is the model optimized again: the reorders, a session on the whole model, are read once."""
    model, (a, b) = _chain(2, pool_between=True)
    timer = ReorderTimer({a: (10.0, 20.0), b: (10.0, 20.0)}, {a: (1.0, 1.0), b: (1.0, 1.0)})
    check = FakeModelCheck(lambda ks, batch: 0.9 if ks else 1.0)  # slower as a whole: variants follow
    _optimize(model, timer, tmp_path=tmp_path, target="ort-cpu", precision="fp32", model_check=check)
    assert len(check.calls) > 2 and len(timer.models) == 1


def test_the_whole_model_check_runs_with_the_thread_count_decided_for(tmp_path):
    """`threads` is measured and checked with, and only it."""
    model, (a, b) = _chain(2)
    check = FakeModelCheck(lambda ks, batch: 1.3 if ks else 1.0)
    _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path, target="ort-cpu",
              precision="fp32", threads=3, model_check=check)
    assert check.threads and set(check.threads) == {3}


@pytest.mark.parametrize("one_thread, kept", [(1.2, True), (0.95, False)])
def test_on_the_default_threads_the_model_is_also_checked_on_one(one_thread, kept, tmp_path, monkeypatch):
    """A model decided on the default threads can be slower on one (MobileNetV3-Large 1.06x on two Zen 4
    threads, 0.95x on one): where it is, the fusions go as at any run the check finds slower."""
    monkeypatch.setattr(pipeline, "cpu_cores", lambda: 2)
    model, (a, b) = _chain(2)
    check = FakeModelCheck(lambda ks, batch: 1.0 if not ks else one_thread if check.threads[-1] == 1 else 1.3)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", threads=None, model_check=check)
    assert check.threads[:2] == [None, 1]
    assert bool(_fused_convs(report)) == kept
    if not kept:
        assert any("batch 1, 1 thread:" in note for note in report.notes)


def test_a_thread_count_is_for_the_cpu(tmp_path):
    model, (a, _) = _chain(2)
    with pytest.raises(EpifuseError, match="ort-cpu"):
        _optimize(model, FakeTimer({a: (10.0, 20.0)}), tmp_path=tmp_path, target="ort-cuda", threads=2)


@pytest.mark.parametrize("one_thread, kept", [(1.0, True), (0.97, False)])
def test_a_near_miss_must_gain_on_the_default_threads_and_not_lose_on_one(one_thread, kept, tmp_path, monkeypatch):
    """On the extra thread count the model with the near miss need only not be slower than the checked one
    (ConvNeXt-T's 15 near misses: 1.054x on two Zen 4 threads, 1.013x on one, kept at 1.22x in all)."""
    monkeypatch.setattr(pipeline, "cpu_cores", lambda: 2)
    model, (a, b, c) = _chain(3)

    def speedup(ks, batch):
        if check.threads[-1] == 1:
            return 1.1 * (one_thread if len(ks) == 3 else 1.0)
        return 1.2 * (1.1 if len(ks) == 3 else 1.0)

    check = FakeModelCheck(speedup)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", threads=None, model_check=check)
    assert check.threads == [None, 1, None, 1]  # the decided model, then the variant against it, each on both
    assert _fused_convs(report) == ([a, b, c] if kept else [a, c])


class ReadingsCheck(FakeModelCheck):
    """A check whose one-thread readings of the fused model come from `one_thread` in turn, each with its
    rounds (`ratios`) spread +-0.04 around the reading's median, as compare returns them."""

    def __init__(self, one_thread: list[float]):
        super().__init__(lambda ks, batch: 1.0 if not ks else self.one_thread.pop(0) if self.threads[-1] == 1 else 1.3)
        self.one_thread = list(one_thread)

    def __call__(self, *args, **kwargs):
        r = super().__call__(*args, **kwargs)
        ratios = [r["speedup"] + d for d in np.linspace(-0.04, 0.04, 15)]
        return dict(r, ratios=ratios, speedup_q1=ratios[3], speedup_q3=ratios[11], slower=ratios[11] < 1.0)


@pytest.mark.parametrize("readings, kept", [([0.98, 1.06], True), ([0.98, 1.0], False), ([0.96], False),
                                             ([1.02], True)],
                         ids=["near the floor, then faster", "near the floor twice", "below the re-read margin",
                              "passes at once"])
def test_a_one_thread_reading_near_the_floor_is_read_again_and_judged_with_the_first(readings, kept, tmp_path,
                                                                                      monkeypatch):
    """On the extra thread count one 15-round reading spreads a few % on a shared 2-core CPU: a failure by
    less than MODEL_CHECK_REREAD is read again and both readings' rounds are judged together."""
    monkeypatch.setattr(pipeline, "cpu_cores", lambda: 2)
    model, (a, b) = _chain(2)
    check = ReadingsCheck(readings)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", threads=None, model_check=check)
    assert check.threads[:1 + len(readings)] == [None] + [1] * len(readings)
    assert check.one_thread == []  # every reading given was asked for, and no more
    assert bool(_fused_convs(report)) == kept
    if len(readings) == 2:
        pooled = (readings[0] + readings[1]) / 2
        assert any(note.startswith("whole-model check, the model with all 2 fusions, both readings, batch 1, 1 thread: "
                                   f"{pooled:.3f}x") for note in report.notes)


def test_a_reading_on_the_thread_count_decided_for_is_not_read_again_after_a_failure(tmp_path):
    """The thread count the model is decided for has its own rule (a pass near the floor is confirmed): a
    failure there stands."""
    model, (a, b) = _chain(2)

    class Check(ReadingsCheck):
        def __init__(self):
            super().__init__([])
            self.speedup = lambda ks, batch: 0.99 if ks else 1.0

    check = Check()
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", model_check=check)
    assert check.calls[:2] == [((8, 16), 1), ((8,), 1)]  # failed once, then the smaller half
    assert _fused_convs(report) == []


@pytest.mark.parametrize("readings, kept", [([0.985, 1.03], True), ([0.985, 0.99], False)],
                         ids=["near the floor, then faster", "near the floor twice"])
def test_a_near_miss_variants_one_thread_reading_near_the_floor_is_read_again(readings, kept, tmp_path, monkeypatch):
    """The variant with the near miss fused, against the checked model on one thread: the same re-read as the
    check's own readings."""
    monkeypatch.setattr(pipeline, "cpu_cores", lambda: 2)
    model, (a, b, c) = _chain(3)
    left = list(readings)

    def speedup(ks, batch):
        if check.threads[-1] == 1:
            return 1.1 * (left.pop(0) if len(ks) == 3 else 1.0)
        return 1.2 * (1.1 if len(ks) == 3 else 1.0)

    class Check(FakeModelCheck):
        def __call__(self, *args, **kwargs):
            r = super().__call__(*args, **kwargs)
            ratios = [r["speedup"] + d for d in np.linspace(-0.04, 0.04, 15)]
            return dict(r, ratios=ratios, speedup_q1=ratios[3], speedup_q3=ratios[11], slower=ratios[11] < 1.0)

    check = Check(speedup)
    _, report = _optimize(model, FakeTimer({a: (10.0, 20.0), b: (11.0, 10.0), c: (10.0, 20.0)}), tmp_path=tmp_path,
                          target="ort-cpu", precision="fp32", threads=None, model_check=check)
    assert check.threads == [None, 1, None, 1, 1] and left == []
    assert _fused_convs(report) == ([a, b, c] if kept else [a, c])
    assert any("against it, both readings, batch 1, 1 thread" in note for note in report.notes)


def test_bf16_on_the_cpu_is_measured_against_the_float32_convs(tmp_path, monkeypatch):
    """ONNX Runtime's CPU EP has no bfloat16 Conv: the candidates are timed against the float32 nodes the
    precision pass leaves there (tests/test_measure.py has the micro-models), each decision is measured,
    and whatever fuses computes the model within bf16's rounding."""
    from optimizer import measure
    from optimizer.verify import verify

    monkeypatch.setattr(measure, "cpu_bf16_unavailable", lambda: None)  # measured on any CPU (emulated or not)
    model, (a, b) = _chain(2)
    policy = FusionPolicy(mode="auto", cache_path=str(tmp_path / "cache.json"), model_check=False)
    optimized, report = optimize_model(model, target="ort-cpu", precision="bf16", policy=policy)
    assert report.costs.startswith("auto: measured on ")
    assert {d.node for d in report.decisions} == {a, b}
    assert all(d.source.startswith("measured") and d.ours_us and d.runtime_us for d in report.decisions)
    assert verify(model, optimized, precision="bf16")["worst_rel_l2"] <= 5e-2


def test_bf16_on_a_cpu_without_native_bf16_is_not_measured_and_says_why(tmp_path, monkeypatch):
    """Without AVX512-BF16 or AMX the bf16 FusedConv runs emulated, far slower than ORT's fp32 conv: no
    candidate is timed (each would spend the budget to find that), the report says why, and the static
    policy leaves every conv to ORT."""
    from optimizer import measure

    monkeypatch.setattr(measure, "_cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    model, (a, b) = _chain(2)
    policy = FusionPolicy(mode="auto", cache_path=str(tmp_path / "cache.json"))
    _, report = optimize_model(model, target="ort-cpu", precision="bf16", policy=policy)
    assert "neither AVX512-BF16 nor AMX" in report.costs
    assert _fused_convs(report) == [] and all(d.reason.startswith("static: ") for d in report.decisions)
    monkeypatch.setattr(measure, "_cpu_flags", lambda: {"avx512f", "amx_bf16"})
    assert measure.cpu_bf16_unavailable() is None
