"""Whole models with and without their pairs of a 1x1 and a depthwise conv on ONNX Runtime's CPU EP: each
model optimized for ort-cpu with every fusion (`--fuse always`, so both sides fuse the same convs), then the
same model with each pair (epifuse::FusedPointwiseDepthwise, FusedPointwiseDepthwiseMean,
FusedDepthwisePointwise) split back into its two convs (with `--only KIND`, the pairs of that kind alone:
`mean` the FusedPointwiseDepthwiseMean, `depthwise-first` the FusedDepthwisePointwise); the two timed against each
other by `epifuse compare` (interleaved rounds, spinning pools) on ORT's default threads and on one. What
the whole-model check weighs before it keeps a model's pairs (optimizer/pipeline.py, _pairs_check).

    python bench/cpu_pairs.py MODEL.onnx [...] [--rounds 30] [--only mean|depthwise-first]

Prints a markdown table: the medians of each side, the speed-up (the model with pairs against the one
without) and its interquartile range over the rounds.
"""
from __future__ import annotations

import argparse
import os
import platform

import onnx_graphsurgeon as gs
import onnxruntime as ort

from optimizer import __version__
from optimizer.compare import compare
from optimizer.measure import _cpu_name
from optimizer.passes.load import load_model
from optimizer.passes.pointwise_depthwise import (DEPTHWISE_FIRST_OP_TYPE, MEAN_OP_TYPE, OP_TYPE, PAIR_OP_TYPES,
                                                  split_pointwise_depthwise)

KINDS = {"mean": (MEAN_OP_TYPE,), "depthwise-first": (DEPTHWISE_FIRST_OP_TYPE,)}
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report


def without_pairs(model, op_types=PAIR_OP_TYPES):
    graph = split_pointwise_depthwise(gs.import_onnx(model), Report(), op_types)
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--only", choices=sorted(KINDS), help="split only the pairs of this kind")
    args = ap.parse_args()
    split = KINDS[args.only] if args.only else PAIR_OP_TYPES
    print(f"\n{_cpu_name()}, {os.cpu_count()} threads, onnxruntime {ort.__version__}, epifuse {__version__}, "
          f"Python {platform.python_version()}\n")
    print("| model | expand first | with mean | depthwise first | threads | without ms | with ms | speed-up | "
          "interquartile |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for path in args.models:
        with_pairs, _ = optimize_model(load_model(path), target="ort-cpu", precision="fp32",
                                       policy=FusionPolicy(mode="always"))
        ops = [n.op_type for n in with_pairs.graph.node]
        plain = without_pairs(with_pairs, split)
        for threads in (None, 1):
            r = compare(plain, with_pairs, backend="ort-cpu", threads=threads, rounds=args.rounds, spinning=True)
            print(f"| {os.path.basename(path)} | {ops.count(OP_TYPE)} | {ops.count(MEAN_OP_TYPE)} | "
                  f"{ops.count(DEPTHWISE_FIRST_OP_TYPE)} | "
                  f"{threads or 'default'} | {r['original_ms']:.3f} | "
                  f"{r['optimized_ms']:.3f} | {r['speedup']:.3f}x | {r['speedup_q1']:.3f}-{r['speedup_q3']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
