"""Streaming model I/O: reading tensor by tensor and writing from numpy give back exactly the
model onnx itself reads and writes; the external-data path (models over 2 GB) round-trips."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from models import zoo
from optimizer.passes import save as save_module
from optimizer.passes.load import load_model, load_model_split
from optimizer.passes.save import save_model
from optimizer.proto import SMALL_TENSOR_BYTES, read_model
from tests.helpers import rel_l2, run_ort


def _arrays(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_read_model_splits_large_initializers_only(tmp_path):
    path = tmp_path / "m.onnx"
    original = zoo.build("yolo_tiny")
    onnx.save(original, path)
    model, weights = read_model(str(path), numpy_helper.to_array)
    expected = _arrays(original)
    assert weights and all(v.nbytes > SMALL_TENSOR_BYTES for v in weights.values())
    for name, v in weights.items():
        np.testing.assert_array_equal(v, expected[name])
    kept = {t.name for t in model.graph.initializer if t.name not in weights}
    assert kept and all(expected[n].nbytes <= SMALL_TENSOR_BYTES for n in kept)
    assert [n.name for n in model.graph.node] == [n.name for n in original.graph.node]
    assert model.opset_import == original.opset_import


def test_load_model_equals_onnx_load(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(zoo.build("mobilenetv3_tiny"), path)
    ours, theirs = load_model(str(path)), onnx.load(path)
    a, b = _arrays(ours), _arrays(theirs)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("cut", [10, 1000, -7])
def test_truncated_file_is_an_error_not_a_crash(tmp_path, cut):
    from optimizer.errors import EpifuseError

    path = tmp_path / "m.onnx"
    data = zoo.build("resnet_tiny").SerializeToString()
    path.write_bytes(data[:cut])
    with pytest.raises(EpifuseError):
        load_model_split(str(path))


def test_streamed_save_reads_back_identically(tmp_path):
    model = zoo.build("efficientnet_tiny")
    out = tmp_path / "o.onnx"
    save_model(model, str(out))
    back = onnx.load(out)
    onnx.checker.check_model(back)
    a, b = _arrays(back), _arrays(model)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_external_data_path_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr(save_module, "PROTOBUF_LIMIT", 1)  # force the > 2 GB layout on a small model
    model = zoo.build("resnet_tiny", batch=1)
    out = tmp_path / "o.onnx"
    save_model(model, str(out))
    assert (tmp_path / "o.onnx.data").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.onnx", "o.onnx.data"]
    light = onnx.load(out, load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in light.graph.initializer)
    back = load_model(str(out))
    a, b = _arrays(back), _arrays(model)
    assert all(np.array_equal(a[k], b[k]) for k in b)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    import onnxruntime as ort
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert rel_l2(sess.run(None, feeds)[0], run_ort(model, feeds)[0]) < 1e-6
