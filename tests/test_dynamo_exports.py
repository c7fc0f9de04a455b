"""One model per zoo family as the current `torch.onnx.export(..., dynamo=True)` writes it, at its default
opset, with a symbolic batch (tests/data/dynamo/, written by tests/data/export_dynamo_graphs.py: the
exporter's graphs, without their large weights). The weights are drawn here, by the role each plays,
then the model is optimized with every candidate fused and compared with ONNX Runtime on the original."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from optimizer.cli import main

GRAPHS = sorted((Path(__file__).resolve().parent / "data" / "dynamo").glob("*.onnx"))


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Fills the left-out initializers: He-scaled filters and matrices, BatchNorm statistics and norm
    scales near 1, small biases; a graph input of an initializer keeps it overridable as exported."""
    rng = np.random.default_rng(seed)
    role = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            role.setdefault(name, (node.op_type, i))
    for t in model.graph.initializer:
        if t.doc_string != "epifuse: random":
            continue
        shape, dtype = tuple(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        op, index = role.get(t.name, ("", 0))
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:])) if op == "Conv" else shape[0]
            values = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif (op == "BatchNormalization" and index in (1, 4)) or (op == "LayerNormalization" and index == 1):
            values = rng.uniform(0.5, 1.5, shape)
        else:
            values = rng.normal(0.0, 0.1, shape)
        t.CopyFrom(numpy_helper.from_array(values.astype(dtype), t.name))
    return model


def test_every_zoo_family_has_a_dynamo_export():
    assert {p.stem for p in GRAPHS} >= {"resnet", "mobilenetv3", "efficientnet", "convnext", "ppocr_lcnet", "yolo"}


@pytest.mark.parametrize("graph", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_dynamo_export_optimizes_and_matches_onnx_runtime(graph, tmp_path, capsys):
    model = with_random_weights(onnx.load(graph))
    assert any(o.domain in ("", "ai.onnx") and o.version >= 18 for o in model.opset_import)
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always", "--verify"]) == 0, capsys.readouterr()
    fused = [n for n in onnx.load(out).graph.node if n.op_type == "FusedConv"]
    assert fused, "no conv of the export was fused"
