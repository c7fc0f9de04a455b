"""Writes the graphs of tests/data/dynamo/: one model per zoo family as `torch.onnx.export(...,
dynamo=True)` writes it at its default opset (symbolic batch), with the values of its large float
initializers left out (their names, types and shapes stay): the graph is the exporter's, the weights
are drawn at random by tests/test_dynamo_exports.py. Needs torch, torchvision, timm and ultralytics.

    python tests/data/export_dynamo_graphs.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import torch

OUT = Path(__file__).resolve().parent / "dynamo"
KEEP_ELEMENTS = 256  # smaller initializers (shapes, axes, scalars) keep their values


def families():
    import timm
    import torchvision

    yield "resnet", torchvision.models.resnet18(weights=None), 224
    yield "mobilenetv3", torchvision.models.mobilenet_v3_small(weights=None), 224
    yield "efficientnet", torchvision.models.efficientnet_b0(weights=None), 224
    yield "convnext", torchvision.models.convnext_tiny(weights=None), 224
    yield "ppocr_lcnet", timm.create_model("lcnet_050", pretrained=False), 224  # PaddleOCR's PP-LCNet backbone
    from ultralytics import YOLO

    yield "yolo", YOLO("yolov8n.yaml").model, 320


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    for i, t in enumerate(model.graph.initializer):
        count = 1
        for d in t.dims:
            count *= d
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and count > KEEP_ELEMENTS:
            placeholder = onnx.TensorProto(name=t.name, data_type=t.data_type, doc_string="epifuse: random")
            placeholder.dims.extend(t.dims)
            model.graph.initializer[i].CopyFrom(placeholder)
    return model


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, module, size in families():
        module.eval()
        x = torch.randn(2, 3, size, size)  # a dynamic dim needs an example of at least 2
        with torch.no_grad():
            module(x)
            program = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"],
                                        dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
        with tempfile.TemporaryDirectory() as tmp:
            program.save(f"{tmp}/m.onnx", external_data=True)
            model = onnx.load(f"{tmp}/m.onnx")
        onnx.save(skeleton(model), OUT / f"{name}.onnx")
        version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        print(f"{name}: opset {version}, {len(model.graph.node)} nodes, torch {torch.__version__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
