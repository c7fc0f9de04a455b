"""Fuse Conv (+ folded BN) + activation, and a residual Add before ('pre') or after ('post') the
activation, into one epifuse::FusedConv node (contract: shared/docs/fusedconv-op.md).

Preconditions, checked in plain sight for every conv:
- 2-D conv with a constant filter (and constant bias when present), explicit pads;
- every intermediate (conv output, pre-activation sum) has no consumer outside the pattern,
  otherwise fusing would compute it twice;
- the residual has exactly the output's shape (no broadcast), is not a constant and is not
  computed from the conv's own output (that would be a cycle);
- the kernel registry has a kernel for the case on the chosen target (dtype, group, alignment).
Where the full pattern has no kernel, smaller ones are tried (activation only, then the conv
alone, which still moves the conv into the NHWC region); every refusal is in the report. The
largest candidate with a kernel then fuses only where the decider (optimizer.decide) finds it faster
than what the runtime runs for the same nodes; every candidate, fused or not, is in the report's
decisions with its times. Candidates are all chosen before any is rewritten, so a region's choice
can weigh its neighbours; a node goes to the first conv (in topological order) whose fused pattern
takes it.

A grouped conv of few groups (ort-cuda) may fuse as one dense conv on block-diagonal filters: `group`
times the multiply-adds, on the dense tensor-core kernels, which beat grouped kernels (cuDNN's and ours)
where the groups are few and narrow (RegNetY's 24 channels per group at 2, 5 and 14 groups). Only where
measured faster than both the runtime's grouped conv and our grouped kernel at every batch size, never
on the static policy. The zeros between the groups add exact zeros to every sum, so the result is the
grouped conv's up to the order of the sums (an input that is already inf or NaN would spread NaN to the
other groups' outputs, as inf * 0 does).

The fused node reads and writes NHWC, so it is wrapped in Transposes here; the layout pass
cancels the pairs that meet between neighbouring NHWC ops.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from .. import contract, registry
from ..activations import ActivationMatch, match_replaceable_activation
from ..decide import EXCLUDED, Decider, Verdict
from ..graph import (NCHW_TO_NHWC, NHWC_TO_NCHW, add_transpose, constant_value, depends_on,
                     ensure_domain, itemsize, make_constant, make_variable, numel_per_image, same_shape,
                     shape_of, unique_name)
from ..registry import ConvDesc
from ..report import Report
from .split_convs import SplitConvs, find_split_convs, merged_forms, signature

# The most groups a grouped conv is tried as a dense conv with (the dense conv does `group` times the
# work): RegNetY-1.6GF's 2, 5 and 14, not ResNeXt's 32 nor RegNetY's 37.
MAX_DENSE_GROUPS = 16
DENSE_REWRITE = "grouped Conv → dense Conv on block-diagonal filters (ort-cuda, measured faster)"
SPLIT_REWRITE = "Split → Convs → Concat → one {form} Conv"


@dataclass
class ConvParams:
    weight: np.ndarray
    bias: np.ndarray | None
    group: int
    strides: list[int]
    pads: list[int]
    dilations: list[int]
    rewrite: str = ""  # the report's `canonicalized` entry where `weight` is not the conv's own filter


def block_diagonal(w: np.ndarray, group: int) -> np.ndarray:
    """A grouped conv's filters [K, C/group, R, S] as the dense conv's [K, C, R, S]: group g's output
    channels read its own input channels, zeros elsewhere."""
    k, cg = w.shape[0], w.shape[1]
    dense = np.zeros((k, cg * group, *w.shape[2:]), w.dtype)
    kg = k // group
    for g in range(group):
        dense[g * kg:(g + 1) * kg, g * cg:(g + 1) * cg] = w[g * kg:(g + 1) * kg]
    return dense


@dataclass
class Candidate:
    activation: str
    params: tuple[float, ...]
    residual: str
    z: gs.Tensor | None
    nodes: list[gs.Node]      # pattern nodes after the conv
    output: gs.Tensor         # tensor the pattern writes


def _conv_params(conv: gs.Node) -> ConvParams | str:
    w = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None:
        return "filter is not a constant"
    if w.ndim != 4:
        return f"{w.ndim - 2}-D convolution (FusedConv v1 is 2-D only)"
    if np.dtype(w.dtype).name not in contract.DTYPE_CODES:
        return f"dtype {w.dtype} has no FusedConv kernel"
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", b"NOTSET"):
        return f"auto_pad={auto_pad} could not be resolved to explicit pads"
    bias = None
    if len(conv.inputs) > 2 and conv.inputs[2].name:
        bias = constant_value(conv.inputs[2])
        if bias is None:
            return "bias is not a constant"
    x_shape = shape_of(conv.inputs[0])
    if x_shape is not None and len(x_shape) != 4:
        return f"input rank {len(x_shape)} (expected 4)"
    return ConvParams(w, bias, int(conv.attrs.get("group", 1)), list(conv.attrs.get("strides", [1, 1])),
                      list(conv.attrs.get("pads", [0, 0, 0, 0])), list(conv.attrs.get("dilations", [1, 1])))


def _krsc(w: np.ndarray, sole_reader: bool) -> np.ndarray:
    """The OIHW filter as KRSC. A large filter this conv alone reads is transposed in place, one output
    channel at a time, so a model's peak memory never holds it twice."""
    if not sole_reader or w.nbytes < 1 << 20 or not (w.flags.c_contiguous and w.flags.writeable):
        return np.ascontiguousarray(np.transpose(w, (0, 2, 3, 1)))
    k = w.shape[0]
    rows = w.reshape(k, -1)
    for i in range(k):
        rows[i] = w[i].transpose(1, 2, 0).reshape(-1)  # the right side is a small copy of one channel
    return rows.reshape(k, w.shape[2], w.shape[3], w.shape[1])


def _residual_add(graph: gs.Graph, t: gs.Tensor) -> tuple[gs.Node, gs.Tensor] | None:
    if len(t.outputs) != 1 or t in graph.outputs:
        return None
    add = t.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return None
    z = add.inputs[1] if add.inputs[0] is t else add.inputs[0]
    if constant_value(z) is not None or z.dtype != t.dtype:
        return None
    if not (same_shape(z, add.outputs[0]) and same_shape(t, add.outputs[0])) or depends_on(z, t):
        return None
    return add, z


def _activation(graph: gs.Graph, t: gs.Tensor) -> ActivationMatch | None:
    if t in graph.outputs:
        return None
    return match_replaceable_activation(graph, t)


def _candidates(graph: gs.Graph, y: gs.Tensor) -> list[Candidate]:
    """Patterns at conv output `y`, largest first; the conv alone is always last."""
    found = []
    res = _residual_add(graph, y)
    if res is not None:
        add, z = res
        act = _activation(graph, add.outputs[0])
        if act is not None:
            found.append(Candidate(act.name, act.params, "pre", z, [add, *act.nodes], act.output))
        found.append(Candidate("identity", (), "pre", z, [add], add.outputs[0]))
    act = _activation(graph, y)
    if act is not None:
        res = _residual_add(graph, act.output)
        if res is not None:
            add, z = res
            found.append(Candidate(act.name, act.params, "post", z, [*act.nodes, add], add.outputs[0]))
        found.append(Candidate(act.name, act.params, "none", None, act.nodes, act.output))
    found.append(Candidate("identity", (), "none", None, [], y))
    return found


def _describe(c: Candidate) -> str:
    return f"{c.activation}" + (f" with residual {c.residual}" if c.residual != "none" else "")


@dataclass
class Plan:
    """The candidate chosen for one conv, and whether it fuses."""

    conv: gs.Node
    params: ConvParams
    candidate: Candidate
    verdict: Verdict

    @property
    def nodes(self) -> list[gs.Node]:
        return [self.conv, *self.candidate.nodes]

    @property
    def inputs(self) -> list[gs.Tensor]:
        return [self.conv.inputs[0]] + ([self.candidate.z] if self.candidate.z is not None else [])

    @property
    def output(self) -> gs.Tensor:
        return self.candidate.output


class _Fuser:
    def __init__(self, graph: gs.Graph, report: Report, target: str, kernel_query, decider: Decider):
        self.graph, self.report, self.target, self.kernel_query = graph, report, target, kernel_query
        self.decider = decider
        self.nhwc_of: dict[str, gs.Tensor] = {}
        self.claimed: set[int] = set()  # nodes of candidates that fuse: not for a later conv's pattern

    def to_nhwc(self, t: gs.Tensor) -> gs.Tensor:
        if t.name not in self.nhwc_of:
            self.nhwc_of[t.name] = add_transpose(self.graph, t, NCHW_TO_NHWC, f"{t.name}_nhwc")
            self.report.transposes_inserted += 1
        return self.nhwc_of[t.name]

    def desc(self, conv: gs.Node, p: ConvParams, c: Candidate) -> dict:
        x_shape = shape_of(conv.inputs[0]) or [None] * 4
        known = [d if isinstance(d, int) and d >= 0 else -1 for d in x_shape]
        k, r, s, cg = p.weight.shape[0], p.weight.shape[2], p.weight.shape[3], p.weight.shape[1]
        return dict(dtype=self.decider.dtype_code(p.weight.dtype), N=known[0], H=known[2], W=known[3],
                    C=cg * p.group, K=k, R=r, S=s, group=p.group, stride_h=p.strides[0], stride_w=p.strides[1],
                    dil_h=p.dilations[0], dil_w=p.dilations[1], pad_top=p.pads[0], pad_left=p.pads[1],
                    pad_bottom=p.pads[2], pad_right=p.pads[3], activation=c.activation,
                    activation_params=tuple(c.params), residual=c.residual, allow_tf32=self.decider.allow_tf32)

    def plan(self, conv: gs.Node) -> Plan | None:
        """The largest candidate with a kernel, and the cost verdict on it; None (and the reason in the
        report) where nothing has a kernel."""
        params = _conv_params(conv)
        if isinstance(params, str):
            self.report.skip(conv, f"not fused: {params}")
            return None
        candidates = [c for c in _candidates(self.graph, conv.outputs[0])
                      if not any(id(n) in self.claimed for n in c.nodes)]
        refused = []
        for cand in candidates:
            desc = self.desc(conv, params, cand)
            count, reason = self.kernel_query(self.target, desc)
            if count > 0:
                break
            refused.append(f"{_describe(cand)}: {reason}")
        else:
            self.report.skip(conv, "not fused: " + "; ".join(refused))
            return None
        if refused:
            self.report.skip(conv, f"{_describe(cand)} is the largest pattern with a kernel — " + "; ".join(refused))
        elif len(candidates) == 1 and len(conv.outputs[0].outputs) > 1:
            users = sorted({n.op for n in conv.outputs[0].outputs})
            self.report.skip(conv, f"identity is the largest pattern: the conv output also feeds {', '.join(users)} "
                                   f"({len(conv.outputs[0].outputs)} consumers), so nothing after it can be fused")
        verdict = self.decider.verdict(self.groups(conv, params, cand, desc), contract.PRECISION_OF_CODE[desc["dtype"]],
                                       lambda: registry.kernel_names(self.target, ConvDesc(**desc)), conv.name)
        dense = self.dense_option(conv, params, cand, desc, verdict)
        if dense is not None:
            params, verdict = dense
        if verdict.fuse:
            self.claimed.update(id(n) for n in cand.nodes)
        return Plan(conv, params, cand, verdict)

    def dense_option(self, conv: gs.Node, p: ConvParams, c: Candidate, desc: dict,
                     grouped: Verdict) -> tuple[ConvParams, Verdict] | None:
        """The grouped conv as a dense one on block-diagonal filters, with its verdict, where that was
        measured faster than the runtime and than `grouped` (our grouped kernel's verdict) at every batch
        size; else None."""
        if (self.target != "ort-cuda" or self.decider.mode != "auto" or not 1 < p.group <= MAX_DENSE_GROUPS
                or p.group == desc["C"] or not grouped.measured()):
            return None
        dense_desc = dict(desc, group=1)
        if self.kernel_query(self.target, dense_desc)[0] == 0:
            return None
        dense = ConvParams(block_diagonal(p.weight, p.group), p.bias, 1, p.strides, p.pads, p.dilations,
                           rewrite=DENSE_REWRITE)
        # timed against the runtime's grouped conv: a name and a costs key of its own
        pattern = "+".join(n.op for n in [conv, *c.nodes]) + f" (g{p.group} as dense)"
        groups = self.groups(conv, dense, c, dense_desc, f"{conv.name}_dense", pattern)
        verdict = self.decider.verdict(groups, contract.PRECISION_OF_CODE[desc["dtype"]], name=conv.name)
        if not (verdict.fuse and verdict.measured()):
            return None
        if grouped.fuse and not all(d.ours_us < g.ours_us for d, g in zip(verdict.timings, grouped.timings)):
            return None
        ours = " / ".join(f"{g.ours_us:.1f}" for g in grouped.timings)
        verdict.reason = (f"faster as a dense conv on block-diagonal filters ({p.group} groups; our grouped "
                          f"kernel {ours} µs, {'faster' if grouped.fuse else 'slower'} than the runtime)")
        return dense, verdict

    def plan_split(self, sc: SplitConvs) -> Plan | None:
        """The Split → Convs → Concat group `sc` as one FusedConv on merged filters, in the form measured
        fastest where that beats the runtime running the group's nodes at every batch size (fuse=always:
        the form of least work with a kernel); None where no form does, and its convs are then planned
        one by one. A group the whole-model check left out leaves its convs to the runtime too; a region
        choice that leaves a merged group unfused does the same."""
        excluded = self.decider.excluded
        if self.decider.mode not in ("auto", "always") or any(id(n) in self.claimed for n in sc.nodes) \
                or any(conv.name in excluded for conv in sc.convs):
            return None
        if sc.split.name in excluded:
            self.claimed.update(id(conv) for conv in sc.convs)
            self.report.skip(sc.split, f"{len(sc.convs)} split convs not merged nor fused: {EXCLUDED}")
            return None
        parts = [_conv_params(conv) for conv in sc.convs]
        if any(isinstance(p, str) for p in parts):
            return None
        candidates = [c for c in _candidates(self.graph, sc.output) if not any(id(n) in self.claimed for n in c.nodes)]
        best, fastest, tried = None, None, []  # (µs summed over the batch sizes, plan)
        for form, fields, _ in merged_forms(parts):
            params = ConvParams(**fields, rewrite=SPLIT_REWRITE.format(form=form))
            cand = next((c for c in candidates if self.kernel_query(self.target, self.desc(sc.split, params, c))[0]), None)
            if cand is None:
                tried.append(f"as {form}: no kernel")
                continue
            desc = self.desc(sc.split, params, cand)
            merged = Candidate(cand.activation, cand.params, cand.residual, cand.z,
                               [*sc.convs, sc.concat, *cand.nodes], cand.output)
            # timed against the parts as they run: a key that names them
            pattern = "+".join(n.op for n in [sc.split, *merged.nodes]) + f" (as {form} of {signature(parts)})"
            verdict = self.decider.verdict(self.groups(sc.split, params, merged, desc, f"{sc.split.name}_{form}", pattern),
                                           contract.PRECISION_OF_CODE[desc["dtype"]], name=sc.split.name)
            plan = Plan(sc.split, params, merged, verdict)
            if self.decider.mode == "always":
                best = (0.0, plan)
                break
            if not verdict.measured():  # unmeasured (static) verdicts never merge
                tried.append(f"as {form}: {verdict.reason}")
                continue
            ours = sum(t.ours_us for t in verdict.timings)
            tried.append(f"as {form}: {verdict.reason} ({' / '.join(f'{t.ours_us:.1f}' for t in verdict.timings)} µs)")
            fastest = min(fastest, (ours, plan), key=lambda f: f[0]) if fastest else (ours, plan)
            if verdict.fuse:
                best = min(best, (ours, plan), key=lambda f: f[0]) if best else (ours, plan)
        if best is None:
            why = f"{len(sc.convs)} split convs not merged: " + ("; ".join(tried) or "no merged form")
            if fastest is not None:  # a measured candidate like any other (the whole-model check's variants)
                _, plan = fastest
                plan.verdict.reason = why
                self.report.decide(sc.split, "+".join(n.op for n in plan.nodes), plan.verdict)
            else:
                self.report.skip(sc.split, why)
            return None
        _, plan = best
        if tried:
            plan.verdict.reason = f"{len(sc.convs)} convs merged; " + "; ".join(tried)
        self.claimed.update(id(n) for n in plan.nodes)
        return plan

    def groups(self, conv: gs.Node, p: ConvParams, c: Candidate, desc: dict, name: str | None = None,
               pattern: str | None = None):
        bias = p.bias if p.bias is not None else np.zeros(p.weight.shape[0], dtype=p.weight.dtype)
        return self.decider.groups(self.graph, name or conv.name, [conv, *c.nodes], conv.inputs[0], c.z, c.output,
                                   p.weight, bias, ConvDesc(**desc), pattern)

    def rewrite(self, conv: gs.Node, p: ConvParams, c: Candidate) -> None:
        graph = self.graph
        w = p.weight
        bias = p.bias if p.bias is not None else np.zeros(w.shape[0], dtype=w.dtype)
        inputs = [self.to_nhwc(conv.inputs[0]),
                  make_constant(graph, f"{conv.name}_W_krsc",
                                _krsc(w, sole_reader=conv.op != "Conv" or len(conv.inputs[1].outputs) == 1)),
                  make_constant(graph, f"{conv.name}_B", bias.astype(w.dtype).reshape(-1))]
        if c.z is not None:
            inputs.append(self.to_nhwc(c.z))
        attrs = {"strides": p.strides, "pads": p.pads, "dilations": p.dilations, "group": p.group,
                 "activation": c.activation, "residual": c.residual,
                 "plugin_namespace": contract.PLUGIN_NAMESPACE, "plugin_version": contract.PLUGIN_VERSION}
        if c.params:
            attrs["activation_params"] = [float(v) for v in c.params]
        if self.decider.allow_tf32:
            attrs["allow_tf32"] = 1
        out_shape = shape_of(c.output)
        y_nhwc = make_variable(graph, f"{c.output.name}_nhwc", c.output.dtype,
                               [out_shape[i] for i in NCHW_TO_NHWC] if out_shape and len(out_shape) == 4 else None)
        graph.nodes.append(gs.Node(contract.OP_TYPE, name=unique_name(graph, f"{conv.name}_fused"),
                                   domain=contract.DOMAIN, attrs=attrs, inputs=inputs, outputs=[y_nhwc]))
        self.account(conv, c)
        final = c.output
        filters = [n.inputs[1] for n in [conv, *c.nodes] if n.op == "Conv"]  # a merged split's are several
        for node in [conv, *c.nodes]:  # detach fully so consumer counts stay exact for later convs
            node.inputs.clear()
            node.outputs.clear()
        for filter_tensor in filters:
            if isinstance(filter_tensor, gs.Constant) and not filter_tensor.outputs:
                # gs tensors sit in reference cycles, so the OIHW filter would live until a cycle collection,
                # beside its KRSC copy: empty it now (nothing reads it any more)
                filter_tensor.values = np.empty((0,), w.dtype)
        add_transpose(graph, y_nhwc, NHWC_TO_NCHW, f"{final.name}_nchw", out=final)
        self.report.transposes_inserted += 1
        self.report.fusions[f"{c.activation}/{c.residual}"] += 1
        if p.rewrite:
            self.report.canonicalized[p.rewrite] += 1

    def account(self, conv: gs.Node, c: Candidate) -> None:
        """Intermediates that are no longer written and read back, per image."""
        for node in [conv, *c.nodes]:
            for t in node.outputs:
                if t is not c.output:
                    self.report.activation_bytes_saved += 2 * (numel_per_image(t) or 0) * itemsize(t)


def fuse_conv(graph: gs.Graph, report: Report, target: str, kernel_query, decider: Decider | None = None,
              only: set[str] | None = None) -> gs.Graph:
    """`kernel_query(target, desc) -> (count, reason)`: the kernel registry (optimizer.registry);
    `decider`: which candidates with a kernel fuse (default: all of them); `only`: the names of the
    convs to consider (default: every Conv), for a second pass over convs a later pass added."""
    graph.toposort()
    decider = decider or Decider(target, "fp32", mode="always")
    fuser = _Fuser(graph, report, target, kernel_query, decider)
    splits = [] if only is not None else find_split_convs(graph)
    plans = [p for p in (fuser.plan_split(sc) for sc in splits) if p is not None]
    convs = [n for n in graph.nodes if n.op == "Conv" and (only is None or n.name in only) and id(n) not in fuser.claimed]
    plans += [p for p in (fuser.plan(conv) for conv in convs) if p is not None]
    decider.choose_regions(graph, plans)
    for i, plan in enumerate(plans):
        if plan.verdict.fuse and not all(n.outputs for n in plan.nodes):
            plan.verdict.fuse = False  # a region choice gave a node of its pattern to an earlier conv
            plan.verdict.reason += "; its pattern overlaps one fused before it"
        report.decide(plan.conv, "+".join(n.op for n in plan.nodes), plan.verdict)
        large = plan.params.weight.nbytes >= 1 << 20
        if plan.verdict.fuse:
            fuser.rewrite(plan.conv, plan.params, plan.candidate)
        plan.params = None  # the plans would otherwise keep every replaced OIHW filter alive to the end
        if large and i % 16 == 15:
            gc.collect()  # and gs's self-referencing tensors may still hold some: free them as we go
    if report.fused_count():
        ensure_domain(graph, contract.DOMAIN, contract.OPSET_VERSION)
    return graph.cleanup(remove_unused_graph_inputs=False).toposort()
