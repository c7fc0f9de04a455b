"""`epifuse compare` and `epifuse optimize --bench`: the original and the optimized model on the target,
in one process, timed in interleaved rounds (the order alternates each round), so drift in the
machine's speed falls on both alike. The speed-up is the median of the per-round ratios (each round
pairs two runs close in time, so a slow spell of the machine cancels); its spread is their
interquartile range. "Slower" means at least three rounds in four had the
optimized model slower (the upper quartile of the ratios below 1), not a median a hair under 1.

On ort-cuda each model runs as ONNX Runtime's best configuration would: CUDA graph on where the model
allows it, device-resident inputs and outputs, and the better of prefer_nhwc off and on. With
`precision` fp16 or bf16, the baseline is the original converted by epifuse with nothing fused (its
BatchNorms, per-channel affines and shape arithmetic folded as in the optimized model, the precision
converted), since ORT does not convert a model's precision itself: what those rewrites gain does not
show in such a comparison, only what fusion gains.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time

import onnx

from .errors import EpifuseError
from .runtime import cpu_threads, create_session, session_options

ROUND_SECONDS = 0.02


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


Model = onnx.ModelProto | str  # a model, or the path of one (ONNX Runtime then reads the file itself)


def baseline(model: Model, target: str, precision: str) -> Model:
    """What ONNX Runtime is compared against: the original, or for fp16/bf16 the original in that
    precision with nothing fused, where that is what the runtime would run (not bf16 on the CPU EP,
    where the precision pass leaves every unfused node float32: there it is the original, as for the
    whole-model check)."""
    from .pipeline import original_is_the_baseline, unfused_model  # noqa: PLC0415

    if original_is_the_baseline(target, precision):
        return model
    from .passes.load import load_model  # noqa: PLC0415

    return unfused_model(load_model(model) if isinstance(model, str) else model, target, precision)


def _source(model: Model) -> str | bytes:
    """What a session opens: a path as it is (no copy of the weights in this process beside the
    session's own), a model serialized."""
    return model if isinstance(model, str) else model.SerializeToString()


def _graph_inputs(model: Model) -> onnx.ModelProto:
    """A model whose inputs `random_inputs` can read: a path is read without its weights."""
    if not isinstance(model, str):
        return model
    from .passes.load import load_model_split  # noqa: PLC0415

    return load_model_split(model)[0]


class _CpuRunner:
    """The CPU EP with its default threads (or `threads`), spinning off: a pool that spins after its run
    would take a core from the other model's run, which on a small machine costs either side 10-30% at
    random. `spinning`: ONNX Runtime's default pool, spinning between runs (see `compare`)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict, threads: int | None = None, spinning: bool = False):
        self.session = create_session(_source(model), backend="ort-cpu", allow_spinning=spinning, threads=threads)
        self.feeds = feeds

    def __call__(self) -> float:
        start = time.perf_counter()
        self.session.run(None, self.feeds)
        return time.perf_counter() - start


class _CudaRunner:
    """One session on the CUDA EP with inputs and outputs bound on the device; CUDA graph where the
    model allows it (every node on the CUDA EP)."""

    def __init__(self, data: bytes, feeds: dict, outputs: dict, prefer_nhwc: bool):
        import onnxruntime as ort  # noqa: PLC0415

        for graph in (True, False):
            try:
                self.session = create_session(data, backend="ort-cuda", cuda_graph=graph, prefer_nhwc=prefer_nhwc)
                self.binding = self.session.io_binding()
                for name, value in feeds.items():
                    self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
                for name, value in outputs.items():
                    self.binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_shape_and_type(
                        value.shape, value.dtype, "cuda", 0))
                for _ in range(2):  # the first run with a graph captures it
                    self.session.run_with_iobinding(self.binding)
                self.cuda_graph = graph
                return
            except Exception:  # noqa: BLE001 (a node outside the CUDA EP: run without the graph)
                if not graph:
                    raise

    def __call__(self) -> float:
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        return time.perf_counter() - start


def _runners(model: Model, feeds: dict, backend: str, threads: int | None = None, spinning: bool = False) -> list:
    if backend == "ort-cpu":
        return [_CpuRunner(model, feeds, threads, spinning)]
    data = _source(model)
    probe = create_session(data, backend="ort-cuda")
    outputs = dict(zip([o.name for o in probe.get_outputs()], probe.run(None, feeds)))  # shapes a graph can keep
    del probe
    return [_CudaRunner(data, feeds, outputs, prefer_nhwc) for prefer_nhwc in (False, True)]


BEST_OF_ROUNDS = 7


def _best(runners: list, warmup: int) -> object:
    """The fastest of a model's configurations: the median of interleaved rounds of about ROUND_SECONDS
    each. Three single runs chose the slower of two configurations a few % apart often enough that
    two identical models read 0.97x: each side had kept a different one."""
    if len(runners) == 1:
        return runners[0]
    times = interleaved(runners, BEST_OF_ROUNDS, warmup)
    return runners[min(range(len(runners)), key=lambda i: statistics.median(times[i]))]


def interleaved(sides: list, rounds: int, warmup: int, progress=None, round_seconds: float | None = None,
                settle_seconds: float = 0.0) -> list[list[float]]:
    """Milliseconds per call of each side (a callable that runs once and returns its seconds) in each
    of `rounds` rounds, the order reversing every round so drift in the machine's speed falls on all
    alike; `warmup` untimed calls each first. A round runs each side for about `round_seconds` (None:
    ROUND_SECONDS), after `settle_seconds` of untimed calls."""
    for _ in range(warmup):
        for run in sides:
            run()
    # a round runs each side for about round_seconds, so a sub-millisecond model is not timed by one call
    round_seconds = ROUND_SECONDS if round_seconds is None else round_seconds
    fastest = max(min(run() for run in sides), 1e-6)
    calls = max(1, min(1000, int(round_seconds / fastest)))
    settle = math.ceil(settle_seconds / fastest)
    times: list[list[float]] = [[] for _ in sides]
    for r in range(rounds):
        for i in (range(len(sides)) if r % 2 == 0 else reversed(range(len(sides)))):
            for _ in range(settle):
                sides[i]()
            times[i].append(sum(sides[i]() for _ in range(calls)) * 1e3 / calls)
        if progress:
            progress(r + 1, rounds)
    return times


# ort-cpu with `spinning`: each side's pool spins between runs, as ONNX Runtime's does by default, so
# each round first runs untimed while the other side's pool spins down (it spins on for tens of ms after
# its last run: in rounds of 5 runs, MobileNetV3-Large read 4.5 ms a run against 2.9 alone), and then
# long enough for that to be a small part.
SPINNING_ROUND_SECONDS = 0.3
SPINNING_SETTLE_SECONDS = 0.06


def compare(original: Model, optimized: Model, *, backend: str, batch: int = 1,
            precision: str = "fp32", rounds: int = 30, warmup: int = 3, progress=None,
            threads: int | None = None, spinning: bool = False, round_seconds: float | None = None) -> dict:
    """Interleaved timing of `original` (its baseline, see `baseline`) and `optimized` on `backend`;
    each a model or the path of one. `threads`: ort-cpu's intra-op threads (None: ORT's default).
    `spinning` (ort-cpu): the thread pools as ONNX Runtime's defaults leave them, spinning between a
    run's nodes and after it (rounds of SPINNING_ROUND_SECONDS): what a process running one model back to
    back sees. Off (the default: 20 ms rounds), the pools sleep whenever idle, between a run's nodes too,
    and a model of many small nodes pays a wake-up at each: MobileNetV3-Large runs 4.5 ms a run against
    2.9 with spinning, and a fusion that removes nodes reads faster than a default session finds it.
    `round_seconds`: each side's time in a round instead of the mode's default."""
    if backend not in ("ort-cpu", "ort-cuda"):
        raise EpifuseError(f"compare runs on ort-cpu or ort-cuda, not {backend}")
    if spinning and backend != "ort-cpu":
        raise EpifuseError("spinning thread pools are ort-cpu's")
    cpu_threads(threads, backend)
    if rounds < 2:
        raise EpifuseError(f"--runs must be at least 2, got {rounds}")
    from .verify import random_inputs  # noqa: PLC0415

    reference = baseline(original, backend, precision)
    feeds = random_inputs(_graph_inputs(reference), batch=batch)
    sides = [_best(_runners(m, feeds, backend, threads, spinning), warmup) for m in (reference, optimized)]
    if spinning:
        times = interleaved(sides, rounds, warmup, progress, round_seconds or SPINNING_ROUND_SECONDS,
                            SPINNING_SETTLE_SECONDS)
    else:
        times = interleaved(sides, rounds, warmup, progress, round_seconds)
    ratios = [a / b for a, b in zip(*times)]
    q1, q3 = _quartiles(ratios)
    original_ms, optimized_ms = statistics.median(times[0]), statistics.median(times[1])
    return {"backend": backend, "batch": int(next(iter(feeds.values())).shape[0]) if feeds else batch,
            "precision": precision, "rounds": rounds, "original_ms": original_ms, "optimized_ms": optimized_ms,
            "speedup": statistics.median(ratios), "speedup_q1": q1, "speedup_q3": q3, "slower": q3 < 1.0,
            "threads": threads, "spinning": spinning, "ratios": ratios,
            "cuda_graph": [getattr(s, "cuda_graph", False) for s in sides]}


def pooled(first: dict, second: dict) -> dict:
    """Two readings of `compare` on the same pair judged as one: their rounds together."""
    ratios = first["ratios"] + second["ratios"]
    q1, q3 = _quartiles(ratios)
    return dict(second, rounds=len(ratios), ratios=ratios, speedup=statistics.median(ratios), speedup_q1=q1,
                speedup_q3=q3, slower=q3 < 1.0)


def time_by_op(model: Model, feeds: dict, runs: int = 20, threads: int | None = None) -> dict[str, float]:
    """Kernel time of each op type of `model` on ONNX Runtime's CPU EP, ms a run (the median over `runs`
    runs after a warm-up one), read from ORT's profiler: where a model's time goes. The profiler adds a
    few µs to every node it times, so a model of many small nodes reads slower than it runs."""
    import onnxruntime as ort  # noqa: PLC0415

    from .measure import kernel_times_by_run  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="epifuse-profile-") as folder:
        options = session_options(threads=threads, enable_profiling=True,
                                  profile_file_prefix=os.path.join(folder, "profile"))
        session = ort.InferenceSession(_source(model), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    ops = {e["args"]["op_name"] for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
    times = {op: statistics.median(sum(run) for run in kernel_times_by_run(
        events, lambda e, op=op: e.get("args", {}).get("op_name") == op)) / 1e3 for op in ops}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def compare_by_op(original: Model, optimized: Model, *, batch: int = 1, runs: int = 20,
                  threads: int | None = None) -> dict:
    """`time_by_op` of both models on the same random inputs: {"original": {...}, "optimized": {...}}."""
    from .verify import random_inputs  # noqa: PLC0415

    feeds = random_inputs(_graph_inputs(original), batch=batch)
    return {side: time_by_op(model, feeds, runs, threads) for side, model in (("original", original),
                                                                             ("optimized", optimized))}


def summary(result: dict) -> str:
    verdict = "[red]slower[/red]" if result["slower"] else "faster" if result["speedup_q1"] > 1.0 else "about the same"
    pools = ", spinning thread pools" if result.get("spinning") else ""
    return (f"{result['backend']}{pools}, batch {result['batch']}, {result['precision']}: original "
            f"{result['original_ms']:.3f} ms, optimized {result['optimized_ms']:.3f} ms — speed-up "
            f"{result['speedup']:.2f}x (interquartile {result['speedup_q1']:.2f}-{result['speedup_q3']:.2f}x over "
            f"{result['rounds']} interleaved rounds): {verdict}")
