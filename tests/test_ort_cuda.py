"""The ONNX Runtime CUDA EP end to end: every zoo model optimized for --target ort-cuda runs its
FusedConv nodes on the CUDAExecutionProvider (checked in ORT's profile) and matches the
original model run by ORT's own CUDA EP. Needs onnxruntime-gpu and a CUDA build of the library
(`pytest -m gpu` on the GPU machine)."""
import json
import os

import numpy as np
import pytest

from models import zoo

pytestmark = pytest.mark.gpu
# fp32: the fused convs may compute in TF32 (allow_tf32), against a reference without it; fp32-strict: not
TOL = {"fp32": 5e-3, "fp32-strict": 1e-5, "fp16": 1e-2}


@pytest.fixture(scope="module")
def ort_gpu():
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    return ort


def _run(ort, model_bytes, feeds, library: bool, profile_dir=None, prefer_nhwc=False):
    from optimizer.runtime import session_options

    so = session_options() if library else ort.SessionOptions()
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "epifuse")
    # the reference without TF32 (ORT's CUDA EP default), which would cost it ~1e-3 in fp32
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0", "prefer_nhwc": "1" if prefer_nhwc else "0"})
    sess = ort.InferenceSession(model_bytes, so, providers=[cuda, "CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    profile = sess.end_profiling() if profile_dir else None
    return outs, profile


# prefer_nhwc: ORT also moves the ops between FusedConv regions to NHWC (what bench/ort_models.py times);
# pdl: EPIFUSE_PDL=1, the SM90 kernels launched as programmatic dependents of the kernel before them.
@pytest.mark.parametrize("precision,prefer_nhwc,pdl", [("fp16", False, False), ("fp32", False, False),
                                                       ("fp32-strict", False, False), ("fp16", True, False),
                                                       ("fp16", False, True)])
@pytest.mark.parametrize("name", sorted(set(zoo.ZOO)))
def test_zoo_model_on_cuda_ep(ort_gpu, name, precision, prefer_nhwc, pdl, tmp_path, monkeypatch):
    from optimizer.passes.load import validate
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import random_inputs, rel_l2

    if pdl:
        monkeypatch.setenv("EPIFUSE_PDL", "1")
    original = validate(zoo.build(name, batch=2))
    optimized, report = optimize_model(original, target="ort-cuda", precision=precision.removesuffix("-strict"),
                                       policy=FusionPolicy(allow_tf32=precision != "fp32-strict"))
    feeds = random_inputs(original, seed=1)
    expected, _ = _run(ort_gpu, original.SerializeToString(), feeds, library=False)
    actual, profile = _run(ort_gpu, optimized.SerializeToString(), feeds, library=True, profile_dir=str(tmp_path),
                           prefer_nhwc=prefer_nhwc)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and np.isfinite(a).all()
        assert rel_l2(a, e) <= TOL[precision], (name, precision, rel_l2(a, e))
    events = json.load(open(profile))
    fused = [ev for ev in events if ev.get("args", {}).get("op_name") == "FusedConv"]
    assert fused, "no FusedConv in the profile"
    providers = {ev["args"].get("provider") for ev in fused}
    assert providers == {"CUDAExecutionProvider"}, providers
    assert report.fused_count() > 0
    layout = {ev["args"].get("provider") for ev in events if ev.get("args", {}).get("op_name") == "NchwToNhwc"}
    assert layout <= {"CUDAExecutionProvider"}, layout  # the RGB input's layout op, where the model has one


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(2, 3, 37, 41), (1, 1, 5, 3), (4, 8, 16, 1), (32, 3, 64, 64)])
def test_layout_op_on_cuda_ep_transposes_exactly(ort_gpu, dtype, shape):
    """epifuse::NchwToNhwc's CUDA kernel (plugins/kernels/layout.cu), on ORT's stream, bit-exact."""
    from onnx import TensorProto, helper

    from optimizer.runtime import session_options

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    node = helper.make_node("NchwToNhwc", ["x"], ["y"], name="to_nhwc", domain="epifuse")
    out = [shape[0], shape[2], shape[3], shape[1]]
    graph = helper.make_graph([node], "layout", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, out)])
    model = helper.make_model(graph, ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    so = session_options()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # the CUDA kernel or no session
    sess = ort_gpu.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    (y,) = sess.run(None, {"x": x})
    assert np.array_equal(y, x.transpose(0, 2, 3, 1))


def test_tune_fills_the_cache_and_later_sessions_use_it(ort_gpu, tmp_path, monkeypatch):
    import onnx

    from optimizer.cli import main

    cache = tmp_path / "tuning.tsv"
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(cache))
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("yolo_tiny", batch=2), src)
    assert main(["optimize", str(src), "-o", str(out), "--target", "ort-cuda", "--precision", "fp16"]) == 0
    assert main(["tune", str(out), "--batch", "2"]) == 0
    lines = cache.read_text().splitlines()
    assert lines and all(len(line.split("\t")) == 3 for line in lines)
    kernels = {line.split("\t")[2] for line in lines}
    assert all(k.startswith(("sm90_", "sm80_", "im2col_", "pad8_", "cuda_")) for k in kernels)
    assert main(["bench", str(out), "--backend", "ort-cuda", "--batch", "2", "--runs", "5"]) == 0


@pytest.mark.parametrize("tune", [False, True])
@pytest.mark.parametrize("size,batch", [(56, 1), (40, 3)])
def test_split_global_pool_repeats_run_after_run(ort_gpu, size, batch, tune, tmp_path, monkeypatch):
    """A global pool over a large map as cuda_depthwise_global: its pixel ranges leave partial sums in the
    workspace ORT keeps for the node, and a second kernel, launched as a programmatic dependent, adds them.
    Every run must match ORT's pool, also after tuning timed other kernels in that workspace first."""
    import onnx

    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.runtime import session_options
    from optimizer.verify import rel_l2
    from tests.helpers import conv_net

    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuning.tsv"))
    monkeypatch.setenv("EPIFUSE_TUNE", "1" if tune else "0")

    def build(g, x):
        with g.scope("c0"):
            y = g.op("Relu", [g.conv_bn(x, 8, 64, 3)])
        return g.op("GlobalAveragePool", [y])

    original = onnx.shape_inference.infer_shapes(conv_net(build, size=size, batch=batch))
    optimized, report = optimize_model(original, target="ort-cuda", precision="fp32",
                                       policy=FusionPolicy(mode="always", allow_tf32=False))
    assert report.canonicalized["GlobalAveragePool → depthwise Conv (ort-cuda)"] == 1
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})
    reference = ort_gpu.InferenceSession(original.SerializeToString(), providers=[cuda])
    ours = ort_gpu.InferenceSession(optimized.SerializeToString(), session_options(), providers=[cuda])
    name = original.graph.input[0].name
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((batch, 8, size, size)).astype(np.float32)
        (expected,), (actual,) = reference.run(None, {name: x}), ours.run(None, {name: x})
        err = rel_l2(actual, expected)
        assert np.isfinite(actual).all() and err <= TOL["fp32-strict"], (seed, err)
