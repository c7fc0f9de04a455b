"""Should a candidate fuse? A cost decision on top of the registry's "can run".

A candidate fuses only where the FusedConv is faster on the target than what the runtime runs for
the same original nodes, at every batch size asked for. Times come from `optimizer.costs`; where
none are known, the static policy below decides, and it only fuses what measurements elsewhere have
shown to win. Then, per region, the layout cost is weighed: a fused conv reads and writes NHWC, so a
local choice can add Transposes where a region meets NCHW ops. `choose_regions` compares the local
choices with fusing every measured candidate and with fusing none, then toggles single candidates
while the estimated total (group times plus the Transposes the layout pass would leave) goes down.

Modes: "auto" (times where known, else the static policy), "static" (the static policy only) and
"always" (wherever a kernel exists: the optimizer's behaviour before costs, for experiments).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from .costs import Costs, FusionGroup, Timing
from .graph import constant_value, producer, shape_of
from .passes.layout import ELEMENTWISE, GLOBAL_POOLS, PARAM_INPUTS, REDUCTIONS

MODES = ("auto", "static", "always")
# A fused group counts its time as ours / FUSE_MARGIN: a candidate fuses only when measured at least
# 5% faster, so measurement noise alone never turns a tie into a slower model.
FUSE_MARGIN = 0.95
LAYOUT_TRANSPARENT = ELEMENTWISE | REDUCTIONS | set(GLOBAL_POOLS) | {"Concat", "Split", "Slice", "Pad", "Resize"}
DIRECT_KERNELS = {"cuda_direct"}  # CUDA cores only: cuDNN runs the same problems on tensor cores
# TensorRT's layer fusion catalog (docs.nvidia.com/deeplearning/tensorrt/latest/performance/fusion-catalog.html):
# "Convolution and ReLU/GELU/Clip Activation", "Convolution and ElementWise Operation" (a sum without
# broadcast: the residual Add) and PointWise fusion, which engine logs show absorbed into the conv as
# `Conv + PWN(PWN(Sigmoid), Mul)` (SiLU). Every FusedConv pattern is one of these.
TENSORRT_NATIVE = "static: TensorRT fuses conv + bias + activation + residual Add itself"


def static_verdict(target: str, dtype: str, kernels: list[str]) -> tuple[bool, str]:
    """The conservative policy for a candidate with no measured times."""
    if target == "ort-cpu":
        return False, "static: ORT's CPU convs (MLAS) beat the CPU kernel wherever measured"
    if target == "tensorrt":
        return False, TENSORRT_NATIVE
    if dtype == "fp32":
        return False, "static: ORT's CUDA EP runs fp32 convs as TF32, the fp32 kernels do not"
    if kernels and all(k in DIRECT_KERNELS for k in kernels):
        return False, "static: only the CUDA-core direct kernel runs it; cuDNN has tensor-core kernels"
    return True, f"static: {kernels[0] if kernels else 'a kernel'} (tensor-core, depthwise or GEMV)"


@dataclass
class Verdict:
    fuse: bool
    reason: str
    timings: list[Timing | None] = field(default_factory=list)  # one per batch size
    fixed: bool = False     # not weighed per region: unmeasured, or approved by an earlier pass

    def measured(self) -> bool:
        return bool(self.timings) and all(t is not None for t in self.timings)


class Decider:
    """Local verdicts for the fuse pass (`verdict`) and the per-region adjustment (`choose_regions`)."""

    def __init__(self, target: str, precision: str, mode: str = "auto", costs: Costs | None = None,
                 batches: tuple[int, ...] = (1,), kernel_names=None):
        if mode not in MODES:
            raise ValueError(f"unknown fusion mode {mode!r} (one of {', '.join(MODES)})")
        self.target, self.precision, self.mode = target, precision, mode
        self.costs = costs or Costs()
        self.batches = tuple(batches) or (1,)
        self.kernel_names = kernel_names
        self.approved: set[str] = set()  # conv names an earlier pass rewrote on a positive verdict

    def verdict(self, groups: list[FusionGroup | None], desc_dtype: str, kernels=None, name: str = "") -> Verdict:
        """`groups`: the candidate at each batch size (None where its shapes are not all known);
        `kernels()`: the registry's kernels for it, best first (asked only by the static policy)."""
        if self.mode == "always" or name in self.approved:
            return Verdict(True, "fused wherever a kernel exists (fuse=always)" if self.mode == "always"
                           else "approved when it was rewritten", fixed=True)
        timings = [self.costs.group_timing(g) if g is not None and self.mode == "auto" else None for g in groups]
        if self.mode == "auto" and timings and all(t is not None for t in timings):
            faster = all(t.ours_us < FUSE_MARGIN * t.runtime_us for t in timings)
            return Verdict(faster, "faster" if faster else "slower", timings)
        fuse, why = static_verdict(self.target, desc_dtype, kernels() if kernels else [])
        if self.mode == "auto":
            unknown = next((g for g, t in zip(groups, timings) if g is not None and t is None), None)
            why += f" ({self.costs.why_unknown(unknown) if unknown is not None else 'shapes not known'})"
        return Verdict(fuse, why, timings, fixed=True)

    def choose_regions(self, graph: gs.Graph, plans: list) -> None:
        """Adjusts the verdicts of `plans` (objects with `.nodes`, `.inputs`, `.output`, `.verdict`) so the
        total estimated time, Transposes at region edges included, is least."""
        measured = [i for i, p in enumerate(plans) if not p.verdict.fixed and p.verdict.measured()]
        if not measured or self.mode != "auto":
            return
        batches = [t.batch for t in plans[measured[0]].verdict.timings]  # a static batch dim gives one
        variable = [i for i in measured if [t.batch for t in plans[i].verdict.timings] == batches]
        model = _RegionModel(graph, plans, variable, self.costs, batches, self.precision)
        local = {i for i, p in enumerate(plans) if p.verdict.fuse}
        fixed = local - set(variable)
        starts = [local, fixed | set(variable), fixed]
        best = min(starts, key=model.cost)
        best_cost = model.cost(best)
        for _ in range(4):
            improved = False
            for i in variable:
                trial = best ^ {i}
                c = model.cost(trial)
                if c < best_cost - 1e-9:
                    best, best_cost, improved = trial, c, True
            if not improved:
                break
        for i in variable:
            chosen = i in best
            if chosen != plans[i].verdict.fuse:
                saved = model.transposes(best ^ {i}) - model.transposes(best)
                plans[i].verdict.fuse = chosen
                plans[i].verdict.reason = (
                    f"{'slower' if chosen else 'faster'} alone; region: {saved:.1f} µs of Transposes saved "
                    f"by {'fusing' if chosen else 'not fusing'} it at batch {batches[0]}")


class _RegionModel:
    """The estimated time of a choice of fused candidates: their FusedConv times, the runtime's times for
    the others, and a Transpose for every tensor that crosses between the NHWC and NCHW parts. Only the
    `variable` candidates' times count; the others' nodes still count for the layout."""

    def __init__(self, graph: gs.Graph, plans: list, variable: list[int], costs: Costs, batches: list[int],
                 dtype: str):
        self.costs, self.batches, self.dtype = costs, batches, dtype
        self.node_lists = [p.nodes for p in plans]
        self.input_lists = [p.inputs for p in plans]
        self.order = list(graph.nodes)
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.transpose_cache: dict[tuple, float] = {}
        self.timed = [(i, plans[i]) for i in variable]
        # the time of each batch with nothing fused, to weigh batch sizes equally
        self.scale = [max(sum(p.verdict.timings[b].runtime_us for _, p in self.timed), 1e-9)
                      for b in range(len(batches))]

    def nhwc_nodes(self, fused: set[int]) -> set[int]:
        nodes = {id(n) for i in fused for n in self.node_lists[i]}
        for node in self.order:
            if id(node) in nodes or node.op not in LAYOUT_TRANSPARENT:
                continue
            params = PARAM_INPUTS.get(node.op, set())
            data = [t for j, t in enumerate(node.inputs) if j not in params and t.name and constant_value(t) is None]
            if data and all(producer(t) is not None and id(producer(t)) in nodes for t in data) and \
                    all(len(shape_of(t) or [0] * 4) == 4 for t in data):
                nodes.add(id(node))
        return nodes

    def crossing(self, fused: set[int]) -> list[gs.Tensor]:
        nhwc = self.nhwc_nodes(fused)
        tensors = {}
        for node in self.order:
            if id(node) not in nhwc:
                continue
            for t in node.outputs:
                if id(t) in self.graph_outputs or any(id(c) not in nhwc for c in t.outputs):
                    tensors[id(t)] = t
        for i in fused:
            for t in self.input_lists[i]:
                if producer(t) is None or id(producer(t)) not in nhwc:
                    tensors[id(t)] = t
        return list(tensors.values())

    def _transpose_us(self, t: gs.Tensor, batch: int) -> float:
        shape = shape_of(t)
        if not shape or len(shape) != 4:
            return 0.0
        shape = [batch if i == 0 and not isinstance(d, int) else d for i, d in enumerate(shape)]
        if not all(isinstance(d, int) and d > 0 for d in shape):
            return 0.0
        key = tuple(shape)
        if key not in self.transpose_cache:
            self.transpose_cache[key] = self.costs.transpose_us(shape, self.dtype) or 0.0
        return self.transpose_cache[key]

    def transposes(self, fused: set[int], batch_index: int = 0) -> float:
        return sum(self._transpose_us(t, self.batches[batch_index]) for t in self.crossing(fused))

    def cost(self, fused: set[int]) -> float:
        crossing = self.crossing(fused)
        total = 0.0
        for b, batch in enumerate(self.batches):
            groups = sum((p.verdict.timings[b].ours_us / FUSE_MARGIN if i in fused else p.verdict.timings[b].runtime_us)
                         for i, p in self.timed)
            total += (groups + sum(self._transpose_us(t, batch) for t in crossing)) / self.scale[b]
        return total
