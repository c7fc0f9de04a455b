"""bench/torch_yolo.py: the PyTorch YOLOv8 with the ONNX model's weights computes what ONNX Runtime
computes on models/yolo.py's graph (fp32, CPU), so the benchmark's PyTorch columns time the same
network as the ONNX ones. Skipped where torch is not installed (CI)."""
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


@pytest.mark.parametrize("scale", ["n", "s"])
def test_torch_yolo_matches_onnx_runtime(scale):
    import onnxruntime as ort

    from models.yolo import yolov8
    from torch_yolo import YOLOv8

    model = yolov8(scale, size=128)
    net = YOLOv8.from_onnx(model, scale)
    x = np.random.default_rng(3).standard_normal((2, 3, 128, 128)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x})
    with torch.no_grad():
        actual = net(torch.from_numpy(x))
    assert len(actual) == len(expected) == 3
    for a, e in zip(actual, expected):
        a = a.numpy()
        assert a.shape == e.shape
        assert np.linalg.norm(a - e) / np.linalg.norm(e) < 1e-5


def test_weights_that_do_not_fit_are_refused():
    from models.yolo import yolov8
    from torch_yolo import YOLOv8

    with pytest.raises(ValueError, match="parameter|layers"):
        YOLOv8.from_onnx(yolov8("n", size=64), "s")
