"""Split → one Conv per part → Concat: one convolution written as several nodes (timm's MixedConv2d:
MixNet's two-part 1x1s and its depthwise convs of mixed kernel sizes, 3x3 to 11x11). The fuse pass may
run such a group as one FusedConv on merged filters, where measured faster than the runtime running the
nodes as they are (optimizer.passes.fuse_conv).

Each merged form computes every output as the same sum of the same products; the filter taps it adds
are zeros, which add exact zeros (an input already inf or NaN would spread NaN, as inf * 0 does):
- grouped: dense parts of one shape, as one conv of `group` = the number of parts (the same work);
- depthwise: depthwise parts of one channel multiplier, as one depthwise conv with the largest kernel,
  the smaller ones zero-padded around their place in it (the same work where the kernels are equal);
- dense: dense parts of any sizes, as one conv on block-diagonal filters (parts times the work).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import shape_of

# The most parts a split is tried as one dense conv with (that conv does `parts` times the work).
MAX_DENSE_PARTS = 16


@dataclass
class SplitConvs:
    split: gs.Node
    convs: list[gs.Node]   # in the Split's output order, which is the Concat's input order
    concat: gs.Node

    @property
    def nodes(self) -> list[gs.Node]:
        return [self.split, *self.convs, self.concat]

    @property
    def output(self) -> gs.Tensor:
        return self.concat.outputs[0]


def _channel_axis(node: gs.Node, t: gs.Tensor) -> bool:
    rank = len(shape_of(t) or [None] * 4)
    return rank == 4 and int(node.attrs.get("axis", 0)) in (1, 1 - rank)


def find_split_convs(graph: gs.Graph) -> list[SplitConvs]:
    """Every Split along channels whose outputs each feed one Conv (as its data input) and nothing else,
    the Convs' outputs feeding one channel Concat, in the same order, and nothing else."""
    found = []
    outputs = {id(t) for t in graph.outputs}
    for split in graph.nodes:
        if split.op != "Split" or len(split.outputs) < 2 or not _channel_axis(split, split.inputs[0]):
            continue
        parts = split.outputs
        if any(id(t) in outputs or len(t.outputs) != 1 or t.outputs[0].op != "Conv" or t.outputs[0].inputs[0] is not t
               for t in parts):
            continue
        convs = [t.outputs[0] for t in parts]
        ys = [c.outputs[0] for c in convs]
        if len({id(c) for c in convs}) != len(convs) or any(id(y) in outputs or len(y.outputs) != 1 for y in ys):
            continue
        concat = ys[0].outputs[0]
        if concat.op != "Concat" or [id(t) for t in concat.inputs] != [id(y) for y in ys] \
                or not _channel_axis(concat, concat.outputs[0]):
            continue
        found.append(SplitConvs(split, convs, concat))
    return found


def signature(parts: list) -> str:
    """The parts as the runtime runs them (channels in > out, kernel, stride, pads), for a measurement's
    key: two groups that merge into the same conv can differ in what the runtime does for them."""
    return ", ".join(f"{p.weight.shape[1] * p.group}>{p.weight.shape[0]} {p.weight.shape[2]}x{p.weight.shape[3]}"
                     f"{' dw' if p.group > 1 else ''} s{p.strides[0]},{p.strides[1]} p{','.join(map(str, p.pads))}"
                     for p in parts)


def _nest(sizes: list[int], dilation: int, lo: list[int], hi: list[int]) -> tuple[int, int, int, list[int]] | None:
    """One axis of the merged window: (size, pad before, pad after, each part's offset in it), where
    every part's window sits inside it at the same output positions for every input size; None where
    they do not (their outputs would differ in count, or their taps fall between the merged ones)."""
    if len({lo_i + hi_i - dilation * (r - 1) for r, lo_i, hi_i in zip(sizes, lo, hi)}) != 1:
        return None  # the output sizes would differ for some input size
    if dilation != 1 and (len(set(sizes)) > 1 or len(set(lo)) > 1):
        return None
    before = max(lo)
    offsets = [before - p for p in lo]
    size = max(o + r for o, r in zip(offsets, sizes))
    after = lo[0] + hi[0] - dilation * (sizes[0] - 1) + dilation * (size - 1) - before
    return (size, before, after, offsets) if after >= 0 else None


def merged_forms(parts: list) -> list[tuple[str, dict, float]]:
    """`parts`: each Conv's parameters (weight OIHW, bias or None, group, strides, pads, dilations). The
    merged convs that compute the parts side by side, as (form, fields of fuse_conv's ConvParams, work
    over the parts' work), least work first; [] where the parts do not merge."""
    first = parts[0]
    if any(p.strides != first.strides or p.dilations != first.dilations or p.weight.dtype != first.weight.dtype
           for p in parts):
        return []
    rows = _nest([p.weight.shape[2] for p in parts], first.dilations[0], [p.pads[0] for p in parts],
                 [p.pads[2] for p in parts])
    cols = _nest([p.weight.shape[3] for p in parts], first.dilations[1], [p.pads[1] for p in parts],
                 [p.pads[3] for p in parts])
    if rows is None or cols is None:
        return []
    (r, top, bottom, row_at), (s, left, right, col_at) = rows, cols
    ks = [p.weight.shape[0] for p in parts]
    cs = [p.weight.shape[1] * p.group for p in parts]
    work = sum(p.weight.size for p in parts)  # multiply-adds per output pixel
    bias = np.concatenate([p.bias if p.bias is not None else np.zeros(k, p.weight.dtype) for p, k in zip(parts, ks)])
    common = dict(bias=bias.astype(first.weight.dtype), strides=list(first.strides), pads=[top, left, bottom, right],
                  dilations=list(first.dilations))

    def embedded(in_channels: int, block_diagonal: bool) -> np.ndarray:
        w = np.zeros((sum(ks), in_channels, r, s), first.weight.dtype)
        k0 = c0 = 0
        for p, k, c, dr, ds in zip(parts, ks, cs, row_at, col_at):
            c_in = slice(c0, c0 + c) if block_diagonal else slice(0, p.weight.shape[1])
            w[k0:k0 + k, c_in, dr:dr + p.weight.shape[2], ds:ds + p.weight.shape[3]] = p.weight
            k0, c0 = k0 + k, c0 + c
        return w

    forms = []
    if all(p.group == 1 for p in parts):
        same = len({(k, c) for k, c in zip(ks, cs)}) == 1 and len(set(row_at)) == len(set(col_at)) == 1 \
            and all(p.weight.shape[2:] == (r, s) for p in parts)
        if same:
            forms.append(("grouped", dict(weight=embedded(cs[0], False), group=len(parts), **common), 1.0))
        if len(parts) <= MAX_DENSE_PARTS:
            w = embedded(sum(cs), True)
            forms.append(("dense", dict(weight=w, group=1, **common), w.size / work))
    elif all(p.weight.shape[1] == 1 and p.group == c for p, c in zip(parts, cs)) \
            and len({k // c for k, c in zip(ks, cs)}) == 1 and all(k % c == 0 for k, c in zip(ks, cs)):
        w = embedded(1, False)
        forms.append(("depthwise", dict(weight=w, group=sum(cs), **common), w.size / work))
    return sorted(forms, key=lambda f: f[2])
