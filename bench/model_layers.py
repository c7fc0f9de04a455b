"""Every FusedConv of a whole model, layer by layer, beside cuDNN: where a model's time goes.

    python bench/model_layers.py [--model resnet50|yolov8s|regnet_y_1_6gf|FILE.onnx|...] [--batch N]
        [--precision fp16|fp32] [--markdown FILE]

The model (models/resnet50.py or models/yolo.py; else a bench/export_models.py name, exported with
random weights, or an ONNX file; fixed batch) is optimized for ort-cuda as `epifuse optimize --fuse always`
does, in fp16 or in fp32 with TF32 allowed (cuDNN's default fp32 math on both sides: the fp32 table says
where our TF32 kernels lose); each distinct FusedConv problem is then timed as in bench/kernels.py
(CUDA-graph replay, µs per call): every kernel the registry offers (best and heuristic first
choice), cuDNN's conv kernel alone (no bias: PyTorch adds a bias in a kernel of its own), and cuDNN
conv + bias followed by the node's activation and residual add in PyTorch eager (what an unfused
runtime launches). Totals weight each problem by how often the
model has it, so the last line says how far the convs alone put us ahead of or behind cuDNN.
"""
from __future__ import annotations

import argparse
import math
from collections import Counter

import onnx
import torch
import torch.nn.functional as F
from kernels import graph_time, time_kernels

from optimizer.pipeline import FusionPolicy, _registry_query, optimize_model
from optimizer.registry import FLOAT, FLOAT16, ConvDesc

TORCH_ACTIVATIONS = {
    "identity": lambda v: v, "relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "gelu": F.gelu, "mish": F.mish,
}


def load(name: str, batch: int) -> onnx.ModelProto:
    """The model at a fixed batch, shapes inferred (every FusedConv's input shape, for its problem)."""
    if name.startswith("yolov8"):
        from models.yolo import yolov8

        model = yolov8(name[len("yolov8"):] or "s", batch=batch)
    elif name in ("resnet50", "resnet18"):
        from models import resnet50 as zoo

        model = getattr(zoo, name)(batch=batch)
    else:  # an export name or an ONNX file: its symbolic height and width 640, as gpu_models.py does
        import tempfile
        from pathlib import Path

        from gpu_models import original

        _, model = original(name, Path(tempfile.mkdtemp(prefix="epifuse-layers-")), 640)
        for vi in model.graph.input:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 4 and not dims[0].HasField("dim_value"):
                dims[0].dim_value = batch
        del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def model_problems(name: str, batch: int, precision: str) -> Counter:
    """FusedConv problems of the model optimized for `precision` (fp32: TF32 allowed), with their counts."""
    found: Counter = Counter()
    dtype = FLOAT16 if precision == "fp16" else FLOAT

    def query(target, desc):
        count, reason = _registry_query(target, desc)
        # The candidates a kernel accepts; one whose shape the pass did not know (a classifier after a
        # Flatten the batch did not reach) cannot be timed and is left out.
        if count > 0 and min(desc["N"], desc["H"], desc["W"]) > 0:
            found[ConvDesc(**{**desc, "dtype": dtype})] += 1
        return count, reason

    optimize_model(load(name, batch), target="ort-cuda", precision=precision, kernel_query=query,
                   policy=FusionPolicy(mode="always", allow_tf32=True))
    return found


def measure(d: ConvDesc) -> dict:
    g, st, dil = d.group, (d.stride_h, d.stride_w), (d.dil_h, d.dil_w)
    p = (d.H + d.pad_top + d.pad_bottom - d.dil_h * (d.R - 1) - 1) // d.stride_h + 1
    q = (d.W + d.pad_left + d.pad_right - d.dil_w * (d.S - 1) - 1) // d.stride_w + 1
    half = dict(device="cuda", dtype=torch.half if d.dtype == FLOAT16 else torch.float32)
    xs = [torch.randn(d.N, d.C, d.H, d.W, **half).to(memory_format=torch.channels_last) for _ in range(3)]
    w = (torch.randn(d.K, d.C // g, d.R, d.S, **half) / math.sqrt(d.C // g * d.R * d.S)).to(
        memory_format=torch.channels_last)
    b = torch.randn(d.K, **half)
    z = torch.randn(d.N, d.K, p, q, **half).to(memory_format=torch.channels_last) if d.residual != "none" else None
    act = TORCH_ACTIVATIONS[d.activation]
    turn = [0]

    def next_x():
        turn[0] = (turn[0] + 1) % 3
        return xs[turn[0]]

    def conv(x, bias=None):  # PyTorch adds a bias in a kernel of its own: without it, cuDNN's conv alone
        if (d.pad_top, d.pad_left) != (d.pad_bottom, d.pad_right):
            return F.conv2d(F.pad(x, (d.pad_left, d.pad_right, d.pad_top, d.pad_bottom)), w, bias, st, 0, dil, g)
        return F.conv2d(x, w, bias, st, (d.pad_top, d.pad_left), dil, g)

    def unfused():
        y = conv(next_x(), b)
        if d.residual == "pre":
            return act(y + z)
        return act(y) + z if d.residual == "post" else act(y)

    torch.backends.cudnn.benchmark = True
    flops = 2.0 * d.N * p * q * d.K * (d.C // g) * d.R * d.S
    row = {"cudnn conv": graph_time(lambda: conv(next_x())), "cudnn unfused": graph_time(unfused),
           "GFLOP": flops / 1e9}
    x_nhwc = [x.permute(0, 2, 3, 1) for x in xs]
    w_krsc = w.permute(0, 2, 3, 1).contiguous()
    y = torch.empty(d.N, p, q, d.K, **half)
    z_nhwc = z.permute(0, 2, 3, 1) if z is not None else None
    per_kernel = time_kernels(d, x_nhwc, w_krsc, b, z_nhwc, y, label(d))
    best = min(per_kernel, key=per_kernel.get)
    row.update({"epifuse best": per_kernel[best], "best kernel": best,
                "epifuse heuristic": per_kernel[next(iter(per_kernel))], "kernels": per_kernel})
    return row


def label(d: ConvDesc) -> str:
    kind = (f"dw{d.R}x{d.S}" if d.group == d.C == d.K and d.group > 1
            else f"{d.R}x{d.S}" + (f"g{d.group}" if d.group > 1 else ""))
    stride = f"s{d.stride_h}" if d.stride_h > 1 else ""
    extra = "" if d.residual == "none" else f"+{d.residual}"
    return f"{kind}{stride} {d.H}x{d.W}x{d.C}→{d.K} {d.activation}{extra}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", help="resnet50, resnet18, yolov8n, yolov8s or yolov8m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="fp32: TF32 on both sides")
    ap.add_argument("--markdown", help="append the table to this markdown file")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convs, stated: the fp32 rows compare TF32
    problems = model_problems(args.model, args.batch, args.precision)
    cols = ["cudnn conv", "cudnn unfused", "epifuse heuristic", "epifuse best"]
    lines = [f"### {args.model}, batch {args.batch}, {args.precision}: {sum(problems.values())} FusedConv, {len(problems)} distinct "
             f"({torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()})", "",
             "| layer | count | GFLOP | " + " | ".join(cols) + " | best kernel | best vs cuDNN conv |",
             "|---" * (len(cols) + 5) + "|"]
    totals = Counter()
    for d, count in sorted(problems.items(), key=lambda kv: -kv[0].N * kv[0].H * kv[0].W * kv[0].C * kv[0].K):
        r = measure(d)
        for c in cols:
            totals[c] += r[c] * count
        line = (f"| {label(d)} | {count} | {r['GFLOP']:.2f} | " + " | ".join(f"{r[c]:.1f}" for c in cols)
                + f" | {r['best kernel']} | {r['cudnn conv'] / r['epifuse best']:.2f}x |")
        lines.append(line)
        print(line, flush=True)
    lines.append("| **total (µs, × count)** | | | " + " | ".join(f"**{totals[c]:.0f}**" for c in cols) +
                 f" | | {totals['cudnn conv'] / totals['epifuse best']:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(table + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
