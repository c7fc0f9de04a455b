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

from dataclasses import dataclass, field, replace

import numpy as np
import onnx_graphsurgeon as gs

from . import registry
from .contract import DTYPE_CODES, PRECISION_CODES, PRECISION_OF_CODE
from .costs import Costs, FusionGroup, Timing
from .graph import NCHW_TO_NHWC, NHWC_TO_NCHW, constant_value, is_transpose, producer, shape_of
from .passes.layout import HANDLERS, variable_data_inputs
from .passes.shape_constants import concrete_shapes
from .registry import ConvDesc

MODES = ("auto", "static", "always")
# A fused group counts its time as ours / FUSE_MARGIN: a candidate fuses only when measured at least
# 5% faster, so measurement noise alone never turns a tie into a slower model.
FUSE_MARGIN = 0.95
DIRECT_KERNELS = {"cuda_direct"}  # CUDA cores only: cuDNN runs the same problems on tensor cores
UNPROVEN_KERNELS = DIRECT_KERNELS | {"cuda_depthwise_scalar", "cuda_stem_ffma"}


def _unproven(kernel: str) -> bool:
    """Kernels not known to beat cuDNN without timing them: the direct kernel and the fp32 stem kernel
    (CUDA cores, where cuDNN may use TF32 tensor cores); the grouped tensor-core kernels, whose
    block-diagonal tiles compute mostly zeros with few channels per group (cuDNN has grouped kernels of
    its own); and the unaligned tile (C or K not a multiple of 8: element-wise loads and stores),
    which lost to cuDNN on each of ShuffleNetV2's 58- and 116-channel convs measured on an H200, by
    1.0-2.5x (docs/bench-models.md), as did the scalar depthwise kernel (one channel per load: C not
    even, or 58) on each of its 58-channel depthwise convs, by 1.07-2.4x."""
    return kernel in UNPROVEN_KERNELS or "_grouped_" in kernel or "_unaligned_" in kernel


def _stem_kernel(kernel: str) -> bool:
    """The few-channel stem kernels (C < 8: RGB inputs), where cuDNN's own kernels are slowest."""
    return kernel == "cuda_stem_mma" or kernel.startswith(("im2col_", "pad8_")) or "_fewch_" in kernel \
        or "_fixed8_" in kernel


# TensorRT's layer fusion catalog (docs.nvidia.com/deeplearning/tensorrt/latest/performance/fusion-catalog.html):
# "Convolution and ReLU/GELU/Clip Activation", "Convolution and ElementWise Operation" (a sum without
# broadcast: the residual Add) and PointWise fusion, which engine logs show absorbed into the conv as
# `Conv + PWN(PWN(Sigmoid), Mul)` (SiLU). Every FusedConv pattern is one of these.
TENSORRT_NATIVE = "static: TensorRT fuses conv + bias + activation + residual Add itself"


# A 1x1 conv on 1x1 maps (a classifier Gemm as a conv, a squeeze-excite conv) above this many
# multiply-adds (N*C*K): cuBLAS's GEMM beat the library's kernels there whenever measured on an H200
# (batch 16: 1024 -> 1000, GEMV 9.4 µs against 4.4; batch 32: 2048 -> 1000 and 1280 -> 1000, tensor-core
# tiles 7.7 and 5.9 against 4.6-5.9), while batch-1 classifiers (1-2M) and batch-16 squeeze-excite
# convs (under 2M) won.
CLASSIFIER_MAX_MACS = 1 << 22


def _large_classifier(desc: ConvDesc) -> int:
    """The multiply-adds of a 1x1 conv on 1x1 maps above CLASSIFIER_MAX_MACS, else 0."""
    if (desc.H, desc.W, desc.R, desc.S) != (1, 1, 1, 1) or min(desc.N, desc.C, desc.K) <= 0:
        return 0
    macs = desc.N * desc.C * desc.K
    return macs if macs > CLASSIFIER_MAX_MACS else 0


def static_verdict(target: str, dtype: str, kernels: list[str], descs: list[ConvDesc] = ()) -> tuple[bool, str]:
    """The conservative policy for a candidate with no measured times; `descs`: its problem at each batch
    size decided for, where its shapes are known."""
    if target == "ort-cpu":
        return False, "static: ORT's CPU convs (MLAS) beat oneDNN's on most layers measured; unmeasured, they stay ORT's"
    if target == "tensorrt":
        return False, TENSORRT_NATIVE
    if dtype == "fp32":
        return False, "static: fp32 convs untimed stay ORT's (cuDNN, in TF32 by default)"
    if kernels and all(_unproven(k) for k in kernels):
        return False, ("static: only the direct, grouped, unaligned or scalar depthwise kernels run it; untimed, "
                       "they are not known to beat cuDNN" if any(k not in DIRECT_KERNELS for k in kernels) else
                       "static: only the CUDA-core direct kernel runs it; cuDNN has tensor-core kernels")
    large = max((_large_classifier(d) for d in descs), default=0)
    if large:
        return False, (f"static: a 1x1 conv on 1x1 maps of {large} multiply-adds (a classifier at this batch size): "
                       "cuBLAS's GEMM beats the library's kernels there when measured")
    return True, f"static: {kernels[0] if kernels else 'a kernel'} (tensor-core, depthwise or GEMV)"


EXCLUDED = "left out by the whole-model check (its largest tensors first)"


def _elements(groups: list[FusionGroup | None]) -> int:
    g = next((g for g in groups if g is not None), None)
    if g is None:
        return 0
    shapes = [g.x_shape, g.y_shape] + ([g.z_shape] if g.z_shape is not None and g.z is not g.x else [])
    return int(sum(np.prod(s) for s in shapes))


@dataclass
class Verdict:
    fuse: bool
    reason: str
    timings: list[Timing | None] = field(default_factory=list)  # one per batch size
    fixed: bool = False     # not weighed per region: unmeasured, or approved by an earlier pass
    static: bool = False    # the static policy's (knows no times, so no Transposes either)
    kernel: str = ""        # a static verdict's kernel: the registry's first for the candidate
    elements: int = 0       # the group's data in and out, in elements, at the first batch size (0: unknown)

    def measured(self) -> bool:
        return bool(self.timings) and all(t is not None for t in self.timings)


class Decider:
    """Local verdicts for the fuse pass (`verdict`) and the per-region adjustment (`choose_regions`)."""

    def __init__(self, target: str, precision: str, mode: str = "auto", costs: Costs | None = None,
                 batches: tuple[int, ...] = (1,), excluded: frozenset[str] = frozenset(), allow_tf32: bool = False):
        if mode not in MODES:
            raise ValueError(f"unknown fusion mode {mode!r} (one of {', '.join(MODES)})")
        self.target, self.precision, self.mode = target, precision, mode
        self.costs = costs or Costs()
        self.batches = tuple(batches) or (1,)
        self.approved: dict[str, Verdict] = {}  # convs an earlier pass wrote on a positive verdict
        self.excluded = excluded  # candidates the whole-model check left out (by the report's node name)
        self.allow_tf32 = int(allow_tf32)  # the fused convs' allow_tf32 attribute (fp32 on a CUDA target)
        self._shapes: dict[int, dict[str, tuple[int, ...]]] = {}  # batch -> shapes inferred with it
        # the tensors the runtime moves into and out of its own blocked layout in the model as it is
        # (ORT's CPU EP: NCHWc reorders beside ops it runs in NCHW); see `with_reorders`
        self.reordered: tuple[set[str], set[str]] = (set(), set())

    def shape_at(self, graph: gs.Graph, t: gs.Tensor, batch: int) -> tuple[int, ...] | None:
        """`t`'s shape with a symbolic batch dimension set to `batch`, inferred over the whole graph
        (once per batch size) where the tensor's own shape has other unknown dims."""
        shape = shape_of(t)
        if shape is not None:
            shape = [batch if i == 0 and not (isinstance(d, int) and d > 0) else d for i, d in enumerate(shape)]
            if all(isinstance(d, int) and d > 0 for d in shape):
                return tuple(shape)
        if batch not in self._shapes:
            self._shapes[batch] = concrete_shapes(graph, batch)
        return self._shapes[batch].get(t.name)

    def groups(self, graph: gs.Graph, name: str, nodes: list[gs.Node], x: gs.Tensor, z: gs.Tensor | None,
               y: gs.Tensor, weight: np.ndarray, bias: np.ndarray, desc: ConvDesc,
               pattern: str | None = None) -> list[FusionGroup | None]:
        """The candidate at each batch size to decide for (a static batch dimension wins), None where a
        shape stays unknown: what measurements and costs files are keyed by. `pattern` defaults to the
        nodes' ops joined by '+'."""
        if self.mode == "always":
            return []
        first = shape_of(x)
        static = first and isinstance(first[0], int) and first[0] > 0
        groups = []
        for batch in ([first[0]] if static else self.batches):
            xs, ys = self.shape_at(graph, x, batch), self.shape_at(graph, y, batch)
            zs = self.shape_at(graph, z, batch) if z is not None else None
            if xs is None or ys is None or (z is not None and zs is None):
                groups.append(None)
                continue
            d = replace(desc, N=batch)
            if len(xs) == 4 and (d.H <= 0 or d.W <= 0):
                d = replace(d, H=xs[2], W=xs[3])
            groups.append(FusionGroup(name, pattern or "+".join(n.op for n in nodes), d, nodes, x, z, y, xs, zs, ys,
                                      weight, bias))
        return groups

    def dtype_code(self, weight_dtype) -> int:
        """The dtype a FusedConv will run in: the precision pass makes every FusedConv low precision."""
        if self.precision != "fp32" and np.dtype(weight_dtype) == np.float32:
            return PRECISION_CODES[self.precision]
        return DTYPE_CODES[np.dtype(weight_dtype).name]

    def approve(self, graph: gs.Graph, conv_name: str, nodes: list[gs.Node], x: gs.Tensor, y: gs.Tensor,
                weight: np.ndarray, bias: np.ndarray, desc: ConvDesc, kernel_query,
                pattern: str | None = None, unmeasured: str | None = None) -> Verdict:
        """For a pass that would rewrite `nodes` (a Gemm, a pool) as the conv `conv_name` only so that it
        fuses: the verdict on that fusion against the runtime running `nodes` as they are (or as
        `pattern` says they would run). A positive one is kept, and the fuse pass fuses that conv
        without asking again. `unmeasured`: the reason to refuse a fusion the static policy would
        approve unmeasured (fuse=always still fuses)."""
        if conv_name in self.excluded or (nodes and nodes[0].name in self.excluded):
            return Verdict(False, EXCLUDED, fixed=True)
        count, reason = kernel_query(self.target, {f: getattr(desc, f) for f in desc.__dataclass_fields__})
        if count == 0:
            return Verdict(False, f"no kernel: {reason}", fixed=True)
        groups = self.groups(graph, conv_name, nodes, x, None, y, weight, bias, desc, pattern)
        verdict = self.verdict(groups, PRECISION_OF_CODE[desc.dtype], lambda: registry.kernel_names(self.target, desc))
        if verdict.fuse and unmeasured and self.mode != "always" and not verdict.measured():
            return Verdict(False, unmeasured, fixed=True)
        if verdict.fuse:
            verdict.fixed = True
            self.approved[conv_name] = verdict
        return verdict

    def verdict(self, groups: list[FusionGroup | None], desc_dtype: str, kernels=None, name: str = "") -> Verdict:
        """`groups`: the candidate at each batch size (None where its shapes are not all known);
        `kernels()`: the registry's kernels for it, best first (asked only by the static policy)."""
        if name in self.approved:
            return self.approved[name]
        raw = [self.costs.group_timing(g) if g is not None and self.mode == "auto" else None for g in groups]
        timings = [self.with_reorders(g, t) for g, t in zip(groups, raw)]
        if name in self.excluded:  # with the times it was measured at, for the report
            return Verdict(False, EXCLUDED, timings, fixed=True, elements=_elements(groups))
        if self.mode == "always":
            return Verdict(True, "fused wherever a kernel exists (fuse=always)", fixed=True)
        if self.mode == "auto" and timings and all(t is not None for t in timings):
            faster = all(t.ours_us < FUSE_MARGIN * t.runtime_us for t in timings)
            reorders = any(a is not b for a, b in zip(raw, timings))
            why = ("faster" if faster else "slower") + (" (the runtime's layout reorders here counted)" if reorders else "")
            return Verdict(faster, why, timings, elements=_elements(groups))
        names = kernels() if kernels else []
        fuse, why = static_verdict(self.target, desc_dtype, names, [g.desc for g in groups if g is not None])
        if self.mode == "auto":
            unknown = next((g for g, t in zip(groups, timings) if g is not None and t is None), None)
            why += f" ({self.costs.why_unknown(unknown) if unknown is not None else 'shapes not known'})"
        return Verdict(fuse, why, timings, fixed=True, static=True, kernel=names[0] if names else "")

    def with_reorders(self, group: FusionGroup, timing: Timing | None) -> Timing | None:
        """`timing` with the runtime's reorders of the group's input and output counted on its side where
        the model has them: fusing the group takes its edge out of the runtime's blocked region, so they
        go (EfficientNet-B0 on ORT's CPU EP: 0.7 of 8.4 ms are the reorders around its squeeze-excite
        Muls). Where the fused group meets a conv left to the runtime instead, the region step counts
        the Transpose the layout pass puts there and the reorder the runtime then adds."""
        if timing is None:
            return None
        into, out_of = self.reordered
        extra = (timing.reorder_in_us if group.x.name in into else 0.0) + \
                (timing.reorder_out_us if group.y.name in out_of else 0.0)
        return replace(timing, runtime_us=timing.runtime_us + extra) if extra else timing

    def choose_regions(self, graph: gs.Graph, plans: list) -> None:
        """Adjusts the verdicts of `plans` (objects with `.nodes`, `.inputs`, `.output`, `.verdict`) so the
        total estimated time, Transposes at region edges included, is least."""
        if self.mode == "always":
            return
        self._drop_isolated_static(graph, plans)
        measured = [i for i, p in enumerate(plans) if not p.verdict.fixed and p.verdict.measured()]
        if not measured or self.mode != "auto":
            return
        batches = [t.batch for t in plans[measured[0]].verdict.timings]  # a static batch dim gives one
        variable = [i for i in measured if [t.batch for t in plans[i].verdict.timings] == batches]
        model = _RegionModel(graph, plans, variable, self.costs, batches, self.precision,
                             lambda t, batch: self.shape_at(graph, t, batch), self.reordered)
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
                # per batch size: the choice weighs them all, so the report shows them all
                saved = [model.transposes(best ^ {i}, b) - model.transposes(best, b) for b in range(len(batches))]
                reorders = [model.reorders(best ^ {i}, b) - model.reorders(best, b) for b in range(len(batches))]
                also = (f" and {' / '.join(f'{s:.1f}' for s in reorders)} µs of the runtime's reorders"
                        if any(reorders) else "")
                plans[i].verdict.fuse = chosen
                plans[i].verdict.reason = (
                    f"{'slower' if chosen else 'faster'} alone; region: {' / '.join(f'{s:.1f}' for s in saved)} µs "
                    f"of Transposes{also} saved by {'fusing' if chosen else 'not fusing'} it at batch "
                    f"{' / '.join(str(b) for b in batches)}")

    def _drop_isolated_static(self, graph: gs.Graph, plans: list) -> None:
        """The static policy judges a candidate alone and knows no Transpose times: one whose fusing adds
        Transposes (a depthwise conv between two convs left to the runtime: one into NHWC, one back) would
        spend more on them than the fused epilogue saves. Such candidates are left to the runtime, round
        by round, until fusing none of those left adds any. Stems on the few-channel kernels are kept:
        they beat cuDNN by far more than their Transposes cost (ResNet-50's 7x7 stem: 2.97x cuDNN at batch
        32, docs/bench-kernels.md; fused at batch 1 and 16 by the measured decisions on an H200, before
        its MaxPool, which stays NCHW)."""
        model = _RegionModel(graph, plans, [], self.costs, [], self.precision, lambda t, batch: None)
        fused = {i for i, p in enumerate(plans) if p.verdict.fuse}
        # An earlier pass's approved rewrite (a pool or Gemm as a conv) is already in the graph: it stays fused.
        approved = {id(v) for v in self.approved.values()}
        static = [i for i in fused if plans[i].verdict.static and id(plans[i].verdict) not in approved
                  and not _stem_kernel(plans[i].verdict.kernel)]
        while static:  # all such at once, then again: a candidate left alone by the last round goes next
            base = model.moved(fused)
            added = {i: base - model.moved(fused - {i}) for i in static}
            dropped = [i for i in static if added[i] >= 1]
            if not dropped:
                break
            for i in dropped:
                fused.discard(i)
                static.remove(i)
                plans[i].verdict.fuse = False
                plans[i].verdict.reason += (f"; not fused: it adds {added[i]} Transpose{'s' * (added[i] > 1)} "
                                            "to the model (static: their cost is not known)")


def _layout_free(shape) -> bool:
    """NCHW <-> NHWC of this 4-D shape moves no memory (one channel, or [N, C, 1, 1] after a pool): the
    layout pass drops such a Transpose. Symbolic dims count as more than one."""
    return shape[1] == 1 or (isinstance(shape[2], int) and isinstance(shape[3], int) and shape[2] * shape[3] == 1)


class _RegionModel:
    """The estimated time of a choice of fused candidates: their FusedConv times, the runtime's times for
    the others, and a Transpose for every tensor that crosses between the NHWC and NCHW parts, less the
    model's own Transposes that cancel against the fused convs'; and where such a tensor is the input or
    output of a candidate left to the runtime, the reorder the runtime then needs there (ORT's CPU EP:
    into or out of NCHWc), unless the model already has it (`reordered`: then it is in that candidate's
    runtime time). Only the `variable` candidates' times count; the others' nodes still count for the
    layout."""

    def __init__(self, graph: gs.Graph, plans: list, variable: list[int], costs: Costs, batches: list[int],
                 dtype: str, shape_at, reordered: tuple[set[str], set[str]] = (set(), set())):
        self.costs, self.batches, self.dtype, self.shape_at = costs, batches, dtype, shape_at
        self.reordered = reordered
        self.node_lists = [p.nodes for p in plans]
        self.input_lists = [p.inputs for p in plans]
        self.outputs = [p.output for p in plans]
        self.order = list(graph.nodes)
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.transpose_cache: dict[tuple, float] = {}
        self.timed = [(i, plans[i]) for i in variable]
        self.timings = {i: plans[i].verdict.timings for i in variable}
        # the timed candidates reading each tensor as their input, and the one writing it
        self.timed_readers: dict[int, list[int]] = {}
        self.timed_writer: dict[int, int] = {}
        for i in variable:
            self.timed_readers.setdefault(id(self.input_lists[i][0]), []).append(i)
            self.timed_writer[id(self.outputs[i])] = i
        # the time of each batch with nothing fused, to weigh batch sizes equally
        self.scale = [max(sum(p.verdict.timings[b].runtime_us for _, p in self.timed), 1e-9)
                      for b in range(len(batches))]

    def nhwc_nodes(self, fused: set[int]) -> set[int]:
        """The nodes that run NHWC: the fused candidates', and the ops the layout pass moves Transposes
        through whose data inputs all come from them or from the model's own permutes back to NCHW (at
        least one from the fused part: ConvNeXt's residual Add of a permute and a fused block)."""
        nodes = {id(n) for i in fused for n in self.node_lists[i]}
        for node in self.order:
            if id(node) in nodes or node.op not in HANDLERS:  # ops the layout pass moves Transposes through
                continue
            data = variable_data_inputs(node)
            sources = [producer(t) for t in data]
            from_nhwc = [s is not None and id(s) in nodes for s in sources]
            permuted = [is_transpose(s, NHWC_TO_NCHW) for s in sources]
            if any(from_nhwc) and all(f or q for f, q in zip(from_nhwc, permuted)) \
                    and all(len(shape_of(t) or [0] * 4) == 4 for t in data):  # unknown rank: taken as 4-D
                nodes.add(id(node))
        return nodes

    def crossing(self, fused: set[int]) -> list[tuple[gs.Tensor, int]]:
        """The Transposes the layout pass would leave where the NHWC part meets the rest, as (tensor, +1),
        and the model's own Transposes it would remove, as (tensor, -1): an exported NHWC op (ConvNeXt's
        permute before LayerNorm) reading a fused conv's output, or the NHWC part reading a permute back
        to NCHW, cancels against the fused conv's Transpose (each weighed on its NCHW tensor)."""
        nhwc = self.nhwc_nodes(fused)
        added, removed = {}, {}
        for node in self.order:
            if id(node) not in nhwc:
                continue
            for t in node.outputs:
                outside = [c for c in t.outputs if id(c) not in nhwc]
                absorbing = [c for c in outside if is_transpose(c, NCHW_TO_NHWC)]
                if id(t) in self.graph_outputs or len(absorbing) < len(outside):
                    added[id(t)] = t
                removed.update((id(c), t) for c in absorbing)
        fused_inputs = {id(t) for i in fused for t in self.input_lists[i]}
        for node in self.order:  # inputs of the NHWC part: the fused convs' and the NHWC ops'
            if id(node) not in nhwc:
                continue
            for t in node.inputs:
                source = producer(t)
                if not t.name or constant_value(t) is not None or (source is not None and id(source) in nhwc):
                    continue
                if is_transpose(source, NHWC_TO_NCHW):
                    if id(t) not in self.graph_outputs and all(id(c) in nhwc for c in t.outputs):
                        removed[id(source)] = t
                    continue
                if id(t) in fused_inputs:  # an NHWC op's other inputs are its parameters
                    added[id(t)] = t
        return [(t, 1) for t in added.values()] + [(t, -1) for t in removed.values()]

    def _transpose_us(self, t: gs.Tensor, batch: int) -> float:
        shape = self.shape_at(t, batch)
        if not shape or len(shape) != 4:
            return 0.0  # a tensor of unknown shape is not weighed (the layout pass moves only 4-D ones)
        if _layout_free(shape):
            return 0.0
        key = tuple(shape)
        if key not in self.transpose_cache:
            self.transpose_cache[key] = self.costs.transpose_us(shape, self.dtype) or 0.0
        return self.transpose_cache[key]

    def moved(self, fused: set[int]) -> int:
        """How many Transposes that move memory the layout pass would leave (net of the model's own it
        removes), counted, not timed: tensors of unknown shape count."""
        def moves(t: gs.Tensor) -> bool:
            shape = shape_of(t)
            if not shape:
                return True
            return len(shape) == 4 and not _layout_free(shape)  # the layout pass moves only 4-D tensors
        return sum(sign for t, sign in self.crossing(fused) if moves(t))

    def reorders(self, fused: set[int], batch_index: int = 0) -> float:
        return self.runtime_reorders(fused, self.crossing(fused), batch_index)

    def transposes(self, fused: set[int], batch_index: int = 0) -> float:
        return sum(sign * self._transpose_us(t, self.batches[batch_index]) for t, sign in self.crossing(fused))

    def runtime_reorders(self, fused: set[int], crossing: list[tuple[gs.Tensor, int]], batch_index: int) -> float:
        """The runtime's reorders the crossing tensors add at the candidates left to it (µs)."""
        into, out_of = self.reordered
        extra = 0.0
        for t, sign in crossing:
            if sign < 0:
                continue
            if t.name not in into:
                extra += sum(self.timings[i][batch_index].reorder_in_us
                             for i in self.timed_readers.get(id(t), ()) if i not in fused)
            i = self.timed_writer.get(id(t))
            if i is not None and i not in fused and t.name not in out_of:
                extra += self.timings[i][batch_index].reorder_out_us
        return extra

    def cost(self, fused: set[int]) -> float:
        crossing = self.crossing(fused)
        total = 0.0
        for b, batch in enumerate(self.batches):
            groups = sum((p.verdict.timings[b].ours_us / FUSE_MARGIN if i in fused else p.verdict.timings[b].runtime_us)
                         for i, p in self.timed)
            edges = sum(sign * self._transpose_us(t, batch) for t, sign in crossing)
            total += (groups + edges + self.runtime_reorders(fused, crossing, b)) / self.scale[b]
        return total
