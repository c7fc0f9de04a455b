"""Writes the graphs of tests/data/torchscript/: models whose exports compute Reshape and Slice sizes
from Shape ops, as torch.onnx's TorchScript exporter (`dynamo=False`, still the default of many tools)
writes them with a symbolic batch: ShuffleNetV2's channel shuffles and splits, MobileViT's patch
unfolding. Large float initializers are left out as in tests/data/dynamo/ (export_dynamo_graphs.py);
tests/test_torchscript_exports.py draws them. Needs torch, torchvision and timm.

    python tests/data/export_torchscript_graphs.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_dynamo_graphs import skeleton  # noqa: E402

OUT = Path(__file__).resolve().parent / "torchscript"


def models():
    import timm
    import torchvision

    yield "shufflenet_v2", torchvision.models.shufflenet_v2_x0_5(weights=None), 224
    yield "mobilevit", timm.create_model("mobilevit_xxs", pretrained=False), 256


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, module, size in models():
        module.eval()
        with tempfile.TemporaryDirectory() as tmp:
            torch.onnx.export(module, (torch.randn(1, 3, size, size),), f"{tmp}/m.onnx", input_names=["x"],
                              output_names=["y"], opset_version=17, dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                              dynamo=False)
            model = onnx.load(f"{tmp}/m.onnx")
        onnx.save(skeleton(model), OUT / f"{name}.onnx")
        shapes = sum(n.op_type == "Shape" for n in model.graph.node)
        print(f"{name}: {len(model.graph.node)} nodes, {shapes} Shape, torch {torch.__version__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
