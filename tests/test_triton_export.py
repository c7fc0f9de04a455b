"""`epifuse export-triton`: configs parse with Triton's own ModelConfig protobuf, the exported ONNX
model runs on ONNX Runtime with the library exactly as the config names it, and the TensorRT path
works from a plan (any bytes) and fails clearly without TensorRT."""
from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from models import zoo
from optimizer import cli, runtime
from optimizer.pipeline import optimize_model

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                       reason="Triton's ModelConfig protobuf: pip install 'tritonclient[grpc]'")
text_format = pytest.importorskip("google.protobuf.text_format")


def parse_config(folder) -> "model_config_pb2.ModelConfig":
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module", params=["dynamic", "static"])
def models(request, tmp_path_factory):
    """(original, optimized) paths of a small ResNet with a symbolic or a fixed batch."""
    folder = tmp_path_factory.mktemp(request.param)
    original = zoo.resnet_tiny(batch=zoo.DYNAMIC_BATCH if request.param == "dynamic" else 2)
    optimized, _ = optimize_model(original, target="ort-cpu")
    paths = folder / "resnet.onnx", folder / "resnet.epifuse.onnx"
    onnx.save(original, str(paths[0]))
    onnx.save(optimized, str(paths[1]))
    return request.param, paths[0], paths[1]


def export(*args) -> int:
    return cli.main(["export-triton", *map(str, args)])


def test_onnxruntime_config_and_model_run_as_configured(models, tmp_path):
    kind, original, optimized = models
    library = runtime.library_path(runtime.ORT_LIBRARY)
    assert export(optimized, "--repo", tmp_path, "--backend", "onnxruntime", "--instances", "2",
                  "--library", library, "--ort-param", "cudnn_conv_algo_search=1") == 0
    folder = tmp_path / "resnet"
    config = parse_config(folder)
    assert config.name == "resnet" and config.backend == "onnxruntime"
    assert list(config.model_operations.op_library_filename) == [str(library)]
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert config.parameters["cudnn_conv_algo_search"].string_value == "1"
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    if kind == "dynamic":
        assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
        assert list(config.input[0].dims) == [3, 64, 64]
    else:
        assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
        assert list(config.input[0].dims) == [2, 3, 64, 64]
    assert sorted(p.name for p in folder.rglob("*")) == ["1", "config.pbtxt", "model.onnx"]

    so = ort.SessionOptions()
    so.register_custom_ops_library(config.model_operations.op_library_filename[0])
    exported = ort.InferenceSession(str(folder / "1" / "model.onnx"), so, providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    shape = [2, *config.input[0].dims] if config.max_batch_size else list(config.input[0].dims)
    feeds = {config.input[0].name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
    names = [o.name for o in config.output]
    for got, want in zip(exported.run(names, feeds), reference.run(names, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_library_is_the_image_path(models, tmp_path):
    _, _, optimized = models
    assert export(optimized, "--repo", tmp_path, "--backend", "onnxruntime", "--name", "m") == 0
    config = parse_config(tmp_path / "m")
    assert list(config.model_operations.op_library_filename) == ["/opt/epifuse/lib/libepifuse_ort.so"]


def test_tensorrt_config_from_plan(models, tmp_path):
    kind, _, optimized = models
    plan = tmp_path / "resnet.plan"
    plan.write_bytes(b"not really an engine")
    repo = tmp_path / "repo"
    assert export(plan, "--repo", repo, "--backend", "tensorrt", "--onnx", optimized, "--max-batch", "16",
                  "--gpus", "0,1") == 0
    config = parse_config(repo / "resnet")
    assert config.platform == "tensorrt_plan" and not config.HasField("model_operations")
    assert (repo / "resnet" / "1" / "model.plan").read_bytes() == plan.read_bytes()
    assert list(config.instance_group[0].gpus) == [0, 1]
    assert config.max_batch_size == (16 if kind == "dynamic" else 0)
    # A plan alone: no inputs/outputs, Triton's auto-complete reads them from the engine.
    assert export(plan, "--repo", repo, "--backend", "tensorrt", "--name", "bare") == 0
    bare = parse_config(repo / "bare")
    assert bare.max_batch_size == 0 and not bare.input and not bare.output


def test_tensorrt_from_onnx_without_tensorrt_is_a_clear_error(models, tmp_path, monkeypatch, capsys):
    _, _, optimized = models
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx_bindings", None)
    assert export(optimized, "--repo", tmp_path, "--backend", "tensorrt") == 2
    err = capsys.readouterr().err
    assert "needs TensorRT" in err and "epifuse build-engine" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_existing_folder_needs_force(models, tmp_path, capsys):
    _, _, optimized = models
    args = [optimized, "--repo", tmp_path, "--backend", "onnxruntime"]
    assert export(*args) == 0
    marker = tmp_path / "resnet" / "stale"
    marker.write_text("")
    assert export(*args) == 2
    assert "pass --force" in capsys.readouterr().err and marker.exists()
    assert export(*args, "--force") == 0
    assert not marker.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["resnet"]


@pytest.mark.parametrize("args, message", [
    (["missing.onnx", "--backend", "onnxruntime"], "no such file"),
    (["m.plan", "--backend", "onnxruntime"], "can only be served with --backend tensorrt"),
    (["{model}", "--backend", "onnxruntime", "--library", "lib.so"], "--library must be an absolute path"),
    (["{model}", "--backend", "onnxruntime", "--max-batch", "0"], "must be at least 1"),
    (["{model}", "--backend", "onnxruntime", "--ort-param", "nokey"], "expected KEY=VALUE"),
    (["{junk}", "--backend", "onnxruntime"], "not an ONNX model"),
])
def test_errors_are_one_line_exit_2(models, tmp_path, capsys, args, message):
    _, _, optimized = models
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\x00garbage")
    args = [a.format(model=optimized, junk=junk) for a in args]
    assert export(*args, "--repo", tmp_path / "repo") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("epifuse: error:")
    assert not (tmp_path / "repo").exists() or not list((tmp_path / "repo").iterdir())
