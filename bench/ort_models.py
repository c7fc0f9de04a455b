"""Whole models on the GPU machine, fp16, in one run: ONNX Runtime's CUDA EP on the original model
(best of prefer_nhwc on/off, CUDA graph on), ORT's CUDA EP on the epifuse-optimized model (tuned,
CUDA graph on, prefer_nhwc off and on: with it on ORT also runs the ops between FusedConv regions, such as
MaxPool and Resize, in NHWC), PyTorch eager (CUDA graph) and, with --compile, torch.compile(mode="max-autotune").
ms per batch.

    python bench/ort_models.py [--models resnet50,...] [--batches 1,32] [--fuse auto|always|static] [--compile]
                               [--pdl] [--profile]
                               [--timeline]
                               [--markdown FILE]

Models are torchvision's when torchvision is importable, exported here with torch.onnx (fp16,
dynamic batch, opset 17); otherwise the ResNet-50 built by models/resnet50.py. YOLOv8 (n/s/m) is
built by models/yolo.py (no ultralytics on the GPU machine); its PyTorch module is
bench/torch_yolo.py with the ONNX model's weights. A name ending in .onnx is a model file (PP-OCRv4 det
from rapidocr), its symbolic height and width set to 640, with no PyTorch column. Models built in fp32 are converted to fp16 by epifuse's
precision pass alone, without fusion, for the ORT baseline. Needs onnxruntime-gpu, torch with CUDA
and a CUDA build of libepifuse_ort.so (EPIFUSE_LIB_DIR). --compile costs minutes per model and
batch (max-autotune benchmarks Triton templates for every conv shape).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
import time
from pathlib import Path

import onnx
import torch

from optimizer.bench import tuning
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.runtime import bind_torch, providers_for, session_options


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


def compiled_ms(model, batch, size=224) -> float:
    """torch.compile max-autotune (Triton/cuDNN templates autotuned per shape, CUDA graphs on)."""
    torch._dynamo.reset()
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    compiled = torch.compile(model, mode="max-autotune", dynamic=False)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        print(f"  torch.compile: {time.perf_counter() - start:.0f} s to compile", flush=True)
        return timed(lambda: compiled(x))


def yolo_torch_model(original, scale):
    """The YOLO as a PyTorch module with the ONNX model's weights (bench/torch_yolo.py)."""
    from torch_yolo import YOLOv8

    return YOLOv8.from_onnx(original, scale).half().cuda().to(memory_format=torch.channels_last)


def or_nan(fn, *args):
    """fn(*args), or NaN with the reason printed: one failing baseline must not drop the row."""
    try:
        return fn(*args)
    except Exception as e:
        print(f"  {fn.__name__} failed: {e!r}"[:300], flush=True)
        return float("nan")


# A model's declared I/O types (an fp32-built model keeps fp32 I/O after the precision pass).
TORCH_TYPES = {"tensor(float16)": torch.half, "tensor(float)": torch.float32}


def cuda_session(model_bytes, batch, size, *, library, **provider_options):
    """An ORT CUDA-EP session (with the epifuse library when `library`) and a random device input
    of the model's declared input type."""
    import onnxruntime as ort

    so = session_options() if library else ort.SessionOptions()
    sess = ort.InferenceSession(model_bytes, so, providers=providers_for("ort-cuda", **provider_options))
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=TORCH_TYPES[sess.get_inputs()[0].type])
    return sess, x


def bound_session(model_bytes, batch, size, *, library, **provider_options):
    """cuda_session with its IO bound: the random input, outputs left to ORT on the device."""
    sess, x = cuda_session(model_bytes, batch, size, library=library, **provider_options)
    binding = bind_torch(sess, {sess.get_inputs()[0].name: x}, {})
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cuda")
    return sess, binding


def ort_ms(model_bytes, batch, out_shapes, *, library, prefer_nhwc, size=224) -> float:
    sess, x = cuda_session(model_bytes, batch, size, library=library, cuda_graph=True, prefer_nhwc=prefer_nhwc)
    outputs = {o.name: torch.empty(batch, *shape, device="cuda", dtype=TORCH_TYPES[o.type])
               for o, shape in zip(sess.get_outputs(), out_shapes)}
    binding = bind_torch(sess, {sess.get_inputs()[0].name: x}, outputs)
    return timed(lambda: sess.run_with_iobinding(binding))


# Kernels that compute a convolution, by name: ours, cuDNN's (xmma, cutlass_cudnn), cuBLAS's (nvjet, for
# inductor's 1x1s), Triton conv/mm templates. Everything else is the glue around them, including
# inductor's pointwise kernels, whose names list the ops they fused ("triton_poi_fused_cat_convolution_silu").
CONV_KERNEL = re.compile(r"xmma|nvjet|cutlass|gemm|conv|stem_fused|depthwise|epifuse|triton_tem", re.IGNORECASE)


def is_conv_kernel(name: str) -> bool:
    return bool(CONV_KERNEL.search(name)) and not name.startswith(("triton_poi", "triton_per", "triton_red"))


def profiled(fn, runs=5, top=40) -> str:
    """The CUDA kernels `runs` calls of `fn` launch (CUPTI through torch.profiler), by total time, and
    the ms per call spent in conv kernels and in the rest."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    conv = sum(e.self_device_time_total for e in events if is_conv_kernel(e.key)) / runs / 1e3
    other = sum(e.self_device_time_total for e in events if not is_conv_kernel(e.key)) / runs / 1e3
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=90)
    return f"{table}\nper run: conv kernels {conv:.3f} ms, other kernels {other:.3f} ms, total {conv + other:.3f} ms"


def kernel_profile(model_bytes, batch, *, library, prefer_nhwc, size=224) -> str:
    """Where an ORT run's time goes (CUDA graph off), including ORT's own nodes and copies."""
    sess, binding = bound_session(model_bytes, batch, size, library=library, prefer_nhwc=prefer_nhwc)
    return profiled(lambda: sess.run_with_iobinding(binding))


def inductor_profile(model, batch, size=224) -> str:
    """Where torch.compile's time goes: mode="default" (cuDNN/cuBLAS convs, Triton for the rest; seconds
    to compile, where max-autotune takes minutes and may pick Triton conv templates instead)."""
    torch._dynamo.reset()
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    compiled = torch.compile(model, mode="default", dynamic=False)
    with torch.no_grad():
        return profiled(lambda: compiled(x))


def timeline(model_bytes, batch, *, library, prefer_nhwc, size=224, runs=3) -> str:
    """One CUDA-graph replay as the GPU runs it (CUPTI through torch.profiler): kernels and copies, time busy and idle
    (the gaps between kernels: launch latency inside the graph), and every kernel in order with the gap
    before it. The replay shown is the median of `runs` by span."""
    import json

    from torch.profiler import ProfilerActivity, profile

    sess, binding = bound_session(model_bytes, batch, size, library=library, cuda_graph=True, prefer_nhwc=prefer_nhwc)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            sess.run_with_iobinding(binding)
            torch.cuda.synchronize()
            time.sleep(0.002)  # separates the replays in the trace
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    replays, current = [], []
    for k in kernels:
        if current and k["ts"] - (current[-1]["ts"] + current[-1]["dur"]) > 1000:
            replays.append(current)
            current = []
        current.append(k)
    replays.append(current)
    span = lambda r: r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"]  # noqa: E731
    replay = sorted(replays, key=span)[len(replays) // 2]
    busy = sum(k["dur"] for k in replay)
    lines = [f"{len(replay)} kernels and copies, span {span(replay):.1f} us, busy {busy:.1f} us, "
             f"idle {span(replay) - busy:.1f} us (median of {len(replays)} replays)",
             "   gap us    dur us  kernel"]
    end = replay[0]["ts"]
    for k in replay:
        lines.append(f"{k['ts'] - end:9.1f} {k['dur']:9.1f}  {k['name'][:110]}")
        end = k["ts"] + k["dur"]
    return "\n".join(lines)


def tune(model_bytes, batch, size=224):
    import onnxruntime as ort

    with tuning():
        sess = ort.InferenceSession(model_bytes, session_options(), providers=providers_for("ort-cuda"))
        x = torch.randn(batch, 3, size, size).to(TORCH_TYPES[sess.get_inputs()[0].type])
        sess.run(None, {sess.get_inputs()[0].name: x.numpy()})


def measure_model(name: str, args, work: Path) -> list[dict]:
    """The table rows of one model, one per batch size."""
    rows = []
    size = 640 if name.startswith("yolo") or name.endswith(".onnx") else 224
    if name.endswith(".onnx"):  # a model file (PP-OCRv4 det from rapidocr): symbolic height and width -> 640
        from gpu_models import fix_spatial

        model, original = None, fix_spatial(onnx.load(name), size)
        name = Path(name).stem
    elif name.startswith("yolov8"):  # built in models/ (no ultralytics here); fp16 by the precision pass alone
        from models.yolo import yolov8

        scale = name[len("yolov8"):] or "s"
        original = yolov8(scale)
        model = yolo_torch_model(original, scale)
    else:
        try:
            model = torch_model(name)
            export(model, work / f"{name}.onnx")
            original = onnx.load(work / f"{name}.onnx")
        except ImportError:
            from models.resnet50 import resnet50

            model, original = None, resnet50()
    original = onnx.shape_inference.infer_shapes(original)  # optimize_model expects a checked model
    if original.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
        original, _ = optimize_model(original, target="ort-cuda", precision="fp16", policy=FusionPolicy(mode="always"),
                                     kernel_query=lambda t, d: (0, "baseline: precision only"))
    batches = tuple(int(b) for b in args.batches.split(","))  # decided for every batch size timed below
    optimized, report = optimize_model(original, target="ort-cuda", precision="fp16",
                                       policy=FusionPolicy(mode=args.fuse, batches=batches, measure_budget_s=1200))
    print(f"{name}: {report.fused_count()} FusedConv, {report.ops_after.get('Transpose', 0)} Transpose left",
          flush=True)
    out_shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim][1:] for o in original.graph.output]
    for batch in (int(b) for b in args.batches.split(",")):
        row = {"model": name, "batch": batch}
        row["ort best"] = min(ort_ms(original.SerializeToString(), batch, out_shapes, library=False, prefer_nhwc=p,
                                     size=size) for p in (False, True))
        tune(optimized.SerializeToString(), batch, size)
        # prefer_nhwc lets ORT run the ops left between FusedConv regions (MaxPool, Resize) in NHWC too
        for p in (False, True):
            row[f"epifuse nhwc={int(p)}"] = ort_ms(optimized.SerializeToString(), batch, out_shapes, library=True,
                                                   prefer_nhwc=p, size=size)
        row["epifuse"] = min(row["epifuse nhwc=0"], row["epifuse nhwc=1"])
        if args.pdl:  # programmatic dependent launch of the SM90 kernels (kernel_api.h), best nhwc setting
            os.environ["EPIFUSE_PDL"] = "1"
            row["epifuse pdl"] = ort_ms(optimized.SerializeToString(), batch, out_shapes, library=True,
                                        prefer_nhwc=row["epifuse nhwc=1"] < row["epifuse nhwc=0"], size=size)
            del os.environ["EPIFUSE_PDL"]
        # printed before the torch columns: a call cut short by max-autotune's minutes keeps these
        print(f"{name} batch {batch}: ort best {row['ort best']:.3f} ms, epifuse {row['epifuse']:.3f} ms", flush=True)
        row["torch eager"] = or_nan(eager_graph_ms, model, batch, size) if model is not None else float("nan")
        row["torch.compile"] = or_nan(compiled_ms, model, batch, size) if args.compile and model is not None \
            else float("nan")
        torch_best = min(v for v in (row["torch eager"], row["torch.compile"], math.inf) if not math.isnan(v))
        row["vs ort"] = row["ort best"] / row["epifuse"]
        row["vs torch"] = torch_best / row["epifuse"] if torch_best < math.inf else float("nan")
        rows.append(row)
        print(row, flush=True)
        # ORT on the original (prefer_nhwc on) and epifuse (its better prefer_nhwc setting)
        views = [(title, view) for flag, title, view in ((args.timeline, "CUDA-graph timeline", timeline),
                                                           (args.profile, "5 runs", kernel_profile)) if flag]
        for title, view in views:
            for label, data, library in (("ort", original, False), ("epifuse", optimized, True)):
                print(f"--- {name} batch {batch}: {label}, {title}\n"
                      + view(data.SerializeToString(), batch, library=library, size=size,
                             prefer_nhwc=not library or row["epifuse nhwc=1"] < row["epifuse nhwc=0"]),
                      flush=True)
        if args.profile and model is not None:  # or_nan: a failed compile prints its reason and NaN
            print(f"--- {name} batch {batch}: torch.compile (default mode), 5 runs\n"
                  f"{or_nan(inductor_profile, model, batch, size)}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,yolov8s,mobilenet_v3_large,efficientnet_b0,convnext_tiny")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile max-autotune (minutes)")
    ap.add_argument("--profile", action="store_true",
                    help="print the CUDA kernels of 5 runs and the conv / other split: ORT on the original, "
                         "epifuse, torch.compile (default mode)")
    ap.add_argument("--pdl", action="store_true", help="also time the epifuse model with EPIFUSE_PDL=1")
    ap.add_argument("--timeline", action="store_true",
                    help="print one CUDA-graph replay kernel by kernel (gaps, durations): ORT on the original, epifuse")
    ap.add_argument("--fuse", default="auto", choices=("auto", "always", "static"),
                    help="how the optimized model decides (always: wherever a kernel exists)")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="epifuse-models-"))
    for name in args.models.split(","):
        try:
            rows += measure_model(name, args, work)
        except Exception as e:  # report and go on with the next model
            print(f"{name}: failed: {e!r}"[:300], flush=True)
    cols = ["ort best", "epifuse nhwc=0", "epifuse nhwc=1", "epifuse"] + (["epifuse pdl"] if args.pdl else []) \
        + ["torch eager", "torch.compile", "vs ort", "vs torch"]
    table = "\n".join(["| model | batch | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
                      + [f"| {r['model']} | {r['batch']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |"
                         for r in rows])
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
