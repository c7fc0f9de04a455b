"""Verification: the original model and the optimized one on ONNX Runtime, same inputs,
relative L2 error per output against a bound chosen by the optimized model's precision."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from .errors import EpifuseError

TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
SYMBOLIC_BATCH, SYMBOLIC_OTHER = 2, 32
_NUMPY = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
          onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
          onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Normal random data for every graph input; symbolic dims become 2 (first) or 32 (others)."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (SYMBOLIC_BATCH if i == 0 else SYMBOLIC_OTHER)
                 for i, d in enumerate(tt.shape.dim)]
        dtype = _NUMPY.get(tt.elem_type)
        if dtype is None:
            raise EpifuseError(f"input '{vi.name}': no random generator for element type {tt.elem_type}; "
                               "pass --inputs FILE.npz")
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[vi.name] = rng.random(shape) > 0.5
        else:
            feeds[vi.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _session(model: onnx.ModelProto | str, reference: bool) -> ort.InferenceSession:
    if reference:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    else:
        from .runtime import session_options  # noqa: PLC0415 (needs the native library)
        so = session_options()
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def verify(original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, *, precision: str = "fp32",
           inputs: dict[str, np.ndarray] | None = None, seed: int = 0) -> dict:
    """Runs both on the ORT CPU EP; the original with ORT's own graph optimizations off, so the
    reference does not share a fusion bug with anyone."""
    ref = _session(original, reference=True)
    opt = _session(optimized, reference=False)
    if inputs is None:
        inputs = random_inputs(original if isinstance(original, onnx.ModelProto) else onnx.load(original))
    expected = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, inputs)))
    actual = dict(zip([o.name for o in opt.get_outputs()], opt.run(None, inputs)))
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise EpifuseError(f"optimized model lacks outputs {missing}")
    errors = {}
    for name, e in expected.items():
        a = actual[name]
        if a.shape != e.shape:
            raise EpifuseError(f"output '{name}': shape {a.shape} differs from the original's {e.shape}")
        errors[name] = rel_l2(a, e) if np.issubdtype(e.dtype, np.floating) else float(np.any(a != e))
    worst = max(errors.values(), default=0.0)
    tol = TOLERANCE[precision]
    return {"provider": "CPUExecutionProvider", "passed": bool(worst <= tol), "worst_rel_l2": worst,
            "tolerance": tol, "outputs": len(errors), "rel_l2": errors}
