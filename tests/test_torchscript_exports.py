"""Models whose TorchScript exports (tests/data/torchscript/, written by
tests/data/export_torchscript_graphs.py) compute Reshape and Slice sizes from Shape ops with a symbolic
batch: optimized with every candidate fused for both ONNX Runtime targets, the shape arithmetic gone
where the input shape fixes it, and the outputs those of ONNX Runtime on the original at two batch sizes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from optimizer.cli import main
from tests.test_dynamo_exports import with_random_weights

GRAPHS = sorted((Path(__file__).resolve().parent / "data" / "torchscript").glob("*.onnx"))


@pytest.mark.parametrize("target, precision", [("ort-cpu", "fp32"), ("ort-cuda", "fp16")])
@pytest.mark.parametrize("graph", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_torchscript_export_optimizes_and_matches_onnx_runtime(graph, target, precision, tmp_path, capsys):
    model = with_random_weights(onnx.load(graph))
    shapes_before = sum(n.op_type == "Shape" for n in model.graph.node)
    assert shapes_before > 0
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    size = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    for batch in (1, 3):
        inputs = tmp_path / f"inputs{batch}.npz"
        np.savez(inputs, x=np.random.default_rng(batch).standard_normal((batch, 3, size, size)).astype(np.float32))
        if batch == 1:
            assert main(["optimize", str(src), "-o", str(out), "--target", target, "--precision", precision,
                         "--fuse", "always"]) == 0, capsys.readouterr()
        assert main(["verify", str(src), str(out), "--precision", precision, "--inputs", str(inputs)]) == 0, \
            capsys.readouterr()
    optimized = onnx.load(out)
    assert sum(n.op_type == "Shape" for n in optimized.graph.node) < shapes_before
    if graph.stem == "shufflenet_v2":  # every size but the batch is fixed: no shape arithmetic left
        assert not {"Shape", "Gather", "Unsqueeze"} & {n.op_type for n in optimized.graph.node}
