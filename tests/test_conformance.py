"""Conformance: the ONNX backend node tests (generated in memory from the `onnx` package's
`onnx.backend.test.case.node`, which is what writes `data/node/*`; the wheel installed here does
not ship that folder) for the operators epifuse fuses or moves transposes through. Every case ONNX
Runtime passes on the original must pass on the optimized model with the case's own tolerance
(rtol 1e-3 / atol 1e-7 as onnx's backend runner), or be refused with an EpifuseError.

Each case also runs in two derived forms: `[const]` (every input but the first made an
initializer, so conv/BN weights are constants and the fusion passes have something to do) and
`[opset21]` (a model importing opset > 21, re-declared at 21 where onnx.checker accepts that, so
the ops still run through the passes instead of only hitting the opset refusal).

`python tests/test_conformance.py` prints the summary used in docs/robustness.md."""
from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from optimizer.errors import EpifuseError
from optimizer.passes.load import max_opset, validate
from optimizer.pipeline import optimize_model

OPS = frozenset("""Conv ConvTranspose BatchNormalization Gemm MatMul Relu LeakyRelu Elu Softplus Sigmoid Tanh
HardSigmoid HardSwish Clip Mish Gelu Erf PRelu Add Mul Sub Div Concat Split Slice Pad Resize MaxPool AveragePool
GlobalAveragePool GlobalMaxPool ReduceMean Transpose Flatten Reshape Squeeze Unsqueeze""".split())


def _variants(case):
    inputs, outputs = case.data_sets[0]
    forms = [(case.name, case.model, list(inputs))]
    graph_inputs = list(case.model.graph.input)
    if len(graph_inputs) > 1 and all(isinstance(v, np.ndarray) for v in inputs[1:]):
        const = onnx.ModelProto()
        const.CopyFrom(case.model)
        del const.graph.input[1:]
        const.graph.initializer.extend(numpy_helper.from_array(v, vi.name)
                                       for vi, v in zip(graph_inputs[1:], inputs[1:]))
        forms.append((case.name + "[const]", const, list(inputs[:1])))
    for name, model, feeds in list(forms):
        opset = model.opset_import[0] if len(model.opset_import) == 1 else None
        if opset is None or opset.domain not in ("", "ai.onnx") or opset.version <= max_opset():
            continue
        lowered = onnx.ModelProto()
        lowered.CopyFrom(model)
        lowered.opset_import[0].version = max_opset()
        lowered.ir_version = min(lowered.ir_version, 10)
        try:
            onnx.checker.check_model(lowered, full_check=True)
        except Exception:  # the op changed at a later opset: only the original form is tried
            continue
        forms.append((name + "[opset21]", lowered, feeds))
    for name, model, feeds in forms:
        yield name, model, feeds, list(outputs), case.rtol, case.atol


def _collect():
    from onnx.backend.test.case import node  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    # a case is selected by the op it tests: its node's op, or for an `_expanded` case (the op's
    # function body) the op of the case it expands
    op_of = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    selected = [c for c in cases if op_of.get(c.name.split("_expanded")[0]) in OPS]
    return {v[0]: v for c in selected for v in _variants(c)}


CASES = _collect()
SUMMARY: dict[str, collections.Counter] = {k: collections.Counter() for k in
                                           ("tried", "verified", "fused", "refused", "ort_fails_original")}


def _run(model: onnx.ModelProto, feeds: list, library: bool) -> list:
    if library:
        from optimizer.runtime import session_options  # noqa: PLC0415

        so = session_options()
    else:
        so = ort.SessionOptions()
    # ORT's own graph optimizations stay off on both sides: its constant folding rejects some
    # of these models by itself (test_affine_grid_*_expanded with constant size), which is not
    # what this test is about
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: v for i, v in zip(sess.get_inputs(), feeds)})


def _close(got, expected, rtol, atol) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)


_OUTCOMES: dict[str, str] = {}


def check_case(name: str) -> str:
    """'verified fused=N', 'refused: …' or 'ort_fails_original: …'; raises when the optimized
    model differs."""
    if name not in _OUTCOMES:
        _OUTCOMES[name] = _check(name)
    return _OUTCOMES[name]


def _check(name: str) -> str:
    _, model, feeds, outputs, rtol, atol = CASES[name]
    try:
        _close(_run(model, feeds, library=False), outputs, rtol, atol)
    except Exception as e:  # noqa: BLE001  (ORT's own failure on the unmodified model)
        return f"ort_fails_original: {str(e).splitlines()[0][:120]}"
    work = onnx.ModelProto()
    work.CopyFrom(model)
    try:
        optimized, report = optimize_model(validate(work, name))
    except EpifuseError as e:
        return f"refused: {e}"
    _close(_run(optimized, feeds, library=True), outputs, rtol, atol)
    fused = sum(n.op_type == "FusedConv" for n in optimized.graph.node)
    return f"verified fused={fused}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case(name):
    outcome = check_case(name)
    assert outcome.startswith(("verified", "refused: ", "ort_fails_original: ")), outcome
    if outcome.startswith("refused: "):
        assert name in outcome  # the message names the model


def test_conformance_covers_fusion():
    """The `[const]` forms put conv weights in initializers: some must actually fuse."""
    outcomes = {n: check_case(n) for n in CASES if n.startswith("test_conv") and "[const]" in n}
    fused = [n for n, o in outcomes.items() if o.startswith("verified") and "fused=0" not in o]
    assert len(fused) >= 3, fused


def summary() -> dict:
    counts, reasons, fused = collections.Counter(), collections.Counter(), 0
    for name in sorted(CASES):
        outcome = check_case(name)
        kind = outcome.split(":")[0].split(" ")[0]
        counts[kind] += 1
        if kind == "verified":
            fused += int(outcome.split("fused=")[1]) > 0
        elif kind == "refused":
            reason = outcome.split(": ", 2)[-1]
            reasons["unsupported opset > 21" if "unsupported opset" in reason else reason[:100]] += 1
    return {"tried": len(CASES), **counts, "verified_with_fusedconv": fused, "refusal_reasons": dict(reasons)}


if __name__ == "__main__":
    import json

    print(json.dumps(summary(), indent=2))
