"""Held-out models on ONNX Runtime's CUDA EP: the original (ORT's best: CUDA graph, better of
prefer_nhwc off/on, in the chosen precision) against `epifuse optimize --target ort-cuda` with the
fusions decided by measuring on this GPU (the default; `--fuse static` for the static policy), and
optionally against fusing wherever a kernel exists (`--fuse always`, the behaviour before cost decisions). One process, interleaved rounds
(`epifuse compare`), each batch size.

    python bench/gpu_models.py --models resnext50_32x4d,regnet_y_1_6gf,mixnet_s,/path/ppocrv4_det.onnx \\
        [--precision fp16|fp32|fp32-strict] [--batches 1,16] [--also-always] [--per-batch] [--costs-cache FILE]
        [--markdown FILE]

fp32 lets the fused convs compute in TF32 (as ORT's CUDA EP does by default), fp32-strict does not; for
both, the table adds each side's relative L2 error on the first batch size against ORT's CPU EP on the
original in fp32 (within ~1e-6 of float64: the reference for errors of TF32's ~1e-3).

One optimized model serves every batch size (decided for all of them: a fusion is kept only where it is faster at
each); `--per-batch` also times a model decided for each batch size alone (`epifuse optimize --batch N`, the
default being batch 1), from the same measurements.

`--models heldout` is HELDOUT below: 13 architectures from torchvision, timm and models/yolo.py (plain,
grouped, depthwise, squeeze-excite, dense and shuffle blocks, a detector), to which PyPI-shipped models
(PP-OCRv4 det from rapidocr) are added as paths: `--models heldout,/path/ch_PP-OCRv4_det_infer.onnx`.

Names are bench/export_models.py's (exported here with random weights and BatchNorm statistics) or
yolov8n/s/m (built by models/yolo.py); paths are ONNX files, their symbolic height and width set to --size. Needs onnxruntime-gpu and a CUDA
build of the epifuse library (EPIFUSE_LIB_DIR). The library picks kernels by the registry's heuristic
(`--tune`: timed when first chosen, EPIFUSE_TUNE=1), in the measurements and the models alike.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import onnx

from optimizer.compare import compare
from optimizer.passes.load import load_model
from optimizer.pipeline import FusionPolicy, optimize_model


HELDOUT = ("resnet50,resnext50_32x4d,regnet_y_1_6gf,mobilenet_v3_large,efficientnet_b0,efficientnet_v2_s,"
           "convnext_tiny,densenet121,mnasnet1_0,shufflenet_v2_x1_0,mixnet_s,cs3darknet_s,yolov8n")


def fix_spatial(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """Symbolic height and width of 4-D inputs become `size` (the batch stays symbolic)."""
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 4:
            for d in dims[2:]:
                if not d.HasField("dim_value"):
                    d.dim_value = size
    del model.graph.value_info[:]
    return model


def original(spec: str, work: Path, size: int) -> tuple[str, onnx.ModelProto]:
    if spec.endswith(".onnx"):
        name, model = Path(spec).stem, load_model(spec)
    elif spec.startswith("yolov8") and spec[6:] in ("n", "s", "m"):  # models/yolo.py (no ultralytics needed)
        from models.yolo import yolov8

        name, model = spec, yolov8(spec[6:])
    else:
        from export_models import export

        name, model = spec, load_model(str(export(spec, work)))
    return name, onnx.shape_inference.infer_shapes(fix_spatial(model, size))


def fp32_errors(original: onnx.ModelProto, optimized: onnx.ModelProto, batch: int) -> dict:
    """The worst output's relative L2 error of ORT's CUDA EP on the original (TF32 by default) and of the
    optimized model, against ORT's CPU EP on the original (fp32 math), on the same random inputs."""
    from optimizer.runtime import create_session
    from optimizer.verify import random_inputs, rel_l2

    feeds = random_inputs(original, batch=batch)
    data = original.SerializeToString()
    ref = create_session(data).run(None, feeds)
    err = {}
    for label, model in (("ort error", data), ("epifuse error", optimized.SerializeToString())):
        outs = create_session(model, backend="ort-cuda").run(None, feeds)
        err[label] = max(rel_l2(a, e) for a, e in zip(outs, ref))
    return err


def print_profiles(name: str, batch: int, original: onnx.ModelProto, optimized: onnx.ModelProto, size: int):
    """ORT on the original and the optimized model, kernel by kernel (prefer_nhwc on for both; needs torch)."""
    from ort_models import kernel_profile, timeline

    for label, model, library in (("ort", original, False), ("epifuse", optimized, True)):
        for title, view in (("5 runs", kernel_profile), ("CUDA-graph timeline", timeline)):
            print(f"--- {name} batch {batch}: {label}, {title}\n"
                  + view(model.SerializeToString(), batch, library=library, prefer_nhwc=True, size=size), flush=True)


def table(rows: list[dict], args) -> str:
    """Markdown rows; the optional columns only where they were measured."""
    cols = [("model", "{model}"), ("batch", "{batch}"), ("ORT best ms", "{ort:.3f}"), ("epifuse ms", "{epifuse:.3f}"),
            ("speed-up", "{speed-up:.3f}x"), ("interquartile", "{q1:.3f}-{q3:.3f}"), ("fused", "{fused}")]
    if args.per_batch:
        cols.append(("this batch alone", "{alone:.3f}x ({fused alone})"))
    if args.also_always:
        cols.append(("fuse=always", "{always:.3f}x"))
    if args.precision == "fp32":
        cols += [("ORT error", "{ort error:.1e}"), ("epifuse error", "{epifuse error:.1e}")]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    lines += ["| " + " | ".join(fmt.format_map(r) for _, fmt in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--precision", choices=("fp16", "fp32", "fp32-strict"), default="fp16")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--size", type=int, default=640, help="height and width for inputs whose are symbolic")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--also-always", action="store_true", help="also time --fuse always")
    ap.add_argument("--per-batch", action="store_true", help="also time a model decided for each batch alone")
    ap.add_argument("--costs-cache", help="the measurements' cache (a costs file; default: a new one)")
    ap.add_argument("--tune", action="store_true",
                    help="tune kernels when first chosen (EPIFUSE_TUNE=1; default: the registry's heuristic)")
    ap.add_argument("--fuse", default="auto", choices=("auto", "static"), help="how the optimized model decides")
    ap.add_argument("--profile", action="store_true",
                    help="print where each batch's time goes, ORT on the original and epifuse: CUDA kernels by total "
                         "time (5 runs) and one CUDA-graph replay kernel by kernel (bench/ort_models.py's views)")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    allow_tf32 = args.precision != "fp32-strict"
    args.precision = args.precision.removesuffix("-strict")
    if args.tune:
        os.environ["EPIFUSE_TUNE"] = "1"
    work = Path(tempfile.mkdtemp(prefix="epifuse-gpu-models-"))
    batches = tuple(int(b) for b in args.batches.split(","))
    cache = args.costs_cache or str(work / "costs.json")
    rows = []
    for spec in args.models.replace("heldout", HELDOUT).split(","):
        try:
            name, model = original(spec, work, args.size)
        except Exception as e:  # noqa: BLE001 (report and go on with the next model)
            print(f"{spec}: cannot build: {e!r}"[:300], flush=True)
            continue
        start = time.perf_counter()
        auto, report = optimize_model(model, target="ort-cuda", precision=args.precision, policy=FusionPolicy(
            mode=args.fuse, batches=batches, measure_budget_s=1200, cache_path=cache, allow_tf32=allow_tf32))
        seconds = time.perf_counter() - start
        fused = f"{sum(d.fused for d in report.decisions)}/{len(report.decisions)}"
        print(f"{name}: {fused} fused, optimize {seconds:.1f} s ({report.pass_seconds.get('measure', 0):.1f} s "
              f"measuring)", flush=True)
        for note in report.notes:
            print(f"  note: {note}", flush=True)
        for d in report.decisions:
            print(f"  {d.node} {d.pattern} {d.batches} ours {d.ours_us} runtime {d.runtime_us} "
                  f"{'FUSED' if d.fused else 'no'}: {d.reason}", flush=True)
        always = None if not args.also_always else optimize_model(
            model, target="ort-cuda", precision=args.precision,
            policy=FusionPolicy(mode="always", allow_tf32=allow_tf32))[0]
        errors = fp32_errors(model, auto, batches[0]) if args.precision == "fp32" else {}
        for batch in batches:
            r = compare(model, auto, backend="ort-cuda", batch=batch, precision=args.precision, rounds=args.rounds)
            row = {"model": name, "batch": batch, "ort": r["original_ms"], "epifuse": r["optimized_ms"],
                   "speed-up": r["speedup"], "q1": r["speedup_q1"], "q3": r["speedup_q3"], "fused": fused,
                   "optimize s": seconds, "always": float("nan"), "alone": float("nan"), "fused alone": "-",
                   **errors}
            if args.per_batch and len(batches) > 1:
                alone, alone_report = optimize_model(model, target="ort-cuda", precision=args.precision,
                                                     policy=FusionPolicy(mode=args.fuse, batches=(batch,),
                                                                         measure_budget_s=1200, cache_path=cache,
                                                                         allow_tf32=allow_tf32))
                row["fused alone"] = (f"{sum(d.fused for d in alone_report.decisions)}/"
                                      f"{len(alone_report.decisions)}")
                row["alone"] = compare(model, alone, backend="ort-cuda", batch=batch, precision=args.precision,
                                       rounds=args.rounds)["speedup"]
            if always is not None:
                row["always"] = compare(model, always, backend="ort-cuda", batch=batch, precision=args.precision,
                                        rounds=args.rounds)["speedup"]
            rows.append(row)
            extra = (f"; decided for this batch alone {row['alone']:.3f}x ({row['fused alone']})" if args.per_batch
                     else "") + (f"; always {row['always']:.3f}x" if always is not None else "")
            print(f"{name} batch {batch}: ORT {row['ort']:.3f} ms, epifuse {row['epifuse']:.3f} ms, "
                  f"{row['speed-up']:.3f}x ({row['q1']:.3f}-{row['q3']:.3f}){extra}", flush=True)
            if args.profile:
                print_profiles(name, batch, model, auto, args.size)
        if args.markdown:  # after every model: a run cut short keeps the rows it has
            Path(args.markdown).write_text(table(rows, args) + "\n")
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
