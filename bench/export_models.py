"""Exports the benchmark's held-out architectures to ONNX (fp32, opset 17, symbolic batch), with random
weights and random BatchNorm statistics so folding is not a no-op: torchvision and timm models, and
YOLOv8n through ultralytics. Models whose package is missing are skipped with a line saying so.

    python bench/export_models.py OUT_DIR [--models resnet18,mobilenet_v2,...]

Needs torch (and torchvision / timm / ultralytics for their models); the project itself does not.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

# name -> (package, constructor name, input size)
MODELS = {
    "resnet18": ("torchvision", "resnet18", 224),
    "resnet50": ("torchvision", "resnet50", 224),
    "mobilenet_v2": ("torchvision", "mobilenet_v2", 224),
    "mobilenet_v3_large": ("torchvision", "mobilenet_v3_large", 224),
    "efficientnet_b0": ("torchvision", "efficientnet_b0", 224),
    "resnext50_32x4d": ("torchvision", "resnext50_32x4d", 224),
    "regnet_y_1_6gf": ("torchvision", "regnet_y_1_6gf", 224),
    "convnext_tiny": ("torchvision", "convnext_tiny", 224),
    "efficientnet_v2_s": ("torchvision", "efficientnet_v2_s", 224),
    "densenet121": ("torchvision", "densenet121", 224),
    "mnasnet1_0": ("torchvision", "mnasnet1_0", 224),
    "shufflenet_v2_x1_0": ("torchvision", "shufflenet_v2_x1_0", 224),
    "mobilenet_v3_small": ("torchvision", "mobilenet_v3_small", 224),
    "squeezenet1_1": ("torchvision", "squeezenet1_1", 224),
    "googlenet": ("torchvision", "googlenet", 224),
    "regnet_x_400mf": ("torchvision", "regnet_x_400mf", 224),
    "cs3darknet_s": ("timm", "cs3darknet_s", 256),
    # activations and layouts the torchvision set lacks: ReLU6 (Clip), HardSwish in LCNet, ghost modules,
    # TensorFlow "same" padding as a Pad node, RepVGG's plain 3x3 stacks
    "efficientnet_lite0": ("timm", "efficientnet_lite0", 224),
    "lcnet_100": ("timm", "lcnet_100", 224),
    "ghostnet_100": ("timm", "ghostnet_100", 224),
    "tf_efficientnet_b0": ("timm", "tf_efficientnet_b0", 224),
    "repvgg_a0": ("timm", "repvgg_a0", 224),
    "mixnet_s": ("timm", "mixnet_s", 224),
    # layer norms over the channels (ConvNeXt's blocks, EdgeNeXt's, MobileViT's and EfficientFormerV2's tokens)
    "convnext_atto": ("timm", "convnext_atto", 224),
    "convnextv2_atto": ("timm", "convnextv2_atto", 224),
    "edgenext_xx_small": ("timm", "edgenext_xx_small", 224),
    "mobilevit_xxs": ("timm", "mobilevit_xxs", 224),
    "efficientformerv2_s0": ("timm", "efficientformerv2_s0", 224),
    "yolov8n": ("ultralytics", "yolov8n.yaml", 640),
    "yolo11n": ("ultralytics", "yolo11n.yaml", 640),
}
DEFAULT = "resnet18,mobilenet_v2,efficientnet_b0,cs3darknet_s,yolov8n"


def randomize_batchnorm(model, seed: int = 0) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def build(name: str):
    package, ctor, size = MODELS[name]
    if package == "torchvision":
        import torchvision

        return getattr(torchvision.models, ctor)(weights=None), size
    if package == "timm":
        import timm

        return timm.create_model(ctor, pretrained=False), size
    from ultralytics import YOLO

    return YOLO(ctor).model, size


def export(name: str, out_dir: Path) -> Path:
    import torch

    model, size = build(name)
    model.eval()
    randomize_batchnorm(model)
    if MODELS[name][0] == "ultralytics":
        for m in model.modules():  # the export mode of the Detect head, as `yolo export format=onnx` sets it
            if hasattr(m, "export"):
                m.export, m.format = True, "onnx"
    path = out_dir / f"{name}.onnx"
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        model(x)
        torch.onnx.export(model, (x,), str(path), input_names=["images" if name.startswith("yolo") else "input"],
                          output_names=["output"], opset_version=17, dynamo=False,
                          dynamic_axes={"images" if name.startswith("yolo") else "input": {0: "batch"},
                                        "output": {0: "batch"}})
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=DEFAULT, help=f"comma-separated, of: {', '.join(MODELS)}")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="epifuse-export-")
    cwd = os.getcwd()
    os.chdir(work)  # ultralytics writes settings and runs/ into the working folder
    try:
        for name in args.models.split(","):
            try:
                print(f"{name}: {export(name, out.resolve())}", flush=True)
            except ImportError as e:
                print(f"{name}: skipped ({e})", flush=True)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
