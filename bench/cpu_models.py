"""Whole models on ONNX Runtime's CPU EP: the original against `epifuse optimize` (default target
ort-cpu, fp32, decisions measured on this machine), in one process, interleaved rounds
(`epifuse compare`), batch 1. Prints a markdown table: ORT on the original, epifuse, the speed-up
with its interquartile range, how many candidates fused, and the optimizer's time (measuring
included, with an empty costs cache).

    python bench/cpu_models.py [--models-dir DIR] [--zoo] [--rounds 30] [--markdown FILE] [--also-always]
                               [--one-thread] [--spinning] [--profile] [--precision bf16]

DIR holds .onnx files (bench/export_models.py writes torchvision/timm/ultralytics exports there).
--also-always: also the model with every candidate fused (--fuse always). --one-thread: also the optimized
model against the original on one intra-op thread (the whole-model check's second run). --spinning: also
the speed-ups with the thread pools as ONNX Runtime's defaults leave them, spinning between runs and
between a run's nodes (`epifuse compare --spinning`: 10 rounds of 0.3 s a side; the main columns' pools
sleep when idle, which costs a model of many small nodes a wake-up at each). --profile: also
where the time goes, per op type (`epifuse compare --by-op`), in the original and in the model with every
candidate fused. --precision bf16: optimized in bfloat16 (against the float32 original), with each model's
relative L2 error against the original (`epifuse optimize --verify`'s check) in a column of its own.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort

from models import zoo
from optimizer import __version__, registry
from optimizer.compare import compare, compare_by_op
from optimizer.errors import EpifuseError
from optimizer.measure import _cpu_name
from optimizer.pipeline import FusionPolicy, optimize_file
from optimizer.verify import verify


def _times(speedup: float) -> str:
    return "-" if speedup != speedup else f"{speedup:.3f}x"  # NaN: not run


SPINNING_ROUNDS = 10


def row(name: str, path: Path, work: Path, rounds: int, also_always: bool, one_thread: bool,
        precision: str = "fp32", spinning: bool = False) -> dict:
    out = work / f"{name.replace('/', '_')}.epifuse.onnx"
    cache = work / f"{name.replace('/', '_')}.costs.json"  # empty: the optimizer's time includes measuring
    start = time.perf_counter()
    report = optimize_file(str(path), str(out), precision=precision,
                           policy=FusionPolicy(mode="auto", cache_path=str(cache)))
    seconds = time.perf_counter() - start
    original, optimized = str(path), str(out)  # paths: ONNX Runtime reads the files, no copy held here
    result = compare(original, optimized, backend="ort-cpu", rounds=rounds)
    fused = sum(d.fused for d in report.decisions)
    single = float("nan")
    if one_thread:
        single = compare(original, optimized, backend="ort-cpu", rounds=rounds, threads=1)["speedup"]
    spun = spun_always = always = float("nan")
    if spinning:
        spun = compare(original, optimized, backend="ort-cpu", rounds=SPINNING_ROUNDS, spinning=True)["speedup"]
    if also_always:  # every candidate fused: the CPU kernel against ORT's convolutions, layer for layer
        out_always = work / f"{name.replace('/', '_')}.always.onnx"
        optimize_file(str(path), str(out_always), precision=precision, policy=FusionPolicy(mode="always"))
        fused_always = str(out_always)
        always = compare(original, fused_always, backend="ort-cpu", rounds=rounds)["speedup"]
        if spinning:
            spun_always = compare(original, fused_always, backend="ort-cpu", rounds=SPINNING_ROUNDS,
                                  spinning=True)["speedup"]
    return {"always": always, "one thread": single, "spinning": spun, "always, spinning": spun_always,
            "model": name, "ort ms": result["original_ms"], "epifuse ms": result["optimized_ms"],
            "speed-up": result["speedup"], "q1": result["speedup_q1"], "q3": result["speedup_q3"],
            "fused": f"{fused}/{len(report.decisions)}", "optimize s": seconds,
            "measure s": report.pass_seconds.get("measure", 0.0),
            "rel L2": verify(str(path), str(out), precision=precision)["worst_rel_l2"] if precision != "fp32" else None}


def print_profile(name: str, original: Path, fused: Path) -> None:
    sides = compare_by_op(str(original), str(fused))
    for side, what in (("original", "ORT on the original"), ("optimized", "every candidate fused")):
        times = sides[side]
        print(f"{name}, {what}: {sum(times.values()):.2f} ms of kernels a run")
        for op, ms in list(times.items())[:10]:
            print(f"  {op:24s} {ms:8.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", help="folder of .onnx files to run")
    ap.add_argument("--zoo", action="store_true", help="also the embedded zoo models (models/zoo.py)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--also-always", action="store_true", help="also time --fuse always (every candidate fused)")
    ap.add_argument("--one-thread", action="store_true", help="also the speed-up on one intra-op thread")
    ap.add_argument("--spinning", action="store_true",
                    help="also the speed-ups with ONNX Runtime's default (spinning) thread pools")
    ap.add_argument("--markdown")
    ap.add_argument("--profile", action="store_true", help="also the time per op type in both models")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="the optimized models' precision (the originals run float32)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="epifuse-cpu-bench-"))
    paths = sorted(Path(args.models_dir).glob("*.onnx")) if args.models_dir else []
    named = [(p.stem, p) for p in paths]
    if args.zoo:
        for name in sorted(zoo.ZOO):
            path = work / f"zoo_{name}.onnx"
            onnx.save(zoo.build(name, batch=1), path)
            named.append((f"zoo/{name}", path))
    rows = []
    for name, path in named:
        try:
            rows.append(row(name, path, work, args.rounds, args.also_always or args.profile, args.one_thread,
                            args.precision, args.spinning))
        except EpifuseError as e:  # a model this precision cannot take (bf16 below opset 13): said, not fatal
            print(f"{name}: skipped: {e}", flush=True)
            continue
        r = rows[-1]
        print(f"{name}: {r['speed-up']:.3f}x ({r['q1']:.3f}-{r['q3']:.3f}), fused {r['fused']}, "
              f"optimize {r['optimize s']:.1f} s; one thread {_times(r['one thread'])}; "
              f"fuse=always {_times(r['always'])}; spinning {_times(r['spinning'])}, fuse=always "
              f"{_times(r['always, spinning'])}", flush=True)
        if args.profile:
            print_profile(name, path, work / f"{name.replace('/', '_')}.always.onnx")
    header = (f"{_cpu_name()}, {len(os.sched_getaffinity(0))} threads, onnxruntime {ort.__version__}, epifuse "
              f"{__version__} ({registry.onednn_version() or 'no oneDNN'}), Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    low = args.precision != "fp32"
    header += f", optimized in {args.precision}" if low else ""
    spun = args.spinning
    lines = [header, "", "| model | ORT ms | epifuse ms | speed-up | interquartile | fused | optimize s (measuring) | "
             "one thread | fuse=always |" + (" spinning | fuse=always, spinning |" if spun else "") +
             (" rel L2 |" if low else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if spun else "") + ("---:|" if low else "")]
    lines += [f"| {r['model']} | {r['ort ms']:.2f} | {r['epifuse ms']:.2f} | {r['speed-up']:.3f}x | "
              f"{r['q1']:.3f}-{r['q3']:.3f} | {r['fused']} | {r['optimize s']:.1f} ({r['measure s']:.1f}) | "
              f"{_times(r['one thread'])} | {_times(r['always'])} |" +
              (f" {_times(r['spinning'])} | {_times(r['always, spinning'])} |" if spun else "") +
              (f" {r['rel L2']:.1e} |" if low else "")
              for r in rows]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
