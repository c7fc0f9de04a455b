"""The optimizer pipeline: load → canonicalize → shape arithmetic to constants → zero Pads into Conv pads
(ort-cpu) → fold BN → fold per-channel affines → activation ops (ort-cpu) → fuse → small pools as convs,
fused → layout → unfolded BNs back to BatchNormalization (fp32) → NHWC pools → the library's CPU scale, mean
and norm ops (ort-cpu) → precision → input layout (ORT) → cleanup → whole-model check (where fusions were
measured here) → save."""
from __future__ import annotations

import gc
import hashlib
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from .compare import pooled
from .contract import CUDA_TARGETS, DOMAIN, PRECISIONS, TARGETS
from .costs import Costs, CostTable, FileCosts, MeasuredCosts, default_cache_path
from .decide import MODES, Decider
from .errors import EpifuseError
from .passes.activation_ops import activation_ops
from .passes.affine_to_batchnorm import affine_to_batchnorm
from .passes.canonicalize import canonicalize, concat_of_slices
from .passes.channel_mean import channel_mean
from .passes.channel_copy import channel_copy
from .passes.channel_scale import channel_scale
from .passes.conv_mean import conv_mean, split_conv_means
from .passes.conv_scale import conv_scale, split_conv_scales
from .passes.pointwise_depthwise import DEPTHWISE_FIRST_OP_TYPE as DEPTHWISE_FIRST_PAIR
from .passes.pointwise_depthwise import PAIR_OP_TYPES
from .passes.pointwise_depthwise import pointwise_depthwise, split_pointwise_depthwise
from .passes.cleanup import cleanup
from .passes.fc_as_conv import fc_as_conv
from .passes.fold_affine import fold_affine
from .passes.fold_batchnorm import fold_batchnorm
from .passes.fuse_conv import fuse_conv
from .passes.input_layout import input_layout
from .passes.layer_norm import layer_norm
from .passes.layout import layout
from .passes.load import load_model, load_model_split, validate
from .passes.matmul_as_conv import matmul_as_conv
from .passes.nearest_upsample import nearest_upsample
from .passes.nhwc_pools import nhwc_pools
from .passes.pad_into_conv import pad_into_conv
from .passes.pool_as_conv import pool_as_conv
from .passes.precision import precision as convert_precision
from .passes.scaled_residual import scaled_residual
from .passes.save import check_output_path, save_model
from .passes.shape_constants import shape_constants
from .proto import SplitModel, skeleton
from .report import Report
from .runtime import cpu_cores, cpu_threads

G_LOGGER.severity = G_LOGGER.ERROR  # gs warns about optional colour output on first use
LARGE_MODEL_BYTES = 32 * 2**20
# Default measuring budgets: a CPU candidate takes 10-100 ms to time, a GPU one about 0.5-2 s (sessions
# per side and batch size, cuDNN's algorithm search when each starts): on an H200 at two batch sizes,
# ResNeXt-50 took 35 s, MixNet-S 102 s. The cache makes a second optimization of the same model free.
MEASURE_BUDGET_S = {"ort-cpu": 30.0, "ort-cuda": 300.0, "tensorrt": 0.0}
MODEL_CHECK_ROUNDS = 15  # interleaved rounds of the whole-model check, per batch size
# On ort-cpu the check times both models as ONNX Runtime's default sessions run them, a thread pool
# spinning between nodes and runs (compare's `spinning`), in rounds of 0.1 s a side. Pools that sleep
# whenever idle make each node of a many-node model pay a wake-up, which flatters whatever has fewer
# nodes, and compare's 20 ms rounds (a few runs of a 3-5 ms model) spread widely: MobileNetV3-Large fused
# throughout read 0.992x (interquartile 0.966-1.115x) so, and 1.08-1.10x (interquartiles within
# 1.056-1.130x) in four spinning readings on a 2-core Xeon. On one thread there is no pool, but the
# spinning mode's untimed runs at the start of each side's turn keep its first, cold runs out: in 0.1 s
# rounds its readings spread 0.93-1.10x without them and 0.99-1.04x with them. A reading takes 3-5 s.
MODEL_CHECK_CPU_ROUND_SECONDS = 0.1
# The check holds the original and the optimized model in two sessions at once (on the CPU each with its
# prepacked filters: about 4x the weights); above this it is left to `epifuse compare`.
MODEL_CHECK_MAX_BYTES = 2**30
# A model is slower where three rounds in four were (compare's "slower") or its median is below this,
# by target: never-slower means at least 0.97x. On a GPU the check's rounds agree within a percent, and
# 0.98 leaves room for that; on a small shared CPU they spread +-5%, a model at 0.95x passed 0.98 now and
# then, and the fusions of a model that shows no gain as a whole are not worth that risk.
MODEL_CHECK_FLOOR = {"ort-cpu": 1.0, "ort-cuda": 0.98}
# A measured candidate left out that was at most this much slower than the runtime's nodes alone may
# still win inside its region (the Transposes around it cost more in the model than timed alone): the
# check also runs the model with these fused and keeps it where it is faster by MODEL_CHECK_GAIN.
NEAR_MISS = 1.25
MODEL_CHECK_GAIN = 1.01
# Where a model passes by less than this over the floor, the check runs again and both must pass: on a
# small shared CPU a model at 0.97-0.99x passed a single check (median 1.004x, interquartile 0.975-1.041x)
# about one time in four.
MODEL_CHECK_CONFIRM = {"ort-cpu": 0.03, "ort-cuda": 0.0}
# On the extra thread count (where a model need only not be slower) a reading that fails by less than
# this is read again and judged with the first, on both readings' rounds: on a 2-core shared Xeon one
# 15-round reading of EfficientNet-B0 fused throughout on one thread read 0.98-1.08x (about 1.04 at
# heart), so one in three failed and the check fell back to a model at 1.01x instead of 1.16x.
MODEL_CHECK_REREAD = {"ort-cpu": 0.03, "ort-cuda": 0.0}


@dataclass
class FusionPolicy:
    """How the fuse pass decides what fuses (optimizer.decide).

    `mode`: "auto" (measured or costs-file times, else the static policy), "static" or "always"; None
    reads $EPIFUSE_FUSE, default "auto". `costs_file`: times measured earlier on the target (`epifuse
    tune --export-costs`); without one, "auto" measures on this machine where it can run the target
    (ort-cpu always; ort-cuda with a GPU, onnxruntime-gpu and a CUDA build), within `measure_budget_s`
    seconds (None: MEASURE_BUDGET_S for the target), caching what it measured in `cache_path`. `batches`: the batch sizes a symbolic batch
    dimension is decided for (a candidate fuses only where faster at each). `threads`: ort-cpu's
    intra-op threads the model will run with, measured and checked with; None: ONNX Runtime's default
    (one per core), the whole model also checked on one thread, where a model decided on the default
    can be slower. `timer`: a measuring timer to use instead of ONNX Runtime's (tests). `allow_tf32`: fp32 FusedConvs for a CUDA target may compute
    in TF32 on the tensor cores (their allow_tf32 attribute), as cuDNN, ONNX Runtime and PyTorch compute
    fp32 convs by default; False keeps fp32-level accuracy (`--precision fp32-strict`)."""

    mode: str | None = None
    costs_file: str | None = None
    costs_device: str | None = None
    measure_budget_s: float | None = None
    batches: tuple[int, ...] = (1,)
    threads: int | None = None
    timer: object | None = None
    cache_path: str | None = None
    clock: object = time.perf_counter
    export_costs: str | None = None
    model_check: object | None = None
    exclude: frozenset[str] = frozenset()  # candidates (report node names) never fused: the check's variants
    allow_tf32: bool = True
    # 1x1 convs merged with the depthwise conv that reads them (`pointwise_depthwise`), depthwise convs with
    # the 1x1 conv that reads them (`depthwise_pointwise`) (ort-cpu, passes/pointwise_depthwise.py), where
    # the whole-model check will judge them (_pairs_wanted); its variants leave them out
    pointwise_depthwise: bool = True
    depthwise_pointwise: bool = True
    # the runtime's layout reorders read per model (by the exported graph's hash): the whole-model check's
    # variants, made with replace(policy, ...), share this dict and so read them once
    runtime_reorders: dict = field(default_factory=dict, repr=False, compare=False)

    def model_checker(self):
        """How the whole-model check times a model against the original: `model_check` (a callable like
        `optimizer.compare.compare`, for tests), False for no check, or by default ONNX Runtime on the
        target, when the fusions' times were measured with ONNX Runtime here (not with a test's timer)."""
        if self.model_check is False or (self.model_check is None and self.timer is not None):
            return None
        if self.model_check is None:
            return _check_as_deployed
        return self.model_check

    def resolved_mode(self) -> str:
        mode = self.mode or os.environ.get("EPIFUSE_FUSE", "auto")
        if mode not in MODES:
            raise EpifuseError(f"unknown fusion mode {mode!r} (one of {', '.join(MODES)}; from EPIFUSE_FUSE?)")
        return mode


def _timer_for(target: str, precision: str, threads: int | None = None):
    """ONNX Runtime's timer for `target` on this machine, or (None, why not)."""
    from . import measure  # noqa: PLC0415 (onnxruntime and the native library load on first use)

    if target == "ort-cpu":
        why = measure.cpu_bf16_unavailable() if precision == "bf16" else None
        return (None, why) if why else (measure.OrtCpuTimer(threads), "")
    if target == "ort-cuda":
        why = measure.cuda_measuring_unavailable()
        return (None, why) if why else (measure.OrtCudaTimer(), "")
    return None, "TensorRT candidates are not timed one by one"


def make_decider(policy: FusionPolicy, target: str, precision: str, report: Report) -> Decider:
    mode = policy.resolved_mode()
    cpu_threads(policy.threads, target)
    costs: Costs = Costs()
    if mode == "auto":
        if policy.costs_file:
            costs = FileCosts(policy.costs_file, policy.costs_device)
        else:
            timer, why = ((policy.timer, "") if policy.timer is not None
                          else _timer_for(target, precision, policy.threads))
            if timer is not None:
                cache_path = policy.cache_path or default_cache_path()
                try:
                    cache = CostTable.load(cache_path, missing_ok=True)
                except EpifuseError:
                    cache = CostTable()  # an unreadable cache is measured afresh and rewritten
                budget = policy.measure_budget_s if policy.measure_budget_s is not None else MEASURE_BUDGET_S[target]
                costs = MeasuredCosts(timer, budget_s=budget, cache=cache, cache_path=cache_path,
                                      clock=policy.clock)
            else:
                costs.description = f"no measurement ({why})"
    if policy.export_costs and not isinstance(costs, MeasuredCosts):
        raise EpifuseError(f"--export-costs needs measuring on the target here ({costs.description})")
    report.costs = f"{mode}: {costs.description}"
    tf32 = policy.allow_tf32 and precision == "fp32" and target in CUDA_TARGETS
    return Decider(target, precision, mode, costs, policy.batches, policy.exclude, allow_tf32=tf32)


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def _registry_query(target: str, desc: dict) -> tuple[int, str]:
    from . import registry  # noqa: PLC0415 (loads the native library on first use)

    return registry.kernel_count(target, registry.ConvDesc(**desc))


@contextmanager
def _timed(report: Report, name: str, progress=None, free_memory: bool = False, costs=None):
    """Times a pass into report.pass_seconds; the time `costs` (MeasuredCosts) spends measuring inside
    it goes to "measure" instead."""
    if progress is not None:
        progress(name)
    start, measured = time.perf_counter(), getattr(costs, "seconds", 0.0)
    yield
    if free_memory:
        gc.collect()  # gs tensors reference themselves: replaced weights die only in a cycle collection
    measuring = getattr(costs, "seconds", 0.0) - measured
    report.pass_seconds[name] = report.pass_seconds.get(name, 0.0) + time.perf_counter() - start - measuring
    if measuring:
        report.pass_seconds["measure"] = report.pass_seconds.get("measure", 0.0) + measuring


def optimize_model(model: onnx.ModelProto, *, target: str = "ort-cpu", precision: str = "fp32",
                   report: Report | None = None, kernel_query=None, progress=None,
                   stop_after: str | None = None, policy: FusionPolicy | None = None) -> tuple[onnx.ModelProto, Report]:
    """Runs every pass on a validated model, in memory. `kernel_query(target, desc) -> (count, reason)`
    defaults to the kernel registry in libepifuse_core; `stop_after="fuse"` is what `inspect` uses;
    `policy` says how fusions are decided (default: FusionPolicy())."""
    report = report or Report()
    policy = policy or FusionPolicy()  # one for the passes and the whole-model check's variants
    with _timed(report, "import", progress):
        graph = gs.import_onnx(model)
    split, report = optimize_graph(graph, skeleton(model, keep_small=False, weights_as_inputs=False),
                                   target=target, precision=precision, report=report, kernel_query=kernel_query,
                                   progress=progress, stop_after=stop_after, policy=policy,
                                   input_structure=skeleton(model))
    check = _model_checker(report, target, policy, stop_after, sum(v.nbytes for v in split.weights.values()))
    optimized = split.to_model()
    if check is not None:
        optimized = _whole_model_check(check, model, optimized, target, precision, policy, report, progress,
                                       kernel_query)
    return optimized, report


def _nothing_fuses(target: str, desc: dict) -> tuple[int, str]:
    return 0, "nothing fuses"


def unfused_model(model: onnx.ModelProto, target: str, precision: str, report: Report | None = None) -> onnx.ModelProto:
    """`model` with BatchNorms folded and the precision converted, nothing fused: what the whole-model
    check falls back to, and the baseline `epifuse compare` runs low-precision originals as. With
    `report`, the fused model's report is made to describe it (its decisions kept, marked not fused)."""
    unfused, plain = optimize_model(model, target=target, precision=precision, policy=FusionPolicy(mode="always"),
                                    kernel_query=_nothing_fuses)
    if report is not None:
        _describe_with(report, plain, keep=("decisions", "costs"))
    return unfused


def _describe_with(report: Report, other: Report, keep: tuple[str, ...] = ()) -> None:
    """`report` made to describe the model `other` describes (the whole-model check kept that one), its
    own notes, times, file name and the fields in `keep` kept."""
    for f in fields(Report):
        if f.name not in ("model", "notes", "pass_seconds", "verify", "bench") + keep:
            setattr(report, f.name, getattr(other, f.name))


def _check_as_deployed(original, optimized, *, backend: str, threads: int | None = None, **kwargs) -> dict:
    """`optimizer.compare.compare` as the whole-model check runs it: on ort-cpu in its spinning mode
    (MODEL_CHECK_CPU_ROUND_SECONDS)."""
    from .compare import compare  # noqa: PLC0415 (onnxruntime loads on first use)

    if backend == "ort-cpu":
        kwargs.update(spinning=True, round_seconds=MODEL_CHECK_CPU_ROUND_SECONDS)
    return compare(original, optimized, backend=backend, threads=threads, **kwargs)


def _model_checker(report: Report, target: str, policy: FusionPolicy | None, stop_after: str | None = None,
                   weight_bytes: int = 0):
    """The whole-model check's timer, or None where there is nothing to check: no candidate timed here,
    a target ONNX Runtime does not run, `inspect`'s partial pipeline, or weights too large to hold in two
    sessions at once (the report says so). Where nothing fuses the check still runs: the rewrites that
    are not fusions change the model too."""
    policy = policy or FusionPolicy()
    if stop_after is not None or target not in ("ort-cpu", "ort-cuda"):
        return None
    if not any(d.source.startswith("measured") for d in report.decisions):
        return None  # nothing timed on this machine: the check would time on another than the decisions
    check = policy.model_checker()
    if check is not None and weight_bytes > MODEL_CHECK_MAX_BYTES:
        report.notes.append(f"whole-model check not run: {weight_bytes / 2**30:.1f} GiB of weights, over "
                            f"{MODEL_CHECK_MAX_BYTES / 2**30:g} GiB (run `epifuse compare` on the target)")
        return None
    return check


def _threads_to_check(target: str, threads: int | None) -> list[int | None]:
    """The intra-op thread counts the whole model is checked on: `threads`; for ONNX Runtime's default
    (None) on a machine of several cores, also one thread (a server's workers often run on one), where a
    thin gain measured on the default did not hold (MobileNetV3-Large 1.06x on two Zen 4 threads, 0.95x
    on one)."""
    if target == "ort-cpu" and threads is None and cpu_cores() > 1:
        return [None, 1]
    return [threads]


def _batches_to_check(original: onnx.ModelProto, batches: tuple[int, ...]) -> list[int]:
    """The batch sizes decided for where a data input (not a weight listed as an input) has a symbolic
    first dimension; else one run, at the first data input's own batch size."""
    weights = {t.name for t in original.graph.initializer}
    firsts = [vi.type.tensor_type.shape.dim[0] for vi in original.graph.input
              if vi.name not in weights and vi.type.tensor_type.shape.dim]
    if any(not (d.HasField("dim_value") and d.dim_value > 0) for d in firsts):
        return list(batches)
    return [firsts[0].dim_value] if firsts else [1]


def _reoptimized(original: onnx.ModelProto, target: str, precision: str, policy: FusionPolicy, kernel_query,
                 exclude: set[str], **changes) -> tuple[onnx.ModelProto, Report]:
    """A variant for the whole-model check: the original optimized again from the times already measured
    (nothing new measured, no check of its own), the candidates `exclude` names left unfused, and (unless
    `changes` say otherwise) no pointwise-depthwise pairs: the check judges those on a model of its own."""
    changes.setdefault("pointwise_depthwise", False)
    changes.setdefault("depthwise_pointwise", False)
    return optimize_model(original, target=target, precision=precision, kernel_query=kernel_query,
                          policy=replace(policy, exclude=frozenset(exclude), measure_budget_s=0.0,
                                         model_check=False, export_costs=None, **changes))


def _run_name(r: dict) -> str:
    """Batch and, where set, threads of a check's result: "batch 1" or "batch 1, 1 thread"."""
    threads = r.get("threads")
    return f"batch {r['batch']}" + (f", {threads} thread{'s' if threads > 1 else ''}" if threads else "")


def _speedup_note(what: str, r: dict) -> str:
    return (f"whole-model check, {what}, {_run_name(r)}: {r['speedup']:.3f}x "
            f"(interquartile {r['speedup_q1']:.3f}-{r['speedup_q3']:.3f}x)")


def _reread(r: dict, floor: float, target: str) -> bool:
    """Whether a reading on the extra thread count failed by less than MODEL_CHECK_REREAD: then it is read
    again and judged with the second reading, on both readings' rounds."""
    fails = r["slower"] or r["speedup"] < floor
    return bool(fails and "ratios" in r and MODEL_CHECK_REREAD[target]
                and r["speedup"] >= floor - MODEL_CHECK_REREAD[target])


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _near_misses(report: Report, limit: float | None = NEAR_MISS) -> set[str]:
    """Measured candidates left out that were at most `limit` slower than the runtime's nodes alone (any,
    where `limit` is None)."""
    return {d.node for d in report.decisions if not d.fused and d.source.startswith("measured")
            and d.ours_us and len(d.ours_us) == len(d.runtime_us)
            and (limit is None or all(o <= limit * r for o, r in zip(d.ours_us, d.runtime_us)))}


def _candidate(name: str, names: set[str]) -> str:
    """A Gemm's or a pool's decision is named after the node where it stays unfused and after the conv it
    becomes where it fuses (fc_as_conv, pool_as_conv): the name of the node for both."""
    for suffix in ("_conv", "_depthwise"):
        if name.endswith(suffix) and name[: -len(suffix)] in names:
            return name[: -len(suffix)]
    return name


def _with_more_fused(check, original_model, optimized, target: str, precision: str, policy: FusionPolicy,
                     report: Report, runs: list[tuple[int, int | None, bool]], kernel_query=None):
    """The checked model, or the same with more candidates fused where that model runs faster than it
    at every batch size (both against each other, interleaved): first the near misses, then every
    measured candidate left, each against the model kept so far. Each candidate was timed alone, and
    in the model the Transposes it saves, the caches its neighbours share and the activation passes it
    spares weigh otherwise (on a 2-core CPU whole models fused everywhere beat the per-candidate
    decisions by 5-10%)."""
    not_kept: list[set[str]] = []
    for limit, them in ((NEAR_MISS, "the near misses"), (None, "every candidate")):
        misses = _near_misses(report, limit)
        if not misses or misses in not_kept:  # nothing left, or a variant already run and not kept
            continue
        n = len(misses)
        what = (f"with {n} near miss{'es' if n > 1 else ''} fused" if limit is not None
                else f"with every candidate fused ({n} more)")
        kept = _with_fused(check, original_model, optimized, target, precision, policy, report, runs,
                           kernel_query, misses, what, them)
        if kept is None:
            not_kept.append(misses)
        else:
            optimized = kept
    return optimized


def _with_fused(check, original_model, optimized, target: str, precision: str, policy: FusionPolicy,
                report: Report, runs: list[tuple[int, int | None, bool]], kernel_query, misses: set[str], what: str,
                them: str):
    """The model with `misses` fused too where it runs faster than the checked one at every batch size,
    else None (the notes say which and why)."""
    names = {d.node for d in report.decisions}
    wanted = {d.node for d in report.decisions if d.fused} | misses
    # beside a file under check the variant is a file too: the sessions read both, no copy is held here
    variant_path = f"{optimized}.near-misses.onnx" if isinstance(optimized, str) else None
    gains, keep = [], False
    try:
        variant, variant_report = _reoptimized(original_model(), target, precision, policy, kernel_query,
                                               names - wanted, mode="always")
        fused = {_candidate(d.node, names) for d in variant_report.decisions if d.fused}
        if fused != {_candidate(n, names) for n in wanted}:  # a kernel missing, an overlap: not this variant
            report.notes.append(f"whole-model check: the model {what} not tried (it would fuse "
                                f"{len(fused)} candidates, not the {len(wanted)} wanted)")
            return None
        if variant_path is not None:
            save_model(variant, variant_path)
            variant = variant_path
            gc.collect()
        for batch, threads, primary in runs:
            r = check(optimized, variant, backend=target, batch=batch, precision="fp32", rounds=MODEL_CHECK_ROUNDS,
                      threads=threads)
            report.notes.append(_speedup_note(f"the model {what} against it", r))
            if not primary and _reread(r, MODEL_CHECK_FLOOR[target], target):  # as the check's own readings
                again = check(optimized, variant, backend=target, batch=batch, precision="fp32",
                              rounds=MODEL_CHECK_ROUNDS, threads=threads)
                report.notes.append(_speedup_note(f"the model {what} against it, again", again))
                r = pooled(r, again)
                report.notes.append(_speedup_note(f"the model {what} against it, both readings", r))
            gains.append(r["speedup"])
            # it must gain on the thread count decided for, and not lose on the extra one
            if (r["speedup_q1"] < 1.0 or r["speedup"] < MODEL_CHECK_GAIN) if primary else (
                    r["slower"] or r["speedup"] < MODEL_CHECK_FLOOR[target]):
                return None
        keep = True
    except Exception as e:  # noqa: BLE001 (a session refused, a variant failed: the checked model stands)
        report.notes.append(f"whole-model check of the model {what} not run: {_first_line(e)}")
        return None
    finally:
        if variant_path is not None and os.path.exists(variant_path):
            if keep:  # the file under check becomes the variant
                os.replace(variant_path, optimized)
            else:
                os.unlink(variant_path)
    for d in report.decisions:
        if d.node in misses:
            d.fused = True
            d.reason = (f"{d.reason}; fused: the model with {them} ran "
                        f"{', '.join(f'{g:.3f}x' for g in gains)} the one without "
                        f"({'; '.join(_run_name({'batch': b, 'threads': t}) for b, t, _ in runs)})")
    _describe_with(report, variant_report, keep=("decisions", "costs"))
    report.notes.append(f"kept the model {what}")
    return optimized if variant_path is not None else variant


def _every_candidate_variant(check, original_model, optimized, target: str, precision: str, policy: FusionPolicy,
                             report: Report, kernel_query, fused: set[str], verdict: str, slower_at):
    """Where the measured choice and its smaller halves lost: the model with every measured candidate
    fused, kept where it beats the original by MODEL_CHECK_GAIN (else None). The candidates were timed
    alone, ORT's own nodes without the layout reorders its NCHWc convs need around a squeeze-excite
    block or any op without an NCHWc kernel; a model fused throughout has none of those (EfficientNet-B0,
    2-core Zen 4: the local choice of 18 fusions 0.97x, all 81 1.07x). Being the variant the candidates'
    times speak against, it must pass the check twice, with three rounds in four faster each time."""
    everything = fused | _near_misses(report, None)
    if len(everything) <= len(fused):
        return None
    names = {d.node for d in report.decisions}
    what = f"the model with every candidate fused ({len(everything)})"
    try:
        variant, variant_report = _reoptimized(original_model(), target, precision, policy, kernel_query,
                                               names - everything, mode="always")
    except Exception as e:  # noqa: BLE001 (a variant that fails to build: the fallback goes on without it)
        report.notes.append(f"whole-model check of {what} not run: {_first_line(e)}")
        return None
    if {_candidate(d.node, names) for d in variant_report.decisions if d.fused} != \
            {_candidate(n, names) for n in everything}:
        report.notes.append(f"whole-model check: {what} not tried (a kernel missing, an overlap)")
        return None
    if isinstance(optimized, str):  # the file under check becomes the variant, read by path again
        save_model(variant, optimized)
        variant = optimized
    # the variant most at odds with the candidates' own times: read twice, three rounds in four faster each time
    if slower_at(variant, what, floor=MODEL_CHECK_GAIN, strict=True) != "":
        return None
    for d in report.decisions:
        if d.node in everything and not d.fused:
            d.fused, d.reason = True, f"{d.reason}; fused: {what} ran faster than the original"
    _describe_with(report, variant_report, keep=("decisions", "costs"))
    report.notes.append(f"{verdict}: kept {what}")
    return variant


def original_is_the_baseline(target: str, precision: str) -> bool:
    """Whether the model as the runtime would run it without epifuse is the original itself: in fp32, and
    in bf16 on the CPU EP, where the precision pass makes nothing but the FusedConvs (and the data moved
    between them) bfloat16. Elsewhere it is the original converted to `precision`."""
    return precision == "fp32" or (target == "ort-cpu" and precision == "bf16")


def _unfused_or_original(unfused, slower_at, original_model, target: str, precision: str, report: Report):
    """`unfused` (nothing fused, the other rewrites made), or the original itself where `unfused` runs
    slower than it: those rewrites are each meant to be faster, but ONNX Runtime has its own ways
    (DenseNet-121's unfolded BatchNorms as Mul + Add read 0.87x on a CPU). Only where the original is
    the baseline: elsewhere the check's reference is `unfused` itself."""
    if not original_is_the_baseline(target, precision):
        return unfused
    verdict = slower_at(unfused, "the model with nothing fused")
    if not verdict:  # not slower, or the check could not run
        return unfused
    report.notes.append(f"{verdict}: the original kept as it is")
    plain = Report(target=report.target, precision=report.precision, nodes_before=report.nodes_before,
                   nodes_after=report.nodes_before, ops_before=report.ops_before, ops_after=dict(report.ops_before))
    _describe_with(report, plain, keep=("decisions", "costs"))
    report.original_kept = True
    return original_model()


def _whole_model_check(check, original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, target: str,
                       precision: str, policy: FusionPolicy | None, report: Report, progress=None,
                       kernel_query=None) -> onnx.ModelProto | str:
    """The whole-model check: the fusions judged on the model without pairs of a 1x1 and a depthwise conv
    (_fusions_check), then, where it kept that model, the pairs on top of it (_pairs_check). Judged together,
    pairs that cost a little on one thread had every fusion dropped with them (a small EfficientNet: 0.985x
    with its pairs on one thread, 1.5x with its fusions alone on two)."""
    policy = policy or FusionPolicy()
    if not _pair_counts(optimized):
        return _fusions_check(check, original, optimized, target, precision, policy, report, progress, kernel_query)
    paired_report = Report()
    _describe_with(paired_report, report)
    plain, plain_report = _reoptimized(load_model(original) if isinstance(original, str) else original, target,
                                       precision, policy, kernel_query, set(policy.exclude))
    _describe_with(report, plain_report, keep=("decisions", "costs"))
    kept = _fusions_check(check, original, plain, target, precision, policy, report, progress, kernel_query)
    if kept is not plain:  # fewer fusions, or none: no pairs on top
        return kept
    _describe_with(report, paired_report, keep=("decisions", "costs"))
    return _pairs_check(check, original, optimized, target, precision, policy, report, kernel_query,
                        without=(plain, plain_report))


def _pair_counts(model: onnx.ModelProto | str) -> dict[str, int]:
    """How many pairs of each kind (PAIR_OP_TYPES) `model` has, the kinds it has none of left out."""
    model = load_model(model) if isinstance(model, str) else model
    counts = {op: sum(n.op_type == op and n.domain == DOMAIN for n in model.graph.node) for op in PAIR_OP_TYPES}
    return {op: n for op, n in counts.items() if n}


def _pairs_wanted(policy: FusionPolicy | None) -> bool:
    """Whether the pointwise-depthwise pairs are made: where every fusion is (`--fuse always`), or where the
    whole-model check will time them (measured here, no test timer), which keeps them only where not slower."""
    policy = policy or FusionPolicy()
    if not (policy.pointwise_depthwise or policy.depthwise_pointwise):
        return False
    mode = policy.resolved_mode()
    return mode == "always" or (mode == "auto" and policy.costs_file is None and policy.timer is None
                                and policy.model_check is not False)


def _pairs_check(check, original: onnx.ModelProto | str, kept: onnx.ModelProto | str, target: str,
                 precision: str, policy: FusionPolicy, report: Report, kernel_query=None,
                 without: tuple[onnx.ModelProto, Report] | None = None) -> onnx.ModelProto | str:
    """`kept` where it has no pair of a 1x1 and a depthwise conv (epifuse::FusedPointwiseDepthwise(Mean),
    FusedDepthwisePointwise), or runs at least as fast as with each pair as its two FusedConvs at every batch
    size and thread count the check runs (MobileNetV2 on Zen 5: 1.06x on two threads, 0.98-0.99x on one;
    bench/cpu_pairs.py); else, where it has both kinds, the model with only its expand-first pairs, judged the
    same way (a depthwise-first pair changes the threads' share of the rows the next layers read); else the
    model optimized again without pairs (`without`, where the caller made it), nothing else changed. A model
    with pairs is the one every fusion was decided for (the check's variants have none), so that is what the
    variants are made from."""
    counts = _pair_counts(kept)
    if not counts:
        return kept
    original_model = load_model(original) if isinstance(original, str) else original
    variant, variant_report = without or _reoptimized(original_model, target, precision, policy, kernel_query,
                                                      set(policy.exclude))
    candidates = [(kept, None, sum(counts.values()))]
    expand_first = sum(v for op, v in counts.items() if op != DEPTHWISE_FIRST_PAIR)
    if expand_first and counts.get(DEPTHWISE_FIRST_PAIR):
        candidates.append((*_reoptimized(original_model, target, precision, policy, kernel_query, set(policy.exclude),
                                         pointwise_depthwise=True), expand_first))
    for model, model_report, pairs in candidates:
        what = f"the {pairs} pair{'s' if pairs > 1 else ''} of a 1x1 and a depthwise conv"
        if model_report is not None:
            what += " with the 1x1 conv first"
        if _pairs_not_slower(check, variant, model, what, target, policy, original_model, report):
            if model_report is not None:
                _describe_with(report, model_report)
            return model
    report.notes.append("kept as two FusedConvs each")
    _describe_with(report, variant_report)
    return variant


def _pairs_not_slower(check, without: onnx.ModelProto, model: onnx.ModelProto | str, what: str, target: str,
                      policy: FusionPolicy, original: onnx.ModelProto, report: Report) -> bool:
    """Whether `model` runs at least as fast as `without` (its pairs as two FusedConvs each) at every batch size
    and thread count the check runs; `report` notes each reading, and why not."""
    try:
        for batch in _batches_to_check(original, policy.batches):
            for threads in _threads_to_check(target, policy.threads):
                r = check(without, model, backend=target, batch=batch, precision="fp32", rounds=MODEL_CHECK_ROUNDS,
                          threads=threads)
                report.notes.append(_speedup_note(f"{what} against their two FusedConvs", r))
                if r["slower"] or r["speedup"] < 1.0:
                    report.notes.append(f"{what} ran {r['speedup']:.3f}x their FusedConvs' speed at {_run_name(r)}")
                    return False
    except Exception as e:  # noqa: BLE001 (ONNX Runtime refusing a session: the model without them, as decided)
        report.notes.append(f"{what} not checked ({_first_line(e)})")
        return False
    return True


def _fusions_check(check, original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, target: str,
                   precision: str, policy: FusionPolicy | None, report: Report, progress=None,
                   kernel_query=None) -> onnx.ModelProto | str:
    """The whole-model check of the fusions: the model to keep. Each candidate was timed alone; together
    they can still lose (Transposes the region estimate missed, layers that share the caches), so where the
    times were measured on this machine the optimized model also runs against the original, interleaved,
    at each batch size decided for. Where it is slower at one of them, the fusions on the largest tensors go
    first (where layout and memory traffic, which a candidate's own time does not see, weigh most):
    the model with only the half, then the quarter, of the fused candidates with the least data is
    optimized again from the measurements already made (nothing else fuses, nothing new is measured),
    and the first not slower at any batch size is kept; else nothing fuses (as TensorRT keeps the
    faster of the engines built with and without a plugin). `report` says what was run and why.
    `original` and `optimized` are models or paths (ONNX Runtime then reads the files); the result is
    `optimized` itself or another model."""
    policy = policy or FusionPolicy()
    if progress is not None:
        progress("whole-model check")
    start = time.perf_counter()
    try:
        def original_model() -> onnx.ModelProto:
            """The original as a model, read from its file each time where it is a path (for the precision
            conversion, a variant, the fallback), so no copy stays while sessions hold both models."""
            return load_model(original) if isinstance(original, str) else original

        reference = original if original_is_the_baseline(target, precision) else \
            unfused_model(original_model(), target, precision)
        graph_of = load_model_split(original)[0] if isinstance(original, str) else original
        # (batch, threads, whether the model must gain there or only not lose: the extra thread count)
        runs = [(batch, threads, threads == policy.threads) for batch in _batches_to_check(graph_of, policy.batches)
                for threads in _threads_to_check(target, policy.threads)]

        def slower_at(model: onnx.ModelProto | str, what: str, floor: float = MODEL_CHECK_FLOOR[target],
                      strict: bool = False) -> str | None:
            """Why `model` is slower than the original ("" where it is not), None where it cannot run.
            `floor` and `strict` (two readings at each batch size, each with three rounds in four faster)
            hold on the thread count decided for; on the extra one the model need only not be slower."""
            try:
                for batch, threads, primary in runs:
                    run_floor, run_strict = (floor, strict) if primary else (MODEL_CHECK_FLOOR[target], False)
                    first = None  # a first reading that failed near the floor, to be judged with the second
                    for attempt in range(2):
                        # the reference is already in `precision`: compared as it is
                        r = check(reference, model, backend=target, batch=batch, precision="fp32",
                                  rounds=MODEL_CHECK_ROUNDS, threads=threads)
                        report.notes.append(_speedup_note(what if attempt == 0 else f"{what}, again", r))
                        if first is not None:
                            r = pooled(first, r)
                            report.notes.append(_speedup_note(f"{what}, both readings", r))
                        fails = r["slower"] or r["speedup"] < run_floor or (run_strict and r["speedup_q1"] < 1.0)
                        if attempt == 0 and not primary and _reread(r, run_floor, target):
                            first = r
                            continue
                        if fails:
                            return f"{what} ran {r['speedup']:.3f}x the original's speed at {_run_name(r)}"
                        if first is not None or (not run_strict
                                                 and r["speedup"] >= run_floor + MODEL_CHECK_CONFIRM[target]):
                            break
                return ""
            except Exception as e:  # noqa: BLE001 (ONNX Runtime refusing a session: the measured decisions stand)
                report.notes.append(f"whole-model check not run: {_first_line(e)}")
                return None

        # largest data first, and first of all those fused unmeasured (static policy): the first dropped
        fused = sorted((d for d in report.decisions if d.fused), key=lambda d: -(d.elements or float("inf")))
        # nothing fused: nothing to check against the original, the variants still run against this model
        verdict = slower_at(optimized, f"the model with all {len(fused)} fusions") if fused else ""
        if verdict is None:  # the check could not run: the measured decisions stand
            return optimized
        if verdict == "":
            kept = _with_more_fused(check, original_model, optimized, target, precision, policy, report,
                                    runs, kernel_query)
            if fused or any(d.fused for d in report.decisions):
                return kept
            return _unfused_or_original(kept, slower_at, original_model, target, precision, report)
        tried = {len(fused)}
        for share in (2, 4):
            keep = len(fused) // share
            if keep == 0 or keep in tried:
                continue
            tried.add(keep)
            kept_names = {d.node for d in fused[len(fused) - keep:]}
            variant, variant_report = _reoptimized(original_model(), target, precision, policy, kernel_query,
                                                   {d.node for d in report.decisions} - kept_names)
            variant_fused = {d.node for d in variant_report.decisions if d.fused}
            if not variant_fused or not variant_fused <= kept_names:
                continue  # never a fusion the full model did not have
            if isinstance(optimized, str):  # the file under check becomes the variant, read by path again
                save_model(variant, optimized)
                variant = optimized
            some = f"{len(variant_fused)} fusion{'s' if len(variant_fused) > 1 else ''} on the smallest tensors"
            # a variant is kept only where faster than nothing fused by the median, by the gain a near-miss
            # variant must show: a few small fusions in a model that lost are worth little, and on a noisy
            # machine a median of 1.0 passes half the time
            if slower_at(variant, f"the model with the {some}", floor=MODEL_CHECK_GAIN) == "":
                report.notes.append(f"{verdict}: kept the {some}")
                _describe_with(report, variant_report)
                return variant
        everything = _every_candidate_variant(check, original_model, optimized, target, precision, policy,
                                              report, kernel_query, {d.node for d in fused}, verdict, slower_at)
        if everything is not None:
            return everything
        for d in report.decisions:
            if d.fused:
                d.fused, d.reason = False, f"{d.reason}; dropped: {verdict}"
        report.notes.append(f"{verdict}: every fusion dropped (BatchNorms still folded)")
        return _unfused_or_original(unfused_model(original_model(), target, precision, report), slower_at,
                                    original_model, target, precision, report)
    finally:
        # timing on the target, like the candidates' measurements: counted as measuring, not as a pass
        report.pass_seconds["measure"] = report.pass_seconds.get("measure", 0.0) + time.perf_counter() - start


def optimize_graph(graph: gs.Graph, template: onnx.ModelProto, *, target: str, precision: str, report: Report,
                   kernel_query=None, progress=None, stop_after: str | None = None,
                   free_memory: bool = False, policy: FusionPolicy | None = None,
                   input_structure: onnx.ModelProto | None = None) -> tuple[SplitModel, Report]:
    """The passes on an imported graph; `template` is the original model's skeleton (no initializers),
    `input_structure` its structure with small constants and weights as typed inputs (`skeleton`'s
    default), what cleanup's strict check compares against. With `free_memory`, replaced weights are
    collected after every pass (large models)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
    if kernel_query is None:
        kernel_query = _registry_query
    report.target, report.precision = target, precision
    report.nodes_before = len(template.graph.node)
    report.ops_before = _op_counts(template)
    defaults = _overridable_initializers(graph, template)
    with _timed(report, "canonicalize", progress, free_memory):
        graph = split_conv_means(split_pointwise_depthwise(graph, report), report)
        graph = canonicalize(split_conv_scales(graph, report), report)
    with _timed(report, "shape_constants", progress, free_memory):
        graph = shape_constants(graph, report)
    with _timed(report, "concat_of_slices", progress, free_memory):  # on the Slice bounds shape_constants made
        graph = concat_of_slices(graph, report)
    with _timed(report, "pad_into_conv", progress, free_memory):  # on the Pads shape_constants made constant
        graph = pad_into_conv(graph, report, target)
    decider = make_decider(policy or FusionPolicy(), target, precision, report)
    if decider.allow_tf32:
        report.notes.append("fp32 FusedConvs may compute in TF32 on the tensor cores (allow_tf32), as ORT's own "
                            "convs do by default; --precision fp32-strict keeps fp32 accuracy")
    if progress is not None and isinstance(decider.costs, MeasuredCosts):
        decider.costs.progress = progress  # minutes of measuring on a GPU: say which candidate is timed
    reader, own_reader = _reorder_reader(decider, target)
    if reader is not None:
        with _timed(report, "runtime_layout", progress, free_memory, decider.costs):
            try:
                decider.reordered = _runtime_reorders(graph, template, reader, report,
                                                      (policy or FusionPolicy()).runtime_reorders)
            finally:
                if own_reader:
                    reader.close()
    with _timed(report, "fc_as_conv", progress, free_memory, decider.costs):  # before fusion: its convs fuse
        graph = fc_as_conv(graph, report, target, decider, kernel_query)
    with _timed(report, "matmul_as_conv", progress, free_memory, decider.costs):  # before fold_affine: a scale folds
        graph = matmul_as_conv(graph, report, target, decider, kernel_query)
    with _timed(report, "fold_batchnorm", progress, free_memory):
        graph = fold_batchnorm(graph, report)
    with _timed(report, "fold_affine", progress, free_memory):
        graph = fold_affine(graph, report)
    with _timed(report, "activation_ops", progress, free_memory):
        graph = activation_ops(graph, report, target)
    try:
        with _timed(report, "fuse_conv", progress, free_memory, decider.costs):
            graph = fuse_conv(graph, report, target, kernel_query, decider)
        # after fusion, when it is known which pools read an NHWC region; then its convs fuse
        with _timed(report, "pool_as_conv", progress, free_memory, decider.costs):
            before = {n.name for n in graph.nodes if n.op == "Conv"}
            graph = pool_as_conv(graph, report, target, decider, kernel_query)
            pooled = {n.name for n in graph.nodes if n.op == "Conv"} - before
            if pooled:
                graph = fuse_conv(graph, report, target, kernel_query, decider, only=pooled)
    finally:
        if isinstance(decider.costs, MeasuredCosts):
            decider.costs.close()
    if isinstance(decider.costs, MeasuredCosts):
        decider.costs.save_cache()
        if policy and policy.export_costs:
            report.notes.append(f"{decider.costs.export(policy.export_costs)} measurements written to "
                                f"{policy.export_costs}")
    if stop_after != "fuse":
        with _timed(report, "layout", progress, free_memory):
            # a mean over H and W to [N, C] ends a region where channel_mean makes it the library's op
            graph = layout(graph, report, spatial_means=target == "ort-cpu" and precision in ("fp32", "bf16"))
        with _timed(report, "affine_to_batchnorm", progress, free_memory):  # the pairs layout left in NCHW
            graph = affine_to_batchnorm(graph, report, precision)
        with _timed(report, "nhwc_pools", progress, free_memory):  # on the NHWC pools layout leaves
            graph = nhwc_pools(graph, report, target, precision)
        with _timed(report, "nearest_upsample", progress, free_memory):  # on the NHWC Resizes layout leaves
            graph = nearest_upsample(graph, report, target)
        with _timed(report, "scaled_residual", progress, free_memory):
            graph = scaled_residual(graph, report, target)
        # the library's CPU ops before precision, which makes them bf16 where their kernels have it
        with _timed(report, "channel_scale", progress, free_memory):
            graph = channel_scale(graph, report, target, precision)
        with _timed(report, "channel_mean", progress, free_memory):
            graph = channel_mean(graph, report, target, precision)
        with _timed(report, "layer_norm", progress, free_memory):
            graph = layer_norm(graph, report, target, precision)
        with _timed(report, "channel_copy", progress, free_memory):
            graph = channel_copy(graph, report, target, precision)
        with _timed(report, "precision", progress, free_memory):  # after layout: Casts only where regions end
            graph = convert_precision(graph, report, precision, target)
        with _timed(report, "input_layout", progress, free_memory):  # after precision: moves 16-bit data
            graph = input_layout(graph, report, target)
        # last: on the nodes as every pass left them
        with _timed(report, "conv_scale", progress, free_memory):
            graph = conv_scale(graph, report, target, precision)
        with _timed(report, "conv_mean", progress, free_memory):
            graph = conv_mean(graph, report, target, precision)
        if _pairs_wanted(policy):
            with _timed(report, "pointwise_depthwise", progress, free_memory):
                graph = pointwise_depthwise(graph, report, target, precision,
                                            expand_first=policy.pointwise_depthwise,
                                            depthwise_first=policy.depthwise_pointwise)
    with _timed(report, "cleanup", progress, free_memory):
        out = cleanup(graph, report, template, defaults, input_structure)
    report.nodes_after = len(out.structure.graph.node)
    report.ops_after = _op_counts(out.structure)
    return out, report


def _reorder_reader(decider: Decider, target: str) -> tuple[object | None, bool]:
    """What reads the runtime's layout reorders of a model for `decider`, and whether it is the caller's
    to close: the decider's timer where that reads them, or for ort-cpu times from a costs file, ONNX
    Runtime's CPU EP here (the target's own runtime)."""
    if decider.mode != "auto":
        return None, False
    timer = getattr(decider.costs, "timer", None)
    if hasattr(timer, "reordered_tensors"):
        return timer, False
    if target == "ort-cpu" and isinstance(decider.costs, FileCosts):
        from .measure import OrtCpuTimer  # noqa: PLC0415 (onnxruntime loads on first use)

        return OrtCpuTimer(), True
    return None, False


def _runtime_reorders(graph: gs.Graph, template: onnx.ModelProto, timer, report: Report,
                      read: dict) -> tuple[set, set]:
    """The tensors the runtime reorders into and out of its blocked layout in the model as the passes
    have it before fusion (Decider.with_reorders); none where the model is too large to hand to a second
    session or the runtime refuses it (the report says so). `read`: those already read, by the model's
    hash (a session on the whole model each time otherwise)."""
    weights = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize  # from the shapes: nothing loaded
                  for t in graph.tensors().values() if isinstance(t, gs.Constant))
    if weights > MODEL_CHECK_MAX_BYTES:
        report.notes.append(f"the runtime's layout reorders not read: {weights / 2**30:.1f} GiB of weights")
        return set(), set()
    try:
        model = gs.export_onnx(graph, do_type_check=False)
        model.ir_version = template.ir_version
        data = model.SerializeToString()
        key = hashlib.sha256(data).hexdigest()
        if key not in read:
            read[key] = timer.reordered_tensors(data)
        return read[key]
    except Exception as e:  # noqa: BLE001 (the decisions then leave the reorders out, as before)
        report.notes.append(f"the runtime's layout reorders not read: {_first_line(e)}")
        return set(), set()


def _overridable_initializers(graph: gs.Graph, template: onnx.ModelProto) -> dict:
    """From IR 4 on, an initializer also listed as a graph input is a default the caller may override
    (ONNX Runtime lets a feed replace it): it stays an input of the model, and no pass treats it as a
    constant (nothing is folded into it). Returns the defaults, written back as initializers."""
    if template.ir_version < 4:
        return {}
    tensors = graph.tensors()
    defaults = {}
    for vi in template.graph.input:
        t = tensors.get(vi.name)
        if isinstance(t, gs.Constant):
            defaults[vi.name] = t.values
            t.to_variable(dtype=t.values.dtype, shape=list(t.values.shape))
            t.type = "tensor_type"  # to_variable leaves it unset in onnx-graphsurgeon 0.5-0.6
    if defaults:
        graph.inputs = [tensors[vi.name] for vi in template.graph.input if vi.name in tensors]
    return defaults


def optimize_file(in_path: str, out_path: str, *, target: str = "ort-cpu", precision: str = "fp32",
                  progress=None, kernel_query=None, policy: FusionPolicy | None = None) -> Report:
    """Optimizes the file `in_path` into `out_path` holding one copy of the weights at a time:
    the parsed protobuf until the graph has them as arrays, then the arrays, streamed to disk."""
    check_output_path(out_path, in_path)
    report = Report(model=in_path)
    policy = policy or FusionPolicy()  # one for the passes and the whole-model check's variants
    referenced: set[str] = set()
    with _timed(report, "load", progress):
        model, weights = load_model_split(in_path, referenced)
    check_output_path(out_path, in_path, referenced)
    with _timed(report, "import", progress):
        graph = gs.import_onnx(model)
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Constant):
                tensor.values = weights.pop(tensor.name) if tensor.name in weights else tensor.values
        template = skeleton(model, keep_small=False, weights_as_inputs=False)
        input_structure = skeleton(model)
        del model
    # a cycle collection after each pass keeps a large model's peak at about two copies of its weights;
    # for a small one it only costs time (a full collection scans every object the process holds)
    large = sum(t.values.nbytes for t in graph.tensors().values() if isinstance(t, gs.Constant)) >= LARGE_MODEL_BYTES
    optimized, report = optimize_graph(graph, template, target=target, precision=precision, report=report,
                                       progress=progress, kernel_query=kernel_query, free_memory=large,
                                       policy=policy, input_structure=input_structure)
    del graph
    check = _model_checker(report, target, policy, weight_bytes=sum(v.nbytes for v in optimized.weights.values()))
    if check is None:
        with _timed(report, "save", progress):
            save_model(optimized, out_path, in_path, referenced)
        return report
    # Checked under a hidden name beside the output, which it replaces only once checked: an interrupted
    # or killed check leaves the previous output (if any) as it was. A checked model is under 1 GiB, so
    # it never has an external-data file that a rename would orphan.
    checking = os.path.join(os.path.dirname(os.path.abspath(out_path)),
                            f".{os.path.basename(out_path)}.{os.getpid()}.checking.onnx")
    try:
        with _timed(report, "save", progress):
            save_model(optimized, checking, in_path, referenced)
        del optimized  # the check's sessions read both files: no copy of the weights here meanwhile
        gc.collect()
        checked = _whole_model_check(check, in_path, checking, target, precision, policy, report, progress,
                                     kernel_query)
        if checked is not checking:
            with _timed(report, "save", progress):
                save_model(checked, checking, in_path, referenced)
        os.replace(checking, out_path)
    finally:
        if os.path.exists(checking):
            os.unlink(checking)
    return report


__all__ = ["optimize_model", "optimize_file", "validate", "FusionPolicy", "TARGETS", "PRECISIONS"]
