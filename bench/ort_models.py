"""Whole models on the GPU machine, fp16, in one run: ONNX Runtime's CUDA EP on the original model
(best of prefer_nhwc on/off, CUDA graph on), ORT's CUDA EP on the epifuse-optimized model (tuned,
CUDA graph on), and PyTorch eager (CUDA graph). ms per batch.

    python bench/ort_models.py [--models resnet50,...] [--batches 1,32] [--markdown FILE]

Models are torchvision's when torchvision is importable, exported here with torch.onnx (fp16,
dynamic batch, opset 17); otherwise the ResNet-50 built by models/resnet50.py. YOLOv8 (n/s/m) is
built by models/yolo.py (no ultralytics on the GPU machine; no PyTorch-eager figure for it). Models
built in fp32 are converted to fp16 by epifuse's precision pass alone, without fusion, for the
ORT baseline. Needs onnxruntime-gpu, torch with CUDA and a
CUDA build of libepifuse_ort.so (EPIFUSE_LIB_DIR). torch.compile is left out: max-autotune takes
minutes per model (shared/docs/anchors.md), more than a device call allows.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx  # noqa: E402
import torch  # noqa: E402

from optimizer.pipeline import optimize_model  # noqa: E402
from optimizer.runtime import bind_torch, providers_for, session_options  # noqa: E402


def timed(fn, reps=50, warm=10) -> float:
    """ms per call: the mean of `reps` calls after `warm`, device synchronised at both ends."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / reps


def torch_model(name):
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval().half().cuda().to(memory_format=torch.channels_last)


def export(model, path, size=224):
    x = torch.randn(1, 3, size, size, device="cuda", dtype=torch.half)
    torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["output"], opset_version=17,
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, dynamo=False)


def eager_graph_ms(model, batch, size=224) -> float:
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(x)
    return timed(g.replay)


def ort_ms(model_bytes, batch, out_shapes, *, library, prefer_nhwc, size=224) -> float:
    import onnxruntime as ort

    so = session_options() if library else ort.SessionOptions()
    sess = ort.InferenceSession(model_bytes, so, providers=providers_for("ort-cuda", cuda_graph=True,
                                                                         prefer_nhwc=prefer_nhwc))
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.half)
    outputs = {o.name: torch.empty(batch, *shape, device="cuda", dtype=torch.half)
               for o, shape in zip(sess.get_outputs(), out_shapes)}
    binding = bind_torch(sess, {sess.get_inputs()[0].name: x}, outputs)
    return timed(lambda: sess.run_with_iobinding(binding))


def tune(model_bytes, batch, size=224):
    import onnxruntime as ort

    os.environ["EPIFUSE_TUNE"] = "1"
    sess = ort.InferenceSession(model_bytes, session_options(), providers=providers_for("ort-cuda"))
    sess.run(None, {sess.get_inputs()[0].name: torch.randn(batch, 3, size, size).half().numpy()})
    del os.environ["EPIFUSE_TUNE"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,yolov8s,mobilenet_v3_large,efficientnet_b0,convnext_tiny")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="epifuse-models-"))
    for name in args.models.split(","):
        size = 640 if name.startswith("yolo") else 224
        if name.startswith("yolov8"):  # built in models/ (no ultralytics here); fp16 by the precision pass alone
            from models.yolo import yolov8

            model, original = None, yolov8(name[len("yolov8"):] or "s")
        else:
            try:
                model = torch_model(name)
                export(model, work / f"{name}.onnx")
                original = onnx.load(work / f"{name}.onnx")
            except ImportError:
                from models.resnet50 import resnet50

                model, original = None, resnet50()
        if original.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            original, _ = optimize_model(original, target="ort-cuda", precision="fp16",
                                         kernel_query=lambda t, d: (0, "baseline: precision only"))
        optimized, report = optimize_model(original, target="ort-cuda", precision="fp16")
        print(f"{name}: {report.fused_count()} FusedConv, {report.ops_after.get('Transpose', 0)} Transpose left",
              flush=True)
        out_shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim][1:] for o in original.graph.output]
        for batch in (int(b) for b in args.batches.split(",")):
            row = {"model": name, "batch": batch}
            row["ort best"] = min(ort_ms(original.SerializeToString(), batch, out_shapes, library=False, prefer_nhwc=p,
                                         size=size) for p in (False, True))
            tune(optimized.SerializeToString(), batch, size)
            row["epifuse"] = ort_ms(optimized.SerializeToString(), batch, out_shapes, library=True, prefer_nhwc=False,
                                    size=size)
            row["torch eager"] = eager_graph_ms(model, batch, size) if model is not None else float("nan")
            row["vs ort"] = row["ort best"] / row["epifuse"]
            row["vs torch"] = row["torch eager"] / row["epifuse"]
            rows.append(row)
            print(row, flush=True)
    cols = ["ort best", "epifuse", "torch eager", "vs ort", "vs torch"]
    table = "\n".join(["| model | batch | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
                      + [f"| {r['model']} | {r['batch']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |"
                         for r in rows])
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
