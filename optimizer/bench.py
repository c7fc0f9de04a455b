"""`epifuse bench` and `epifuse tune`: latency and throughput of a model on ONNX Runtime (CPU or
CUDA EP, the epifuse library registered), and the one-time kernel tuning run for the CUDA EP."""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np


def _session(model_bytes: bytes, backend: str, cuda_graph: bool, prefer_nhwc: bool = False):
    from .runtime import create_session

    return create_session(model_bytes, backend=backend, cuda_graph=cuda_graph, prefer_nhwc=prefer_nhwc)


def _plan_feeds(runner, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name in runner.inputs:
        shape = [batch if i == 0 and d < 0 else (d if d >= 0 else 32)
                 for i, d in enumerate(runner.engine.get_tensor_shape(name))]
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run_bench(path: str, *, backend: str, batch: int, fp16: bool, runs: int, warmup: int, progress=None,
              prefer_nhwc: bool = False) -> dict:
    """Median/p90/p99 latency (ms) and throughput (inputs/s) of `path` on `backend` (an .onnx for
    ONNX Runtime, a TensorRT .plan for tensorrt); `prefer_nhwc` for the CUDA EP only."""
    if prefer_nhwc and backend != "ort-cuda":
        raise ValueError(f"prefer_nhwc is an option of the ort-cuda backend, not {backend}")
    if backend == "tensorrt":
        from .tensorrt import PlanRunner

        runner = PlanRunner(path)
        feeds = _plan_feeds(runner, batch)
        runner.bind(feeds)
        return _timed(path, backend, next(iter(feeds.values())).shape[0], False, runner.run_device, runs, warmup,
                      progress)
    from .passes.load import load_model

    model = load_model(path)
    if fp16:
        from .pipeline import optimize_model

        model, _ = optimize_model(model, target=backend, precision="fp16")
    from .verify import random_inputs

    feeds = random_inputs(model, batch=batch)
    batch = next(iter(feeds.values())).shape[0]  # a static batch dimension wins over --batch
    session = _session(model.SerializeToString(), backend, cuda_graph=False, prefer_nhwc=prefer_nhwc)
    if backend == "ort-cuda":
        import onnxruntime as ort

        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for out in session.get_outputs():
            binding.bind_output(out.name, "cuda", 0)

        def once():
            session.run_with_iobinding(binding)
            binding.synchronize_outputs()
    else:
        def once():
            session.run(None, feeds)
    return _timed(path, backend, batch, fp16, once, runs, warmup, progress)


def _timed(path, backend, batch, fp16, once, runs, warmup, progress) -> dict:
    for i in range(warmup):
        once()
        if progress:
            progress("warm-up", i + 1, warmup)
    times = []
    for i in range(runs):
        start = time.perf_counter()
        once()
        times.append((time.perf_counter() - start) * 1e3)
        if progress:
            progress("timed runs", i + 1, runs)
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"model": path, "backend": backend, "batch": batch, "fp16": fp16, "runs": runs,
            "median_ms": statistics.median(times), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
            "min_ms": times[0], "throughput_per_s": batch * 1e3 / statistics.median(times)}


@contextlib.contextmanager
def tuning():
    """EPIFUSE_TUNE=1 (read by the library when a kernel is first chosen) for the block, then as it was:
    a caller's own EPIFUSE_TUNE=1 must outlive the block, or later fusion decisions would time
    untuned kernels against ORT."""
    before = os.environ.get("EPIFUSE_TUNE")
    os.environ["EPIFUSE_TUNE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["EPIFUSE_TUNE"]
        else:
            os.environ["EPIFUSE_TUNE"] = before


def run_tune(path: str, *, batch: int, target: str = "ort-cuda") -> str:
    """Runs `path` once on `target` with EPIFUSE_TUNE=1: every FusedConv times its kernels (on the CUDA
    EP every valid one; on the CPU its direct kernel against oneDNN, more carefully than a first run
    does) and the winners go to the tuning cache, which later sessions on this machine read."""
    from .passes.load import load_model
    from .verify import random_inputs

    with tuning():
        model = load_model(path)
        session = _session(model.SerializeToString(), target, cuda_graph=False)
        session.run(None, random_inputs(model, batch=batch))
    return os.environ.get("EPIFUSE_TUNING_CACHE", os.path.expanduser("~/.cache/epifuse/tuning.tsv"))
