"""A zero Pad of a Conv's input, its amounts constant and on the spatial axes only, becomes the Conv's own
pads, as ONNX Runtime's PadFusion does on its side where the model holds the amounts as constants.
TensorFlow exports (tf2onnx, timm's tf_ models once shape_constants has folded their run-time "same"
padding) pad every strided conv's input with a separate Pad: the copy of a whole feature map (at
113x113x96 in tf_efficientnet_b0) that the conv's own pads do without, and a node between the conv and
what the layout pass keeps channels-last.

On ort-cpu only, where the result was measured; a Conv's asymmetric pads on the GPU targets were not.
Where the Pad's output has other readers or is a graph output, or the Pad pads the batch or the
channels, reflects, or pads by a value other than zero, it stays."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import attr_text, constant_value, producer, set_inputs
from ..report import Report


def _spatial_amounts(pad: gs.Node) -> list[int] | None:
    """[top, left, bottom, right] of a 4-D zero Pad of H and W alone, else None."""
    if attr_text(pad, "mode", "constant") != "constant":
        return None
    if "pads" in pad.attrs:  # opset < 11: amounts and value as attributes
        amounts, value = np.array(pad.attrs["pads"]), pad.attrs.get("value", 0.0)
    else:
        if len(pad.inputs) < 2 or len(pad.inputs) > 3 and pad.inputs[3].name:  # an axes input: not modelled
            return None
        amounts = constant_value(pad.inputs[1])
        value = constant_value(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2].name else 0.0
    if amounts is None or value is None or np.any(np.asarray(value) != 0):
        return None
    amounts = [int(a) for a in np.asarray(amounts).reshape(-1)]
    if len(amounts) != 8 or any(a < 0 for a in amounts) or any(amounts[i] for i in (0, 1, 4, 5)):
        return None
    return [amounts[2], amounts[3], amounts[6], amounts[7]]


def pad_into_conv(graph: gs.Graph, report: Report, target: str) -> gs.Graph:
    if target != "ort-cpu":
        return graph
    for conv in graph.nodes:
        if conv.op != "Conv" or attr_text(conv, "auto_pad", "NOTSET") != "NOTSET":
            continue
        x = conv.inputs[0]
        pad = producer(x)
        if pad is None or pad.op != "Pad" or len(x.outputs) != 1 or any(o is x for o in graph.outputs):
            continue
        amounts = _spatial_amounts(pad)
        if amounts is None:
            continue
        own = [int(p) for p in conv.attrs.get("pads", [0, 0, 0, 0])]
        conv.attrs["pads"] = [a + b for a, b in zip(own, amounts)]
        set_inputs(conv, [pad.inputs[0], *conv.inputs[1:]])
        pad.outputs.clear()
        report.canonicalized["zero Pad → Conv pads"] += 1
    return graph.cleanup(remove_unused_graph_inputs=False)
