"""Cleanup: drop dead nodes and initializers, merge duplicate initializers, order nodes
topologically, export, run shape inference and onnx.checker on the result."""
from __future__ import annotations

import hashlib

import onnx
import onnx_graphsurgeon as gs
from onnx import shape_inference

from ..errors import EpifuseError
from ..graph import replace_uses
from ..report import Report


def merge_duplicate_initializers(graph: gs.Graph) -> int:
    seen: dict[tuple, gs.Constant] = {}
    merged = 0
    for name, t in list(graph.tensors().items()):
        if not isinstance(t, gs.Constant) or t in graph.inputs:
            continue
        v = t.values
        key = (str(v.dtype), v.shape, hashlib.sha1(v.tobytes()).hexdigest())
        first = seen.setdefault(key, t)
        if first is not t:
            replace_uses(graph, t, first)
            merged += 1
    return merged


def cleanup(graph: gs.Graph, report: Report, template: onnx.ModelProto) -> onnx.ModelProto:
    """Returns the finished model; `template` supplies what gs does not carry (IR version, metadata)."""
    graph.cleanup(remove_unused_graph_inputs=False)
    merged = merge_duplicate_initializers(graph)
    if merged:
        report.canonicalized["duplicate initializers merged"] += merged
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = template.ir_version
    model.producer_name = "epifuse"
    model.doc_string = template.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    try:
        model = shape_inference.infer_shapes(model, strict_mode=False)
        onnx.checker.check_model(model)
    except Exception as e:
        raise EpifuseError(f"internal error: the optimized model does not check: {str(e).splitlines()[0]}") from None
    return model
