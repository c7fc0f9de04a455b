"""Every FusedConv of a whole model, layer by layer, beside cuDNN: where a model's time goes.

    python bench/model_layers.py [--model resnet50|yolov8s|...] [--batch N] [--markdown FILE]

The model (models/resnet50.py or models/yolo.py, fixed batch) is optimized for ort-cuda fp16 as
`epifuse optimize` does; each distinct FusedConv problem is then timed as in bench/kernels.py
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

from optimizer.pipeline import _registry_query, optimize_model
from optimizer.registry import FLOAT16, ConvDesc

TORCH_ACTIVATIONS = {
    "identity": lambda v: v, "relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "gelu": F.gelu, "mish": F.mish,
}


def model_problems(name: str, batch: int) -> Counter:
    """FusedConv problems of the optimized model (fp16), with their counts."""
    if name.startswith("yolov8"):
        from models.yolo import yolov8

        model = yolov8(name[len("yolov8"):] or "s", batch=batch)
    else:
        from models import resnet50 as zoo

        model = getattr(zoo, name)(batch=batch)
    model = onnx.shape_inference.infer_shapes(model)  # every FusedConv's input shape, for its problem
    found: Counter = Counter()

    def query(target, desc):
        count, reason = _registry_query(target, desc)
        if count > 0:  # the candidate the fusion pass takes (the first one a kernel accepts)
            found[ConvDesc(**{**desc, "dtype": FLOAT16})] += 1
        return count, reason

    optimize_model(model, target="ort-cuda", precision="fp16", kernel_query=query)
    return found


def measure(d: ConvDesc) -> dict:
    g, st, dil = d.group, (d.stride_h, d.stride_w), (d.dil_h, d.dil_w)
    p = (d.H + d.pad_top + d.pad_bottom - d.dil_h * (d.R - 1) - 1) // d.stride_h + 1
    q = (d.W + d.pad_left + d.pad_right - d.dil_w * (d.S - 1) - 1) // d.stride_w + 1
    half = dict(device="cuda", dtype=torch.half)
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
    kind = f"dw{d.R}x{d.S}" if d.group == d.C == d.K and d.group > 1 else f"{d.R}x{d.S}"
    stride = f"s{d.stride_h}" if d.stride_h > 1 else ""
    extra = "" if d.residual == "none" else f"+{d.residual}"
    return f"{kind}{stride} {d.H}x{d.W}x{d.C}→{d.K} {d.activation}{extra}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", help="resnet50, resnet18, yolov8n, yolov8s or yolov8m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--markdown", help="append the table to this markdown file")
    args = ap.parse_args()
    problems = model_problems(args.model, args.batch)
    cols = ["cudnn conv", "cudnn unfused", "epifuse heuristic", "epifuse best"]
    lines = [f"### {args.model}, batch {args.batch}: {sum(problems.values())} FusedConv, {len(problems)} distinct "
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
