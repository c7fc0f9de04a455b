"""Verification: the original model and the optimized one on ONNX Runtime, same inputs,
relative L2 error per output against a bound chosen by the optimized model's precision, or twice the
error ONNX Runtime's own graph optimizations make on the original, where that is larger: a deep model
whose outputs sit in a sigmoid's tail (PaddleOCR's text detector on random inputs) moves by 1e-3 and
more when ORT merely refolds its BatchNorms, and a bound below that would flag ORT itself. For fp16
and bf16, likewise twice the error of the original converted to that precision alone (`baseline`,
pipeline.unfused_model): that detector moves by 6e-2 in fp16 with nothing fused, which is the
precision's error, not the optimizer's."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from .errors import EpifuseError

TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
SYMBOLIC_BATCH, SYMBOLIC_OTHER = 2, 32
MAX_RANDOM_ELEMENTS = 1 << 28
_ORT_ERRORS = tuple(c for c in vars(ort.capi.onnxruntime_pybind11_state).values()
                    if isinstance(c, type) and issubclass(c, Exception)) + (RuntimeError, ValueError, MemoryError)
_NUMPY = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
          onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
          onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}


def random_inputs(model: onnx.ModelProto, seed: int = 0, batch: int = SYMBOLIC_BATCH) -> dict[str, np.ndarray]:
    """Normal random data for every graph input; symbolic dims become `batch` (first) or 32 (others)."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value != -1  # -1: paddle2onnx's dynamic dim
                 else (batch if i == 0 else SYMBOLIC_OTHER) for i, d in enumerate(tt.shape.dim)]
        if any(d < 0 for d in shape) or np.prod(shape, dtype=np.float64) > MAX_RANDOM_ELEMENTS:
            raise EpifuseError(f"input '{vi.name}': shape {shape} is too large or invalid for random inputs; "
                               "pass --inputs FILE.npz")
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


def _session(model: onnx.ModelProto | str, reference: bool, ort_optimized: bool = False) -> ort.InferenceSession:
    if reference or ort_optimized:
        so = ort.SessionOptions()
        if reference:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    else:
        from .runtime import session_options  # noqa: PLC0415 (needs the native library)
        so = session_options()
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """Relative L2 error over the finite values; NaN and ±Inf must sit at the same places with the
    same values (a model with NaN/Inf weights gives them on both sides), else the error is inf."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(e)
    if not np.array_equal(np.isnan(a), np.isnan(e)) or not np.array_equal(a[np.isinf(e)], e[np.isinf(e)]) \
            or not np.isfinite(a[finite]).all():
        return float("inf")
    a, e = a[finite], e[finite]
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def _outputs(session, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def _run_baseline(baseline: onnx.ModelProto | str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The baseline's outputs, or none where the CPU EP cannot run it (bf16 converted for the CUDA EP
    has ops without CPU kernels): the bound is then the precision's and ORT's own, as without one."""
    try:
        return _outputs(_session(baseline, reference=False), inputs)
    except _ORT_ERRORS:
        return {}


def verify(original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, *, precision: str = "fp32",
           inputs: dict[str, np.ndarray] | None = None, seed: int = 0,
           baseline: onnx.ModelProto | str | None = None) -> dict:
    """Runs both on the ORT CPU EP; the original with ORT's own graph optimizations off, so the
    reference does not share a fusion bug with anyone. `baseline`: the original in the optimized
    model's precision with nothing else changed, whose error also sets the bound where ORT's CPU EP
    can run it."""
    if inputs is None:
        inputs = random_inputs(original if isinstance(original, onnx.ModelProto)
                               else onnx.load(original, load_external_data=False))
    # ORT's own errors (a model it rejects, an allocation that fails) become one clear line
    which = "the original model"
    try:
        expected = _outputs(_session(original, reference=True), inputs)
        ort_own = _outputs(_session(original, reference=False, ort_optimized=True), inputs)
        precision_own = _run_baseline(baseline, inputs) if baseline is not None else {}
        which = "the optimized model"
        actual = _outputs(_session(optimized, reference=False), inputs)
    except _ORT_ERRORS as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        kernel_missing = "NOT_IMPLEMENTED" in first or "Could not find an implementation" in first
        hint = ("; its CPU EP has no bfloat16 kernels for most ops, so a bf16 model made for the CUDA EP is "
                "checked on the GPU (`epifuse compare`) or as its fp16 build" if precision == "bf16" and kernel_missing
                else "")
        raise EpifuseError(f"ONNX Runtime cannot run {which}: {first[:300]}{hint}",
                           path=original if which == "the original model" and isinstance(original, str)
                           else optimized if isinstance(optimized, str) else None) from None
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise EpifuseError(f"optimized model lacks outputs {missing}")
    errors, ort_errors, precision_errors = {}, {}, {}
    for name, e in expected.items():
        a = actual[name]
        if a.shape != e.shape:
            raise EpifuseError(f"output '{name}': shape {a.shape} differs from the original's {e.shape}")
        floating = np.issubdtype(e.dtype, np.floating)
        errors[name] = rel_l2(a, e) if floating else float(np.any(a != e))
        ort_errors[name] = rel_l2(ort_own[name], e) if floating else 0.0
        if name in precision_own:
            precision_errors[name] = rel_l2(precision_own[name], e) if floating else 0.0
    tol = TOLERANCE[precision]
    # per output; a NaN or inf reference error (an overflow of its own) does not widen the bound
    floors = [{k: v for k, v in own.items() if np.isfinite(v)} for own in (ort_errors, precision_errors)]
    bounds = {k: max([tol] + [2 * f[k] for f in floors if k in f]) for k in errors}
    worst = max(errors.values(), default=0.0)
    passed = all(errors[k] <= bounds[k] for k in errors)
    result = {"provider": "CPUExecutionProvider", "passed": bool(passed), "worst_rel_l2": worst,
              "tolerance": max(bounds.values(), default=tol), "ort_own_rel_l2": ort_errors, "bounds": bounds,
              "outputs": len(errors), "rel_l2": errors}
    if precision_errors:
        result["precision_own_rel_l2"] = precision_errors
    if not passed and precision == "fp16" and any(_lost_finiteness(actual[k], expected[k]) for k in errors):
        why = fp16_overflow(original, inputs)
        if why:
            result["diagnosis"] = why
    return result


def _lost_finiteness(actual: np.ndarray, expected: np.ndarray) -> bool:
    return np.issubdtype(expected.dtype, np.floating) and bool(np.any(~np.isfinite(actual) & np.isfinite(expected)))


FP16_MAX = float(np.finfo(np.float16).max)


def fp16_overflow(original: onnx.ModelProto | str, inputs: dict[str, np.ndarray]) -> str | None:
    """Where the original, run in fp32 on `inputs`, first holds a value beyond fp16's range (the first such
    node output in graph order), said as a sentence; None where none does or it cannot be run so. For a
    failed fp16 check whose outputs turned inf: the model itself, not a fusion, is then at fault."""
    try:
        model = onnx.load(original) if isinstance(original, str) else original
        probe = onnx.shape_inference.infer_shapes(model)  # a copy: its outputs are extended below
        floats = {vi.name for vi in list(probe.graph.value_info) + list(probe.graph.output)
                  if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
        known = {o.name for o in probe.graph.output}
        order = [(out, node) for node in probe.graph.node for out in node.output if out in floats]
        probe.graph.output.extend(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)
                                  for out, _ in order if out not in known)
        session = _session(probe, reference=True)
        values = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    except (*_ORT_ERRORS, OSError, onnx.onnx_cpp2py_export.shape_inference.InferenceError):
        return None
    for out, node in order:
        v = values.get(out)
        if v is None or v.size == 0:
            continue
        peak = float(np.max(np.abs(v[np.isfinite(v)]), initial=0.0))
        if peak > FP16_MAX:
            return (f"the original itself reaches {peak:.3g} at '{out}' (output of {node.op_type} node "
                    f"'{node.name or '?'}') on these inputs, beyond fp16's largest value {FP16_MAX:.0f}: in fp16 "
                    "this model overflows there with or without fusion; use --precision fp32 or bf16")
    return None
