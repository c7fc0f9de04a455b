"""`epifuse build-engine OPT --original ORIG`: the engine with the FusedConv plugin against TensorRT's own.

TensorRT fuses conv + bias + activation + residual Add itself, so the plugin is a claim to beat
TensorRT's own kernels; this checks it on the GPU the engine is for, as TensorRT's tactic timing does
per layer: both engines are built with the same shapes and timing cache, run in interleaved rounds on
the same inputs, and the epifuse engine is kept only where its median is below MARGIN of the other's.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compare import interleaved
from .build import EngineReport, build_engine

MARGIN = 0.98      # the plugin's engine must be at least 2% faster: a tie goes to TensorRT's own


@dataclass
class Choice:
    kept: str                  # "epifuse" or "tensorrt"
    epifuse_ms: float          # medians over the rounds
    tensorrt_ms: float
    report: EngineReport       # the kept engine's

    def summary(self) -> str:
        kept = "the epifuse engine" if self.kept == "epifuse" else "TensorRT's own (no plugin layers)"
        return f"epifuse engine {self.epifuse_ms:.3f} ms, TensorRT's own {self.tensorrt_ms:.3f} ms a run: kept {kept}"


def faster(times: dict[str, list[float]]) -> str:
    """Which engine to keep from per-round times (ms) of "epifuse" and "tensorrt"."""
    ours, theirs = statistics.median(times["epifuse"]), statistics.median(times["tensorrt"])
    return "epifuse" if ours < MARGIN * theirs else "tensorrt"


def _timed(run, clock=time.perf_counter):
    """`run` as a side of optimizer.compare.interleaved: runs once, returns its seconds."""
    def side() -> float:
        start = clock()
        run()
        return clock() - start
    return side


def _feeds(runner) -> dict[str, np.ndarray]:
    """Random inputs at the shapes the engine was built for (its profile's opt shape where dynamic)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for name in runner.inputs:
        shape = tuple(runner.engine.get_tensor_shape(name))
        if any(d < 0 for d in shape):
            shape = tuple(runner.engine.get_tensor_profile_shape(name, 0)[1])
        kind = runner.engine.get_tensor_dtype(name).name
        feeds[name] = (rng.standard_normal(shape).astype(np.float32) if kind in ("FLOAT", "HALF", "BF16")
                       else np.zeros(shape, np.int64))
    return feeds


def build_faster_engine(model: str | os.PathLike, original: str | os.PathLike, output: str | os.PathLike, *,
                        rounds: int = 20, plugin_library: str | None = None, **build_options) -> Choice:
    """Builds `model` (an epifuse model) and `original` (the same network in the same precision, no
    FusedConv: what TensorRT fuses itself), times both here, and writes the faster plan to `output`."""
    from .run import PlanRunner  # noqa: PLC0415 (torch and a GPU are needed from here on)

    folder = Path(output).resolve().parent
    with tempfile.TemporaryDirectory(dir=folder, prefix=".epifuse-engines-") as tmp:
        reports = {"epifuse": build_engine(model, Path(tmp) / "epifuse.plan", plugin_library=plugin_library,
                                           **build_options),
                   "tensorrt": build_engine(original, Path(tmp) / "tensorrt.plan", plugin_library=plugin_library,
                                            **build_options)}
        engines = {name: PlanRunner(r.plan, plugin_library) for name, r in reports.items()}
        feeds = _feeds(engines["epifuse"])
        for engine in engines.values():
            engine.bind(feeds)
        names = list(engines)
        # warm-up: the first enqueues allocate
        times = dict(zip(names, interleaved([_timed(engines[n].run_device) for n in names], rounds, warmup=3)))
        del engines
        kept = faster(times)
        os.replace(reports[kept].plan, output)  # same folder: atomic, the other plan goes with the folder
        report = reports[kept]
        report.plan = str(output)
    return Choice(kept, statistics.median(times["epifuse"]), statistics.median(times["tensorrt"]), report)
