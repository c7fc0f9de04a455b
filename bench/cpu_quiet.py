"""Readings of an original and an optimized model taken while the host is quiet. On a cloud VM the last-level
cache is shared with other guests, and their load moves ONNX Runtime's time for a model by up to 1.6x
(MobileNetV3-Large on the 2-core Zen 5 of docs/bench-cpu.md: 1.6 ms quiet, 2.5 ms loaded), the optimized
model's less, so a speed-up read while the cache is loaded says little about a quiet machine. Quiet spells
come and go within seconds, too briefly for a 30-round `epifuse compare` started by hand.

Both models' sessions stay open (ORT's default spinning pools, or `--threads`). Every `--period` seconds a probe
runs the original `--probe-runs` times; when its median is under `--quiet-ms`, pairs of blocks follow at once
(the optimized model's, then the original's, `--block-runs` runs each, each block after 60 ms of untimed runs
while the other side's pool spins down, as `epifuse compare --spinning` does) for as long as the original's
blocks read quiet (20 pairs at most); the quiet pairs' ratios are the reading. Only the original's block is
tested for quiet (or the probe model after the pair), so a pair whose optimized block ran loaded counts against
the optimized model. Then `compare` itself (`--compare-rounds`, 0 for none), and whether the probe after it
still read quiet. Every probe is logged, with a UTC time, to stdout and `--log`, and after each spell the
median and quartiles of every quiet pair so far.

    python bench/cpu_quiet.py ORIGINAL.onnx OPTIMIZED.onnx --quiet-ms 2.0 --minutes 60 [--log quiet.log]

Spells shorter than a second (evenings on the machine of docs/bench-cpu.md) need short blocks and frequent
probes, and no compare after them: `--period 1 --probe-runs 20 --block-runs 10 --compare-rounds 0`.
`--probe-model M`: the probes (and the check after each pair) time M instead of the original, so that a model
whose quiet time is not known is read in the spells a known one shows (MobileNetV3-Large under 2.0 ms on that
machine).
"""
from __future__ import annotations

import argparse
import datetime
import time

import numpy as np
import onnxruntime as ort

from optimizer.compare import SPINNING_SETTLE_SECONDS, compare  # the other side's pool spins down
from optimizer.libraries import preload_onednn
from optimizer.passes.load import load_model_split
from optimizer.runtime import session_options
from optimizer.verify import random_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("optimized")
    ap.add_argument("--quiet-ms", type=float, required=True, help="a probe of the original under this is quiet")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--period", type=float, default=10, help="seconds between probes")
    ap.add_argument("--probe-runs", type=int, default=100, help="runs a probe (of the original, or --probe-model)")
    ap.add_argument("--block-runs", type=int, default=40, help="runs of one side in a block of a pair")
    ap.add_argument("--compare-rounds", type=int, default=10, help="rounds of compare after a spell (0: none)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ORT's, one a core)")
    ap.add_argument("--batch", type=int, default=1, help="the batch of a symbolic first dimension")
    ap.add_argument("--log", help="also append every line to this file")
    ap.add_argument("--probe-model", help="probe this model instead of the original (one whose quiet time is known)")
    args = ap.parse_args()
    preload_onednn()
    paths = [args.original, args.optimized] + ([args.probe_model] if args.probe_model else [])
    feeds = [random_inputs(load_model_split(path)[0], batch=args.batch) for path in paths]
    sessions = [ort.InferenceSession(path, session_options(threads=args.threads), providers=["CPUExecutionProvider"])
                for path in paths]
    probe_side = 2 if args.probe_model else 0

    def block(side: int, runs: int) -> float:
        """Median ms of `runs` runs of one side, after SPINNING_SETTLE_SECONDS of untimed ones."""
        settled = time.perf_counter() + SPINNING_SETTLE_SECONDS
        while time.perf_counter() < settled:
            sessions[side].run(None, feeds[side])
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            sessions[side].run(None, feeds[side])
            times.append(time.perf_counter() - start)
        return float(np.median(times)) * 1e3

    def say(line: str) -> None:
        line = f"{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} {line}"
        print(line, flush=True)
        if args.log:
            with open(args.log, "a") as log:
                print(line, file=log)

    for side in range(len(sessions)):  # first runs: allocations, oneDNN's primitives, the library's kernel timings
        block(side, 20)
    end = time.time() + args.minutes * 60
    every_quiet_pair: list[float] = []
    while time.time() < end:
        probe = block(probe_side, args.probe_runs)
        if probe >= args.quiet_ms:
            say(f"probe {probe:.3f} ms")
        else:
            original, optimized, counted = [], [], []
            while len(original) < 20 and (not counted or counted[-1]):
                optimized.append(block(1, args.block_runs))
                original.append(block(0, args.block_runs))
                # with a probe model, the pair counts where the probe after it still reads quiet
                after_pair = original[-1] if probe_side == 0 else block(probe_side, args.block_runs)
                counted.append(after_pair < args.quiet_ms)
            quiet = [a / b for a, b, c in zip(original, optimized, counted) if c]
            every_quiet_pair += quiet
            compared = ""
            if args.compare_rounds > 0:
                r = compare(args.original, args.optimized, backend="ort-cpu", batch=args.batch, spinning=True,
                            rounds=args.compare_rounds, threads=args.threads)
                compared = (f"; compare original {r['original_ms']:.3f} ms, optimized {r['optimized_ms']:.3f} ms, "
                            f"{r['speedup']:.3f}x ({r['speedup_q1']:.3f}-{r['speedup_q3']:.3f})")
            after = block(probe_side, args.probe_runs)
            ratios = (f"{len(quiet)} quiet pairs, median {np.median(quiet):.3f}x ({min(quiet):.3f}-{max(quiet):.3f})"
                      if quiet else "no quiet pair")
            say(f"probe {probe:.3f} ms, quiet: {ratios} (blocks, original / optimized ms: "
                f"{' '.join(f'{v:.2f}' for v in original)} / {' '.join(f'{v:.2f}' for v in optimized)})"
                f"{compared}; probe after {after:.3f} ms ({'quiet' if after < args.quiet_ms else 'loaded'})")
            if every_quiet_pair:
                q1, median, q3 = np.percentile(every_quiet_pair, [25, 50, 75])
                say(f"every quiet pair so far: {len(every_quiet_pair)}, median {median:.3f}x "
                    f"(interquartile {q1:.3f}-{q3:.3f}, {min(every_quiet_pair):.3f}-{max(every_quiet_pair):.3f})")
        time.sleep(args.period)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
