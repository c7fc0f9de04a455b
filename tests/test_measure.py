"""The micro-models the costs are measured on (optimizer.measure): each side must compute what the
group computes in the model, or the times compare different work. Checked on ONNX Runtime against
the original model's own nodes, on random inputs."""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from models import activations as act
from optimizer.costs import NHWC_POOL, NHWC_POOL_GEMV
from optimizer.measure import OrtCpuTimer, OrtCudaTimer, fused_model, runtime_model, transpose_model
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.runtime import session_options
from tests.helpers import conv_net, rel_l2


class _Capture:
    """A timer that keeps each group and its micro-models, built while the group's nodes are still in
    the graph (the fuse pass rewrites them afterwards). Every group reads "slower" but those of the
    `faster` patterns."""

    device, library = "capture", "capture"

    def __init__(self, faster=()):
        self.groups, self.faster = [], set(faster)

    def group_times(self, group):
        group.models = {"runtime": runtime_model(group), "fused x2": fused_model(group, copies=2),
                        "fused, inputs from a source": fused_model(group, input_source=True),
                        "runtime, residual from a pool": runtime_model(group, residual_source=True),
                        "runtime, output into a pool": runtime_model(group, output_sink=True),
                        "runtime x2, NHWC in and out": runtime_model(group, 2, nhwc_io=True)}
        if not self.groups:
            group.cpu_times = OrtCpuTimer().group_times(group)
        self.groups.append(group)
        return (1.0, 2.0) if group.pattern in self.faster else (2.0, 1.0)  # "slower": measured once

    def transpose_times(self, shape, dtype):
        return 0.0


def _groups(build, tmp_path, precision="fp32", channels=8, batch=2, size=12, faster=()):
    model = onnx.shape_inference.infer_shapes(conv_net(build, channels=channels, batch=batch, size=size))
    capture = _Capture(faster)
    optimize_model(model, target="ort-cuda", precision=precision, policy=FusionPolicy(
        mode="auto", timer=capture, cache_path=str(tmp_path / "c.json")))
    return capture.groups


def _run(model, feeds):
    """Runs `model` on the feeds it declares (a residual that is the conv's own input is not fed twice)."""
    declared = {i.name for i in model.graph.input}
    return ort.InferenceSession(model.SerializeToString(), session_options(),
                                providers=["CPUExecutionProvider"]).run(None, {k: v for k, v in feeds.items()
                                                                            if k in declared})


PATTERNS = {
    "relu": lambda g, x: g.op("Relu", [g.conv_bn(x, 8, 16, 3, stride=2)]),
    "silu_post_residual": lambda g, x: g.op("Add", [act.silu(g, g.conv_bn(x, 8, 8, 3)), x]),
    "pre_residual_relu": lambda g, x: g.op("Relu", [g.op("Add", [g.conv_bn(x, 8, 8, 1), x])]),
    "paddle_hardswish": lambda g, x: act.hard_swish_paddle(g, g.conv_bn(x, 8, 8, 3)),
    "hardswish": lambda g, x: g.op("HardSwish", [g.conv_bn(x, 8, 8, 3)]),
    "depthwise_clip": lambda g, x: g.op("Clip", [g.conv_bn(x, 8, 8, 3, group=8), g.constant(0.0), g.constant(6.0)]),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_both_micro_models_compute_the_group(name, tmp_path):
    (group,) = _groups(PATTERNS[name], tmp_path)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(group.x_shape).astype(np.float32)
    z = rng.standard_normal(group.z_shape).astype(np.float32) if group.z is not None else None
    nchw = {"x": x, **({"z": z} if z is not None else {})}
    nhwc = {k: np.ascontiguousarray(v.transpose(0, 2, 3, 1)) for k, v in nchw.items()}
    reference = _run(group.models["runtime"], nchw)[0]
    for label, model in group.models.items():
        # the CUDA timer binds preallocated outputs (a CUDA graph keeps their addresses): shapes must be known
        for out in model.graph.output:
            dims = out.type.tensor_type.shape.dim
            assert dims and all(d.dim_value > 0 for d in dims), (label, out.name)
        outputs = _run(model, nhwc if "fused" in label or "NHWC" in label else nchw)
        for copy, y in enumerate(outputs):
            y = y if "runtime," in label and "NHWC" not in label or label == "runtime" else y.transpose(0, 3, 1, 2)
            # copies after the first have their own weights (scaled by 1 + copy/1000), so ORT cannot merge them
            assert rel_l2(y, reference) < (1e-5 if copy == 0 else 1e-2), label
        if len(outputs) > 1:
            assert not np.array_equal(outputs[0], outputs[1]), label


@pytest.mark.parametrize("precision, pattern, ops", [("fp16", NHWC_POOL_GEMV, {"Reshape", "MatMul"}),
                                                     ("fp32", NHWC_POOL, {"ReduceMean"})])
def test_a_small_pool_is_timed_as_the_model_runs_it_unfused(precision, pattern, ops, tmp_path):
    """pool_as_conv's candidate (a global pool over a 7x7 map after a fused conv): its runtime side is
    the pool inside the NHWC region — the layout pass's ReduceMean, nhwc_pools' GEMV where the target
    has it — not ONNX Runtime's NCHW GlobalAveragePool, which the optimized model would never run there."""
    groups = _groups(lambda g, x: g.op("GlobalAveragePool", [g.op("Relu", [g.conv_bn(x, 8, 16, 3)])]), tmp_path,
                     precision=precision, size=7, faster={"Conv+Relu"})
    (pool,) = [g for g in groups if g.pattern.startswith("GlobalAveragePool")]
    assert pool.pattern == pattern
    model = runtime_model(pool, copies=2)
    assert {n.op_type for n in model.graph.node} == ops
    assert [i.name for i in model.graph.input] == ["x", "x1"]  # each copy its own input: nothing to merge
    rng = np.random.default_rng(2)
    dtype = np.float16 if precision == "fp16" else np.float32
    n, c, h, w = pool.x_shape
    feeds = {i.name: rng.standard_normal((n, h, w, c)).astype(dtype) for i in model.graph.input}
    for out, name in zip(_run(model, feeds), ("x", "x1")):
        expected = feeds[name].astype(np.float64).mean(axis=(1, 2), keepdims=True)
        assert out.shape == (n, 1, 1, c) and rel_l2(out, expected) < (2e-3 if precision == "fp16" else 1e-6)


@pytest.mark.parametrize("size, ours", [(7, OrtCudaTimer.MAX_COPIES), (112, 5)])
def test_cuda_copies_keep_their_data_in_an_l2_share(size, ours, tmp_path):
    """The CUDA timer's copies of our side: as many as a ~300 µs replay needs for a small pool, but for a
    112x112x32 fp32 pool (3.2 MB a copy with its taps) only the 5 that fit 16 MB, as the runtime's 4
    copies' data fits L2: 32 copies had read from HBM, 0.4-1.0 µs of a 5 µs pool (H200)."""
    groups = _groups(lambda g, x: g.op("GlobalAveragePool", [g.op("Relu", [g.conv_bn(x, 8, 32, 1)])]), tmp_path,
                     batch=1, size=size, faster={"Conv+Relu"})
    (pool,) = [g for g in groups if g.pattern.startswith("GlobalAveragePool")]
    assert OrtCudaTimer.copies_for(pool) == (ours, OrtCudaTimer.RUNTIME_COPIES)


def test_micro_models_run_in_the_precision_the_model_will_run_in(tmp_path):
    (group,) = _groups(PATTERNS["relu"], tmp_path, precision="fp16")
    assert group.dtype == "fp16" and group.desc.dtype == 10
    for model in group.models.values():
        assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.FLOAT16}
        assert all(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer
                   if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16))


def test_the_cpu_timer_times_both_sides(tmp_path):
    (group,) = _groups(PATTERNS["pre_residual_relu"], tmp_path)
    ours, runtime, _ = group.cpu_times
    assert ours > 0 and runtime > 0
    timer = OrtCpuTimer()
    assert timer.transpose_times(group.x_shape, "fp32") > 0
    assert "threads" in timer.device and ort.__version__ in timer.library


def test_bf16_on_the_cpu_is_timed_against_the_float32_nodes(tmp_path):
    """The CPU EP has no bfloat16 Conv, and the precision pass leaves the convs it does not fuse in float32
    there: the runtime's side of a bf16 candidate is its float32 nodes, ours the bf16 FusedConv, fed and
    read through Casts that are left out of its time as the sources and sinks are. Both compute the group;
    the region's edge is timed as the Transpose and the Cast back to float32."""
    from optimizer.measure import INPUT_SOURCE, OUTPUT_SINK

    (group,) = _groups(PATTERNS["silu_post_residual"], tmp_path, precision="bf16")
    assert group.dtype == "bf16"
    runtime = runtime_model(group, residual_source=True, output_sink=True, dtype="fp32")
    ours = fused_model(group, input_source=True, float32_io=True)
    for model in (runtime, ours):
        assert {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]} == {
            onnx.TensorProto.FLOAT}
    assert {t.data_type for t in runtime.graph.initializer} == {onnx.TensorProto.FLOAT}
    fused = next(n for n in ours.graph.node if n.op_type == "FusedConv")
    weights = {t.name: t.data_type for t in ours.graph.initializer}
    assert weights[fused.input[1]] == weights[fused.input[2]] == onnx.TensorProto.BFLOAT16
    casts = [n.name for n in ours.graph.node if n.op_type == "Cast"]
    assert casts and all(c.startswith((INPUT_SOURCE, OUTPUT_SINK)) for c in casts)

    rng = np.random.default_rng(3)
    nchw = {"x": rng.standard_normal(group.x_shape).astype(np.float32)}
    nhwc = {k: np.ascontiguousarray(v.transpose(0, 2, 3, 1)) for k, v in nchw.items()}
    expected = _run(runtime, nchw)[0]
    assert rel_l2(_run(ours, nhwc)[0].transpose(0, 3, 1, 2), expected) < 2e-2  # bf16 rounding, not more

    timer = OrtCpuTimer()
    try:
        ours_us, runtime_us, _ = timer.group_times(group)
        edge_us = timer.transpose_times(group.x_shape, "bf16")
    finally:
        timer.close()
    assert ours_us > 0 and runtime_us > 0 and edge_us > 0
    x = rng.standard_normal((1, 5, 6, 3)).astype(np.float32)
    edge = transpose_model((1, 3, 5, 6), "bf16", cast_to_float32=True)
    assert [n.op_type for n in edge.graph.node] == ["Cast", "Transpose", "Cast"]
    (y,) = _run(edge, {"x": x})
    assert y.dtype == np.float32 and rel_l2(y, x.transpose(0, 3, 1, 2)) < 1e-2


def test_the_cpu_timer_measures_on_the_threads_asked_for(tmp_path):
    (group,) = _groups(PATTERNS["pre_residual_relu"], tmp_path)
    timer = OrtCpuTimer(threads=1)
    assert timer.device.endswith("(1 threads)")  # a measurement cache entry of its own
    ours, runtime, _ = timer.group_times(group)
    assert ours > 0 and runtime > 0
    timer.close()


def test_transpose_model_is_nhwc_to_nchw():
    x = np.random.default_rng(0).standard_normal((2, 5, 6, 3)).astype(np.float32)
    (y,) = ort.InferenceSession(transpose_model((2, 3, 5, 6), "fp32").SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.transpose(0, 3, 1, 2))


def test_each_measuring_session_profiles_to_a_file_of_its_own(monkeypatch):
    """ORT names a profile by the millisecond its session starts: the pair's sessions, often made within
    one, must not share a file (the first one's reading deleted the second one's profile). The worker's
    folder goes when it ends."""
    import threading
    from multiprocessing import Pipe

    from optimizer import measure

    prefixes = []
    real_session = ort.InferenceSession

    def recording_session(data, so, **kwargs):
        prefixes.append(so.profile_file_prefix)
        return real_session(data, so, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording_session)
    parent, child = Pipe()
    worker = threading.Thread(target=measure._cpu_worker, args=(child,))
    worker.start()
    m = transpose_model((1, 4, 3, 3), "fp32").SerializeToString()
    for _ in range(2):
        parent.send((m, m, "fp32", (), None))
        times = parent.recv()
        assert not isinstance(times, str), times
    parent.send(None)
    worker.join(timeout=30)
    assert len(prefixes) == 4 and len(set(prefixes)) == 4
    assert not worker.is_alive() and not os.path.exists(os.path.dirname(prefixes[0]))  # nothing left in /tmp


def _se_block(channels=32, size=14):
    """conv → Relu → squeeze-excite gate → broadcast Mul → conv: ORT's CPU EP runs the convs in NCHWc
    and the Mul in NCHW, so it reorders the Relu's output out of NCHWc and the Mul's output back in."""
    def build(g, x):
        with g.scope("expand"):
            y = g.op("Relu", [g.conv(x, channels, channels, 3)])
        gate = g.op("Sigmoid", [g.conv(g.op("GlobalAveragePool", [y]), channels, channels, 1)])
        with g.scope("project"):
            return g.conv(g.op("Mul", [y, gate]), channels, channels, 1)

    return onnx.shape_inference.infer_shapes(conv_net(build, channels=channels, size=size))


def test_the_cpu_timer_reads_where_a_model_leaves_and_enters_nchwc():
    model = _se_block()
    relu, mul, pool = (next(n for n in model.graph.node if n.op_type == op) for op in ("Relu", "Mul", "GlobalAveragePool"))
    timer = OrtCpuTimer()
    try:
        into, out_of = timer.reordered_tensors(model.SerializeToString())
    finally:
        timer.close()
    assert relu.output[0] in out_of and mul.output[0] in into
    assert model.graph.input[0].name in into  # the graph's NCHW input
    assert pool.output[0] not in into | out_of  # pool and gate conv both run NCHWc


def test_the_cpu_timer_times_a_groups_input_and_output_reorders_apart(tmp_path):
    """A lone 32-channel conv: ORT reorders its input into NCHWc and its output out of it; those times
    come apart from the runtime's kernel time, which leaves them out."""
    def build(g, x):
        return g.op("Relu", [g.conv(x, 32, 32, 3)])

    captured = []

    class Capture(_Capture):
        def group_times(self, group):
            timer = OrtCpuTimer()
            try:
                captured.append(timer.group_times(group))
            finally:
                timer.close()
            return 2.0, 1.0

    model = onnx.shape_inference.infer_shapes(conv_net(build, channels=32, size=28, batch=1))
    optimize_model(model, target="ort-cpu", policy=FusionPolicy(mode="auto", timer=Capture(),
                                                                cache_path=str(tmp_path / "c.json")))
    (ours, runtime, (reorder_in, reorder_out)), = captured
    assert ours > 0 and runtime > 0 and reorder_in > 0 and reorder_out > 0


def test_the_sources_a_micro_model_reads_from_are_left_out_of_its_time(tmp_path):
    """The 1x1 MaxPools that write the inputs fresh (ours) and the residual (ORT's), and the one that reads
    ORT's output, are not the group's work; ORT renames a pool it moves into NCHWc after its output, so
    the outputs carry the prefix too."""
    from optimizer.measure import INPUT_SOURCE, OUTPUT_SINK, RESIDUAL_SOURCE, _median_run_us

    def residual_block(g, x):  # the second conv's residual is the block's input, not its own
        return g.op("Add", [act.silu(g, g.conv_bn(g.op("Relu", [g.conv_bn(x, 16, 16, 3)]), 16, 16, 3)), x])

    group = next(g for g in _groups(residual_block, tmp_path, channels=16, size=28) if g.z is not None)
    for model, source in ((fused_model(group, input_source=True), INPUT_SOURCE),
                          (runtime_model(group, residual_source=True), RESIDUAL_SOURCE),
                          (runtime_model(group, output_sink=True), OUTPUT_SINK)):
        so = session_options(allow_spinning=False)
        so.enable_profiling = True
        so.profile_file_prefix = str(tmp_path / "profile")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
                 for i in sess.get_inputs()}
        for _ in range(3):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        pools = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                 and e["args"].get("op_name") == "MaxPool"]
        assert pools and all(e["name"].startswith(source) for e in pools), [e["name"] for e in pools]
        everything = _median_run_us(events, ())
        assert _median_run_us(events, ("ReorderInput", "ReorderOutput")) <= everything


def test_a_hardswish_is_timed_fused_into_the_runtimes_conv_as_in_a_model(tmp_path):
    """ORT's CPU EP folds a HardSwish into its NCHWc conv only where a node reads the HardSwish; as a
    micro-model's output it runs HardSigmoid and Mul after the conv. The runtime side the CPU timer
    measures has its output read by a sink, so it times the conv ORT runs inside a model."""
    (group,) = _groups(lambda g, x: g.op("HardSwish", [g.conv_bn(x, 16, 16, 3)]), tmp_path, channels=16)

    def ops_after_ort(model):
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / "after_ort.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        after = onnx.load(so.optimized_model_filepath)
        return [(n.op_type, next((onnx.helper.get_attribute_value(a).decode() for a in n.attribute
                                  if a.name == "activation"), None)) for n in after.graph.node]

    assert ("Conv", "HardSwish") in ops_after_ort(runtime_model(group, residual_source=True, output_sink=True))
    assert ("HardSigmoid", None) in ops_after_ort(runtime_model(group))  # what the sink avoids
