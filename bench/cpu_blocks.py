"""Where an optimized model wins and loses against its original on ONNX Runtime's CPU EP: both run under ORT's
profiler in one process, each node's kernel time summed per run by block (the part of the node's name that
`--block` picks: torchvision's `features.N`, `avgpool` and `classifier` unless told), medians over the runs.
Prints a markdown table of each block's µs on both sides and their ratio; `--nodes` adds every node's median.

    python bench/cpu_blocks.py ORIGINAL.onnx OPTIMIZED.onnx [--threads N] [--runs 200] [--nodes]
    python bench/cpu_blocks.py ORIGINAL.onnx OPTIMIZED.onnx --quiet-ms 2.0 --minutes 20   # quiet spells only

The sessions run in alternating blocks of 10 runs, each after 60 ms of untimed runs while the other side's
pool spins down (ORT's default spinning pools unless `--threads`). Nodes outside every block (ORT's NCHWc
reorders, the optimized model's input transpose) count as "other". Profiling adds a few µs to every node
(ORT's MobileNetV3-Large runs 0.7 ms slower under it on two threads), so compare blocks, not the totals with
wall times.

With `--quiet-ms` (see bench/cpu_quiet.py for why): every second a plain session of the original runs 20 times,
and while its median reads under the threshold, pairs of profiled blocks follow; a pair counts only where the
probe after it (10 runs) still reads quiet, since the profiled runs' own times are not comparable with it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from optimizer.compare import SPINNING_SETTLE_SECONDS  # the other side's pool spins down
from optimizer.libraries import preload_onednn
from optimizer.passes.load import load_model_split
from optimizer.runtime import session_options
from optimizer.verify import random_inputs

BLOCK_RUNS = 10


class Profiled:
    """A profiling session, and which of its runs count."""

    def __init__(self, path: str, threads: int | None, prefix: str):
        so = session_options(threads=threads)
        so.enable_profiling = True
        so.profile_file_prefix = prefix
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.runs = 0
        self.kept: list[int] = []  # indices of the runs that count

    def block(self, feeds: dict, runs: int, keep: bool) -> None:
        settled = time.perf_counter() + SPINNING_SETTLE_SECONDS
        while time.perf_counter() < settled:
            self.run(feeds, False)
        for _ in range(runs):
            self.run(feeds, keep)

    def run(self, feeds: dict, keep: bool) -> None:
        self.session.run(None, feeds)
        if keep:
            self.kept.append(self.runs)
        self.runs += 1

    def node_medians(self) -> dict[str, float]:
        """Median µs per node over the kept runs, in the order the nodes first ran."""
        trace = Path(self.session.end_profiling())
        events = json.loads(trace.read_text())
        trace.unlink()
        runs = sorted((e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"),
                      key=lambda e: e["ts"])
        if len(runs) != self.runs:
            raise RuntimeError(f"the profile holds {len(runs)} runs, {self.runs} were made")
        kept = [runs[i] for i in self.kept]
        starts = np.array([r["ts"] for r in kept])
        ends = starts + np.array([r["dur"] for r in kept])
        per_run: dict[str, np.ndarray] = {}
        for e in sorted(events, key=lambda e: e.get("ts", 0)):
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
            if i >= 0 and e["ts"] <= ends[i]:
                name = e["name"][: -len("_kernel_time")]
                if name not in per_run:
                    per_run[name] = np.zeros(len(kept))
                per_run[name][i] += e["dur"]
        return {name: float(np.median(v)) for name, v in per_run.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("optimized")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ORT's, one a core)")
    ap.add_argument("--runs", type=int, default=200, help="profiled runs a side (without --quiet-ms)")
    ap.add_argument("--block", default=r"features\.(\d+)|(avgpool)|(classifier)",
                    help="regex whose first matched group names a node's block")
    ap.add_argument("--nodes", action="store_true", help="also every node's median")
    ap.add_argument("--quiet-ms", type=float, default=None, help="profile only while the original reads under this")
    ap.add_argument("--minutes", type=float, default=20, help="how long to wait for quiet spells")
    args = ap.parse_args()
    preload_onednn()
    feeds = random_inputs(load_model_split(args.original)[0], batch=1)
    prefix = os.path.join(tempfile.gettempdir(), f"cpu_blocks_{os.getpid()}")
    sides = [Profiled(path, args.threads, f"{prefix}_{i}") for i, path in enumerate((args.original, args.optimized))]
    for side in sides:  # first runs: allocations, oneDNN's primitives, the library's kernel timings
        side.block(feeds, 20, False)
    if args.quiet_ms is None:
        for _ in range(max(1, args.runs // BLOCK_RUNS)):
            for side in (sides[1], sides[0]):
                side.block(feeds, BLOCK_RUNS, True)
    else:
        probe = ort.InferenceSession(args.original, session_options(threads=args.threads),
                                     providers=["CPUExecutionProvider"])

        def quiet(runs: int) -> bool:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                probe.run(None, feeds)
                times.append(time.perf_counter() - start)
            return float(np.median(times)) * 1e3 < args.quiet_ms

        quiet(20)  # the probe session's first runs
        end = time.time() + args.minutes * 60
        while time.time() < end:
            while time.time() < end and quiet(20):
                marks = [len(side.kept) for side in sides]
                for side in (sides[1], sides[0]):
                    side.block(feeds, BLOCK_RUNS, True)
                if not quiet(BLOCK_RUNS):  # the pair may have run loaded: it does not count
                    for side, mark in zip(sides, marks):
                        del side.kept[mark:]
                    break
            time.sleep(1)
        print(f"{len(sides[0].kept) // BLOCK_RUNS} quiet pairs of {BLOCK_RUNS}-run blocks")
        if not sides[0].kept:
            return 1
    medians = [side.node_medians() for side in sides]
    pattern = re.compile(args.block)
    blocks: list[collections.Counter] = []
    order: dict[str, None] = {}
    for nodes in medians:
        sums: collections.Counter = collections.Counter()
        for name, us in nodes.items():
            m = pattern.search(name)
            key = next((g for g in m.groups() if g), m.group(0)) if m else "other"
            order.setdefault(key, None)
            sums[key] += us
        blocks.append(sums)
    print("| block | original µs | optimized µs | original / optimized |\n|---|---:|---:|---:|")
    for key in sorted(order, key=lambda k: (k == "other", list(order).index(k))):
        a, b = blocks[0][key], blocks[1][key]
        print(f"| {key} | {a:.1f} | {b:.1f} | {a / b if b else float('inf'):.2f}x |")
    a, b = sum(blocks[0].values()), sum(blocks[1].values())
    print(f"| all nodes | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    if args.nodes:
        for label, nodes in zip(("original", "optimized"), medians):
            print(f"\n| {label} node | µs |\n|---|---:|")
            for name, us in nodes.items():
                print(f"| {name} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
