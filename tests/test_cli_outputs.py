"""What `epifuse optimize` leaves on disk when a check after the write fails, and which paths its
report may not take."""
import os
import stat

import numpy as np
import onnx
import pytest

from models import zoo
from optimizer.cli import main


def _source(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    return src


def test_a_failed_verification_removes_the_output(tmp_path, monkeypatch, capsys):
    import optimizer.verify

    src, out = _source(tmp_path), tmp_path / "o.onnx"
    monkeypatch.setattr(optimizer.verify, "verify", lambda *a, **k: {
        "provider": "CPUExecutionProvider", "passed": False, "worst_rel_l2": 1.0, "tolerance": 1e-5, "outputs": 1,
        "rel_l2": {"y": 1.0}})
    assert main(["optimize", str(src), "-o", str(out), "--verify"]) == 1
    assert not out.exists() and "not written" in " ".join(capsys.readouterr().out.split())  # rich wraps lines


def test_the_report_may_not_overwrite_a_model(tmp_path, capsys):
    src, out = _source(tmp_path), tmp_path / "o.onnx"
    before = src.read_bytes()
    assert main(["optimize", str(src), "-o", str(out), "--report", str(src)]) == 2
    assert src.read_bytes() == before
    assert "--report would overwrite a model" in capsys.readouterr().err
    assert not out.exists()


def test_output_paths_that_are_not_files_are_refused(tmp_path, capsys):
    src = _source(tmp_path)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    for out, message in ((tmp_path / "folder", "is a folder"), (tmp_path / "pipe", "not a regular file"),
                         ("", "the output path is empty")):
        assert main(["optimize", str(src), "-o", str(out)]) == 2, out
        assert message in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)


def test_the_output_may_not_be_a_file_the_input_references(tmp_path, capsys):
    from onnx import external_data_helper

    model = zoo.build("resnet_tiny", batch=1)
    external_data_helper.convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    before = (tmp_path / "weights.bin").read_bytes()
    assert main(["optimize", str(src), "-o", str(tmp_path / "weights.bin")]) == 2
    assert "external data file" in capsys.readouterr().err
    assert (tmp_path / "weights.bin").read_bytes() == before
    # a model over 2 GB writes OUT.data beside OUT: here that path leads to the input's weights
    os.symlink(tmp_path / "weights.bin", tmp_path / "alias.onnx.data")
    assert main(["optimize", str(src), "-o", str(tmp_path / "alias.onnx")]) == 2
    assert (tmp_path / "weights.bin").read_bytes() == before


def test_outputs_follow_the_umask(tmp_path):
    src, out = _source(tmp_path), tmp_path / "o.onnx"
    old = os.umask(0o022)
    try:
        assert main(["optimize", str(src), "-o", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_verify_of_a_truncated_file_is_one_line(tmp_path, capsys):
    src = _source(tmp_path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(src.read_bytes()[:5000])
    assert main(["verify", str(cut), str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cut.onnx" in err


def test_a_missing_library_is_one_line(tmp_path, capsys, monkeypatch):
    from optimizer import libraries

    monkeypatch.setattr(libraries, "_candidates", lambda name: [tmp_path / "nowhere" / name])
    src = _source(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--fuse", "static", "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "libepifuse_ort.so not found" in err
    assert not (tmp_path / "o.onnx").exists()


def test_a_model_optimized_for_ort_cuda_reoptimized_for_tensorrt_loses_the_cuda_only_op(tmp_path):
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    model = onnx.shape_inference.infer_shapes(zoo.build("resnet_tiny", batch=1))
    cuda, _ = optimize_model(model, target="ort-cuda", policy=FusionPolicy(mode="always"))
    assert "NchwToNhwc" in [n.op_type for n in cuda.graph.node]
    trt, _ = optimize_model(cuda, target="tensorrt", policy=FusionPolicy(mode="always"))
    assert "NchwToNhwc" not in [n.op_type for n in trt.graph.node]
    assert verify(model, trt)["passed"]


def test_one_line_errors_for_bad_arguments_and_a_machine_without_a_gpu(tmp_path, capsys, monkeypatch):
    from optimizer import measure

    monkeypatch.setattr(measure, "cuda_device_name", lambda: None)
    src = _source(tmp_path)
    cases = [
        (["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "missing" / "r.json")],
         "--report: folder does not exist"),
        (["bench", str(src), "--backend", "ort-cpu", "--runs", "0"], "--runs must be at least 1"),
        (["compare", str(src), str(src), "--backend", "ort-cpu", "--runs", "1"], "--runs must be at least 2"),
    ]
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        cases.append((["tune", str(src)], "no CUDAExecutionProvider"))
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (args, err)
    assert not (tmp_path / "o.onnx").exists()


def test_a_bf16_model_for_the_cuda_ep_that_the_cpu_cannot_run_is_explained(tmp_path, capsys):
    """ORT's CPU EP has no bfloat16 ReduceMean or MatMul (EfficientNet's squeeze-excite pools): --verify of
    a bf16 model made for the CUDA EP stops with that reason and how to check it instead, writing nothing.
    Where a later ORT gains the kernels, the model verifies instead."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("efficientnet_tiny", batch=1), src)
    code = main(["optimize", str(src), "-o", str(out), "--target", "ort-cuda", "--precision", "bf16", "--verify"])
    if code == 0:
        return
    assert code == 2 and not out.exists()
    assert "no bfloat16 kernels" in capsys.readouterr().err


@pytest.mark.parametrize("precision, allow_tf32", [("fp32", 1), ("fp32-strict", None)])
def test_fp32_strict_keeps_tf32_off_the_fused_convs(tmp_path, precision, allow_tf32):
    """--precision fp32 lets an ort-cuda model's FusedConvs compute in TF32; fp32-strict does not."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--target", "ort-cuda", "--precision", precision,
                     "--fuse", "always"]) == 0
    fused = [n for n in onnx.load(out).graph.node if n.op_type == "FusedConv"]
    assert fused
    assert {next((a.i for a in n.attribute if a.name == "allow_tf32"), None) for n in fused} == {allow_tf32}


def _overflowing_model():
    """Conv (weights 3000) -> Relu -> Conv: the first conv's outputs reach ~1e5 on normal inputs, past fp16's
    65504, while the model's fp32 outputs stay finite."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(np.full((8, 16, 3, 3), 3000.0, np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 1e-3).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["t"], name="big_conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["t"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="small_conv")],
        "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 12])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_fp16_overflow_of_the_model_itself_is_named(tmp_path, capsys):
    """A model whose own values pass fp16's range fails the fp16 check with inf outputs; the report says
    where the original overflows (the tensor and its node) and what to use instead, and writes nothing."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_overflowing_model(), src)
    code = main(["optimize", str(src), "-o", str(out), "--target", "ort-cuda", "--precision", "fp16",
                 "--fuse", "always", "--verify"])
    text = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert code == 1 and not out.exists()
    assert "big_conv" in text and "65504" in text and "--precision fp32 or bf16" in text, text


def test_no_overflow_diagnosis_where_the_model_stays_in_fp16_range(tmp_path):
    from optimizer.verify import fp16_overflow, random_inputs

    model = _overflowing_model()
    assert "big_conv" in fp16_overflow(model, random_inputs(model))
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.full((8, 16, 3, 3), 0.01, np.float32), "w1"))
    assert fp16_overflow(model, random_inputs(model)) is None
