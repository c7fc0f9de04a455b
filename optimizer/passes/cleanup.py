"""Cleanup: drop dead nodes and initializers, merge duplicate initializers, order nodes
topologically, export, run shape inference and onnx.checker on the result, and ONNX's strict type
and shape inference (the checker's full check) wherever the input model passes it. The weights stay
numpy arrays beside the exported structure (a SplitModel), so the check never serialises them
and saving can stream them."""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import EpifuseError
from ..graph import replace_uses
from ..proto import SMALL_TENSOR_BYTES, SplitModel, check_and_infer
from ..report import Report


def merge_duplicate_initializers(graph: gs.Graph) -> int:
    seen: dict[tuple, gs.Constant] = {}
    merged = 0
    for t in list(graph.tensors().values()):
        if not isinstance(t, gs.Constant) or t in graph.inputs:
            continue
        v = t.values
        key = (str(v.dtype), v.shape, hashlib.sha1(np.ascontiguousarray(v).reshape(-1).view(np.uint8)).hexdigest())
        first = seen.setdefault(key, t)
        if first is not t:
            replace_uses(graph, t, first)
            merged += 1
    return merged


def _weights_to_inputs(graph: gs.Graph) -> dict[str, np.ndarray]:
    """Replaces every large constant by a graph input of its name, type and shape."""
    weights = {}
    for t in list(graph.tensors().values()):
        if isinstance(t, gs.Constant) and t.values.nbytes > SMALL_TENSOR_BYTES:
            weights[t.name] = t.values
            stand_in = gs.Variable(t.name, dtype=t.values.dtype, shape=list(t.values.shape))
            replace_uses(graph, t, stand_in)
            graph.inputs.append(stand_in)
    return weights


def _strict_inference_error(model: onnx.ModelProto) -> str | None:
    """The first line of what ONNX's strict type and shape inference refuses in `model`, or None."""
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # noqa: BLE001 (onnx raises several types for the same kind of refusal)
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def cleanup(graph: gs.Graph, report: Report, template: onnx.ModelProto, defaults: dict[str, np.ndarray] | None = None,
            input_structure: onnx.ModelProto | None = None) -> SplitModel:
    """The finished model; `template` (the input model's skeleton) supplies what gs does not
    carry: IR version, doc string, metadata. `defaults`: graph inputs that keep an initializer
    (overridable initializers), by name. `input_structure`: the input model as `skeleton` makes it
    (small constants kept, weights as typed inputs, as the output's structure is here), for the strict
    check; without it, that check is skipped."""
    graph.cleanup(remove_unused_graph_inputs=False)
    merged = merge_duplicate_initializers(graph)
    if merged:
        report.canonicalized["duplicate initializers merged"] += merged
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    weights = _weights_to_inputs(graph)
    structure = gs.export_onnx(graph)
    structure.ir_version = max(template.ir_version, 4)  # IR 3 would need new weights listed as graph inputs
    structure.producer_name = "epifuse"
    structure.doc_string = template.doc_string
    del structure.metadata_props[:]
    structure.metadata_props.extend(template.metadata_props)
    try:
        check_and_infer(structure)
    except Exception as e:
        raise EpifuseError(f"internal error: the optimized model does not check: {str(e).splitlines()[0]}") from None
    # The checker above does not check operand types against the schemas (a bf16 MaxPool at opset 17
    # passes it, and no runtime loads it): the strict inference does, and what it refuses in our output
    # but not in the input is ours to fix, never a model to write.
    refused = _strict_inference_error(structure) if input_structure is not None else None
    if refused and not _strict_inference_error(input_structure):
        raise EpifuseError(f"internal error: the optimized model fails ONNX's strict type and shape inference, which "
                           f"the input model passes: {refused}")
    used = {i.name for i in structure.graph.input}
    defaults = {k: v for k, v in (defaults or {}).items() if k in used}
    weights.update(defaults)
    return SplitModel(structure, weights, set(defaults))
