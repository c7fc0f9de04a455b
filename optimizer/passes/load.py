"""Load and validate: read the file, check external data stays inside the model's folder, bring
opsets below 11 up by ONNX's version converter, refuse opsets that the installed onnx or onnxruntime
does not know, check the model and run shape inference so later passes can see tensor shapes."""
from __future__ import annotations

import functools
import os

import onnx
from google.protobuf.message import DecodeError
import numpy as np
from onnx import external_data_helper, numpy_helper, version_converter

from ..errors import EpifuseError
from ..proto import SMALL_TENSOR_BYTES, check_and_infer, read_model, skeleton, tensor_nbytes

MIN_OPSET = 11
CONVERT_TO_OPSET = 13


@functools.lru_cache(maxsize=1)
def max_opset() -> int:
    """The newest ai.onnx opset both the installed onnx (its checker and shape inference) and
    onnxruntime (what verifies and runs the result) support: onnxruntime is asked with a one-node model."""
    import onnxruntime as ort

    newest = onnx.defs.onnx_opset_version()
    for version in range(newest, 20, -1):
        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                                       [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)])
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # noqa: BLE001 (ORT refuses an opset newer than it knows)
            continue
    return 21


def default_opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return None


def _check_external_data(model: onnx.ModelProto, path: str) -> set[str]:
    """Checks every external data reference; returns the files referenced."""
    files = set()
    base = os.path.dirname(os.path.abspath(path))
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        location = info.location
        resolved = os.path.realpath(os.path.join(base, location))
        if os.path.isabs(location) or os.path.commonpath([resolved, os.path.realpath(base)]) != os.path.realpath(base):
            raise EpifuseError(f"initializer '{tensor.name}': external data location '{location}' is outside "
                               "the model's folder", path=path)
        if not os.path.isfile(resolved):
            raise EpifuseError(f"initializer '{tensor.name}': external data file '{location}' not found", path=path)
        files.add(resolved)
        offset, length, size = info.offset or 0, info.length, os.path.getsize(resolved)
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            raise EpifuseError(f"initializer '{tensor.name}': external data of unsupported element type "
                               f"{tensor.data_type}", path=path) from None
        count = int(np.prod([max(int(d), 0) for d in tensor.dims], dtype=np.float64))
        needed = count * itemsize if length is None or length <= 0 else length
        if offset < 0 or offset + needed > size:
            raise EpifuseError(f"initializer '{tensor.name}': external data file '{location}' holds {size} bytes, "
                               f"fewer than offset {offset} + length {needed}", path=path)
        if length is not None and length > 0 and length != count * itemsize:
            raise EpifuseError(f"initializer '{tensor.name}': external data length {length} does not match its "
                               f"shape {list(tensor.dims)} ({count * itemsize} bytes)", path=path)
    return files


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise EpifuseError("no such file", path=path)
    if not os.path.isfile(path):
        raise EpifuseError("not a file", path=path)


def load_model_split(path: str, referenced: set[str] | None = None) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The validated model with its large initializers as placeholders, and their values as
    arrays: read tensor by tensor, so memory holds one copy of the weights. The external data
    files the model references are added to `referenced`."""
    _check_file(path)
    try:
        model, weights = read_model(path, lambda t: np.array(numpy_helper.to_array(t)))
    except (DecodeError, RuntimeError, ValueError) as e:
        raise EpifuseError(f"not an ONNX model (protobuf parse failed: {e})", path=path) from None
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise EpifuseError("not an ONNX model (no graph or no nodes)", path=path)
    files = _check_external_data(model, path)
    if referenced is not None:
        referenced.update(files)
    try:
        _external_to_arrays(model, os.path.dirname(os.path.abspath(path)), weights)
        external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except (OSError, ValueError) as e:
        raise EpifuseError(f"cannot read external data: {str(e).splitlines()[0]}", path=path) from None
    if (default_opset(model) or MIN_OPSET) < MIN_OPSET:  # the version converter needs real initializers
        fill_placeholders(model, weights)
        return validate(model, path), {}
    return validate(model, path), weights


def _external_to_arrays(model: onnx.ModelProto, base: str, weights: dict[str, np.ndarray]) -> None:
    """Large external-data initializers go straight from their file into arrays (placeholders in
    the graph, like inline weights), so a > 2 GB model is never copied into protobuf memory."""
    for i, t in enumerate(model.graph.initializer):
        if not external_data_helper.uses_external_data(t) or tensor_nbytes(t) <= SMALL_TENSOR_BYTES:
            continue
        info = external_data_helper.ExternalDataInfo(t)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        count = int(np.prod(t.dims, dtype=np.int64))
        with open(os.path.join(base, info.location), "rb") as f:
            f.seek(info.offset or 0)
            weights[t.name] = np.fromfile(f, dtype=dtype, count=count).reshape(tuple(t.dims))
        placeholder = onnx.TensorProto(name=t.name, data_type=t.data_type, doc_string=t.doc_string)
        placeholder.dims.extend(t.dims)
        model.graph.initializer[i].CopyFrom(placeholder)


def fill_placeholders(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    for t in model.graph.initializer:
        if t.name in weights:
            t.CopyFrom(numpy_helper.from_array(weights.pop(t.name), t.name))


def load_model(path: str) -> onnx.ModelProto:
    model, weights = load_model_split(path)
    fill_placeholders(model, weights)
    return model


def validate(model: onnx.ModelProto, path: str = "<model>") -> onnx.ModelProto:
    version = default_opset(model)
    if version is None:
        raise EpifuseError("the model imports no ai.onnx opset", path=path)
    if version > max_opset():
        raise EpifuseError(f"unsupported opset {version} (the installed onnx and onnxruntime support ai.onnx "
                           f"opsets up to {max_opset()}; epifuse converts opsets below {MIN_OPSET})", path=path)
    _check_dims(model, path)
    if version < MIN_OPSET:
        try:
            model = version_converter.convert_version(model, CONVERT_TO_OPSET)
            # IR < 4 wants every initializer listed as a graph input; the converter (and later the
            # passes) add initializers that are not, so the model moves to opset 13's IR version
            model.ir_version = max(model.ir_version, 7)
        except Exception as e:  # the converter raises bare RuntimeErrors with C++ messages
            raise EpifuseError(f"opset {version} could not be converted to {CONVERT_TO_OPSET}: "
                               f"{str(e).splitlines()[0]}", path=path) from None
    try:
        # shape inference first, inside check_and_infer, so that graph outputs written without a
        # shape (ONNX Runtime accepts them) get one before the checker asks for it
        model = check_and_infer(model)
    except onnx.checker.ValidationError as e:
        first = _inference_error(model) or str(e).strip().splitlines()[0]
        raise EpifuseError(f"invalid ONNX model: {first}", path=path) from None
    _check_conv_attributes(model, path)
    _check_value_types(model, path)
    return model


def _check_value_types(model: onnx.ModelProto, path: str) -> None:
    """The passes (onnx-graphsurgeon) carry tensor types only: a sequence, map or optional value
    would come out declared as a tensor, a model ONNX Runtime rejects. Refuse instead."""
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        kind = vi.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise EpifuseError(f"value '{vi.name}' is a {kind.replace('_type', '')}: epifuse handles tensor "
                               "values only", path=path)


def _inference_error(model: onnx.ModelProto) -> str | None:
    """Strict shape inference's first line, when it fails: the checker's own message is then
    often only the consequence ("Field 'shape' of 'type' is required but missing")."""
    try:
        onnx.shape_inference.infer_shapes(skeleton(model), strict_mode=True)
    except Exception as e:  # noqa: BLE001 (InferenceError, or a C++ RuntimeError)
        return str(e).strip().splitlines()[0][:300]
    return None


MAX_DIM = 2**31 - 1


def _check_dims(model: onnx.ModelProto, path: str) -> None:
    """Dims past int32 in graph inputs/outputs, value_info and initializers are corrupt (no real model
    has them) and make later numpy or ORT calls fail badly. A negative dim of a value is how some
    exporters (paddle2onnx) write a dynamic one as -1, and ONNX Runtime runs such models: it becomes
    symbolic. Other negative dims are corrupt."""
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value == -1:
                d.dim_param = f"{vi.name}_dim{i}"  # setting dim_param clears dim_value (a oneof)
            elif d.HasField("dim_value") and not 0 <= d.dim_value <= MAX_DIM:
                raise EpifuseError(f"'{vi.name}' has dimension {d.dim_value} out of range", path=path)
    for t in g.initializer:
        for d in t.dims:
            if not 0 <= d <= MAX_DIM:
                raise EpifuseError(f"initializer '{t.name}' has dimension {d} out of range", path=path)


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
MAX_PAD = 1 << 16


def _check_conv_attributes(model: onnx.ModelProto, path: str) -> None:
    """Conv/ConvTranspose attributes onnx.checker leaves to the runtime: group, strides,
    dilations, pads, auto_pad, kernel_shape, and input channels against the filter's. A model
    breaking them fails in ONNX Runtime; refusing it here keeps a fused op from hiding that."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    init_types = {t.name: t.data_type for t in model.graph.initializer}
    for vi in (*model.graph.input, *model.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        shapes.setdefault(vi.name, [d.dim_value if d.HasField("dim_value") else None for d in dims])
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "ConvTranspose"):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w = shapes.get(node.input[1]) if len(node.input) > 1 else None
        spatial = len(w) - 2 if w else None

        def bad(what: str) -> EpifuseError:
            return EpifuseError(f"{node.op_type} {what}", path=path, node=node.name or node.output[0])

        group = attrs.get("group", 1)
        if not isinstance(group, int) or group < 1:
            raise bad(f"group {group} is not a positive integer")
        for key in ("strides", "dilations"):
            values = attrs.get(key)
            if values is not None and (any(v < 1 for v in values) or (spatial is not None and len(values) != spatial)):
                raise bad(f"{key} {list(attrs[key])} out of range (one value >= 1 per spatial axis)")
        if "pads" in attrs:
            pads = list(attrs["pads"])
            if any(not 0 <= v <= MAX_PAD for v in pads) or (spatial is not None and len(pads) != 2 * spatial):
                raise bad(f"pads {pads} out of range (two values in [0, {MAX_PAD}] per spatial axis)")
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad not in AUTO_PADS:
            raise bad(f"auto_pad '{auto_pad}' is not one of {', '.join(AUTO_PADS)}")
        w_type = init_types.get(node.input[1]) if len(node.input) > 1 else None
        if w_type is not None and w_type not in FLOAT_TYPES:
            raise bad(f"filter '{node.input[1]}' has element type "
                      f"{onnx.TensorProto.DataType.Name(w_type)}, not a floating-point type")
        if w is None or None in w:
            continue
        if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != w[2:]:
            raise bad(f"kernel_shape {list(attrs['kernel_shape'])} differs from the filter's {w[2:]}")
        x = shapes.get(node.input[0])
        c = x[1] if x and len(x) > 1 else None
        if node.op_type == "Conv":
            if w[0] % group:
                raise bad(f"group {group} does not divide the filter's {w[0]} output channels")
            if c is not None and c != w[1] * group:
                raise bad(f"input has {c} channels, the filter expects {w[1]} x group {group} = {w[1] * group}")
        elif c is not None and (c != w[0] or c % group):
            raise bad(f"input has {c} channels, the filter expects {w[0]} (group {group})")
