"""Bad input gets one clear line, exit code 2 and no output file; the input is never modified;
saving is atomic."""
import hashlib
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import zoo
from optimizer.cli import main
from optimizer.errors import EpifuseError
from optimizer.passes.load import load_model
from optimizer.passes.save import save_model


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny"), path)
    return path


def _cli_error(capsys, args, out_path):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert not os.path.exists(out_path)
    assert not [f for f in os.listdir(os.path.dirname(out_path)) if f.endswith(".tmp")]
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "epifuse: error:" in lines[0]
    return lines[0]


def test_missing_file(tmp_path, capsys):
    msg = _cli_error(capsys, ["optimize", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o.onnx")],
                     str(tmp_path / "o.onnx"))
    assert "nope.onnx" in msg and "no such file" in msg


def test_not_onnx(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_text("this is not a protobuf\n" * 10)
    msg = _cli_error(capsys, ["optimize", str(bad), "-o", str(tmp_path / "o.onnx")], str(tmp_path / "o.onnx"))
    assert "bad.onnx" in msg and "not an ONNX model" in msg


def test_truncated_protobuf(tmp_path, model_file, capsys):
    data = model_file.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    msg = _cli_error(capsys, ["optimize", str(cut), "-o", str(tmp_path / "o.onnx")], str(tmp_path / "o.onnx"))
    assert "cut.onnx" in msg


def test_unsupported_opset(tmp_path, capsys):
    from optimizer.passes.load import max_opset

    m = zoo.build("resnet_tiny")
    m.opset_import[0].version = max_opset() + 1
    path = tmp_path / "new.onnx"
    onnx.save(m, path)
    msg = _cli_error(capsys, ["optimize", str(path), "-o", str(tmp_path / "o.onnx")], str(tmp_path / "o.onnx"))
    assert f"unsupported opset {max_opset() + 1}" in msg


def test_every_opset_onnx_and_onnxruntime_both_support_is_accepted():
    """Opsets 22 and newer, where the installed onnx and onnxruntime have them."""
    from optimizer.passes.load import max_opset
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.verify import verify

    assert max_opset() >= 21
    for version in range(21, max_opset() + 1):
        m = zoo.build("resnet_tiny", batch=1)
        m.opset_import[0].version = version
        m.ir_version = 10
        optimized, _ = optimize_model(onnx.shape_inference.infer_shapes(m), policy=FusionPolicy(mode="always"))
        assert verify(m, optimized)["passed"], version


def test_minus_one_dims_are_symbolic(tmp_path):
    """paddle2onnx writes dynamic dims as -1 (rapidocr's text-direction classifier); ORT runs such models."""
    from optimizer.cli import main

    m = zoo.build("resnet_tiny", batch=1)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_value = -1
    dims[2].dim_value = -1
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = -1
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    assert main(["optimize", str(src), "-o", str(out), "--verify"]) == 0
    assert not onnx.load(out).graph.input[0].type.tensor_type.shape.dim[2].HasField("dim_value")


def test_external_data_outside_the_model_folder(tmp_path, capsys):
    inner = tmp_path / "inner"
    inner.mkdir()
    w = np.ones((4, 2, 1, 1), np.float32)
    (tmp_path / "secret.bin").write_bytes(w.tobytes())
    tensor = numpy_helper.from_array(w, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = k, v
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [tensor])
    path = inner / "escape.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    msg = _cli_error(capsys, ["optimize", str(path), "-o", str(inner / "o.onnx")], str(inner / "o.onnx"))
    assert "outside the model's folder" in msg and "'w'" in msg


def test_output_equal_to_input_is_refused_and_input_untouched(model_file, capsys):
    digest = hashlib.sha256(model_file.read_bytes()).hexdigest()
    code = main(["optimize", str(model_file), "-o", str(model_file)])
    assert code == 2
    assert "output path is the input model" in capsys.readouterr().err
    assert hashlib.sha256(model_file.read_bytes()).hexdigest() == digest


def test_old_opset_is_converted(tmp_path):
    # a plain opset-9 conv net, as old exporters wrote them
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [numpy_helper.from_array(np.ones((3, 2, 1, 1), np.float32), "w")])
    down = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    down.ir_version = 4
    path = tmp_path / "old.onnx"
    onnx.save(down, path)
    loaded = load_model(str(path))
    assert loaded.opset_import[0].version == 13


def test_save_is_atomic_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    out = tmp_path / "o.onnx"
    out.write_bytes(b"previous")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        save_model(zoo.build("resnet_tiny"), str(out))
    assert out.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["o.onnx"]


def test_output_folder_missing(tmp_path):
    with pytest.raises(EpifuseError, match="output folder does not exist"):
        save_model(zoo.build("resnet_tiny"), str(tmp_path / "no" / "o.onnx"))


def test_an_initializer_listed_as_a_graph_input_stays_an_overridable_input(tmp_path):
    """IR >= 4: such an initializer is a default the caller may replace; the optimized model keeps the
    input (and does not fold the default into anything), so a fed value still takes effect."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from optimizer.pipeline import FusionPolicy, optimize_file
    from optimizer.runtime import session_options

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 5, 5]),
                           helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [4, 3, 3, 3])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 5, 5])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    optimize_file(str(src), str(out), policy=FusionPolicy(mode="always"))
    optimized = onnx.load(out)
    assert [i.name for i in optimized.graph.input] == ["x", "w"] and "w" in [t.name for t in optimized.graph.initializer]
    feeds = {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
             "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    for subset in (feeds, {"x": feeds["x"]}):
        expected = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, subset)[0]
        actual = ort.InferenceSession(str(out), session_options(), providers=["CPUExecutionProvider"]).run(None, subset)[0]
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("as_split", [False, True])
def test_scalar_initializers_stay_scalars(tmp_path, as_split):
    """A 0-D initializer (a Gather index, a Pow exponent) is written 0-D, whole models and split ones alike:
    written as [1], Gather(shape, index) gives [1] instead of a scalar and the Concat after it refuses its
    inputs' ranks (a model ONNX Runtime cannot load)."""
    from optimizer.proto import SplitModel, skeleton

    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["g"], axis=0),
         helper.make_node("Unsqueeze", ["g", "axes"], ["u"]), helper.make_node("Concat", ["u", "tail"], ["y"], axis=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
        [numpy_helper.from_array(np.array(0, np.int64), "i"), numpy_helper.from_array(np.array([0], np.int64), "axes"),
         numpy_helper.from_array(np.array([7], np.int64), "tail")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if as_split:  # the weights as numpy arrays beside the structure, as the optimizer writes its output
        weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        model = SplitModel(skeleton(model, keep_small=False, weights_as_inputs=True), weights)
    path = str(tmp_path / "scalar.onnx")
    save_model(model, path)
    saved = onnx.load(path)
    assert [list(t.dims) for t in saved.graph.initializer if t.name == "i"] == [[]]
    import onnxruntime as ort
    y = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": np.zeros((5, 3), np.float32)})[0]
    assert y.tolist() == [5, 7]
