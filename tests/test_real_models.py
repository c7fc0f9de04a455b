"""Models written by other tools that ship inside installed packages (onnx's backend test data:
Caffe2-exported CNNs in `light/`, PyTorch exports in `pytorch-converted/` and
`pytorch-operator/`, `simple/`; onnxruntime's `datasets/`). Opsets 1-12, IR 3-7, old-style
initializers-as-inputs, sequences, strings. Each optimizes and verifies on ORT, or is refused
with an EpifuseError naming the file. Nothing is downloaded."""
from __future__ import annotations

import glob
import os

import onnx
import onnxruntime
import pytest

from optimizer.errors import EpifuseError
from optimizer.pipeline import optimize_file
from optimizer.verify import verify

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
ORT_DATA = os.path.join(os.path.dirname(onnxruntime.__file__), "datasets")
LIGHT = ("light_squeezenet", "light_shufflenet")  # the other seven: same ops, slower (all verify)


def _models() -> list[str]:
    paths = [os.path.join(ONNX_DATA, "light", f"{n}.onnx") for n in LIGHT]
    for kind in ("pytorch-converted", "pytorch-operator", "simple"):
        paths += sorted(glob.glob(os.path.join(ONNX_DATA, kind, "*", "model.onnx")))
    paths += sorted(glob.glob(os.path.join(ORT_DATA, "*.onnx")))
    return [p for p in paths if os.path.isfile(p)]


MODELS = _models()
# graphs with sequence values: onnx-graphsurgeon carries tensor types only, so load refuses them
# (found here: the optimized model declared the sequences as tensors)
SEQUENCE_MODELS = {f"test_sequence_model{i}" for i in range(1, 8)}


def _id(path: str) -> str:
    return os.path.relpath(path, os.path.dirname(os.path.dirname(path)) if path.endswith("model.onnx")
                           else os.path.dirname(path))


def test_models_found():
    assert len(MODELS) > 100, "onnx's backend test data is missing"


@pytest.mark.parametrize("path", MODELS, ids=[_id(p) for p in MODELS])
def test_real_model(path, tmp_path):
    name = os.path.basename(os.path.dirname(path))
    out = str(tmp_path / "o.onnx")
    if name in SEQUENCE_MODELS:
        with pytest.raises(EpifuseError, match="is a sequence: epifuse handles tensor values only"):
            optimize_file(path, out)
        assert not os.path.exists(out)
        return
    try:
        optimize_file(path, out)
        result = verify(path, out)
    except EpifuseError as e:
        assert "\n" not in str(e).strip() and (path in str(e) or out in str(e) or "--inputs" in str(e)), str(e)
        assert "internal error" not in str(e), str(e)
        # ORT itself cannot run these originals (opset-1/6 kernels removed, invalid sample
        # data): refusing is all the optimizer can do
        return
    assert result["passed"], result
