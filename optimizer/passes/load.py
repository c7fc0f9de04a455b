"""Load and validate: read the file, check external data stays inside the model's folder, bring
opsets below 11 up by ONNX's version converter, refuse opsets this tool does not know, check the
model and run shape inference so later passes can see tensor shapes."""
from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError
import numpy as np
from onnx import external_data_helper, numpy_helper, version_converter

from ..errors import EpifuseError
from ..proto import check_and_infer, read_model

MIN_OPSET, MAX_OPSET = 11, 21
CONVERT_TO_OPSET = 13


def default_opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return None


def _check_external_data(model: onnx.ModelProto, path: str) -> None:
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


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise EpifuseError("no such file", path=path)
    if not os.path.isfile(path):
        raise EpifuseError("not a file", path=path)


def load_model_split(path: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The validated model with its large initializers as placeholders, and their values as
    arrays: read tensor by tensor, so memory holds one copy of the weights."""
    _check_file(path)
    try:
        model, weights = read_model(path, lambda t: np.array(numpy_helper.to_array(t)))
    except (DecodeError, RuntimeError, ValueError) as e:
        raise EpifuseError(f"not an ONNX model (protobuf parse failed: {e})", path=path) from None
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise EpifuseError("not an ONNX model (no graph or no nodes)", path=path)
    _check_external_data(model, path)
    external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    if (default_opset(model) or MIN_OPSET) < MIN_OPSET:  # the version converter needs real initializers
        fill_placeholders(model, weights)
        return validate(model, path), {}
    return validate(model, path), weights


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
    if version > MAX_OPSET:
        raise EpifuseError(f"unsupported opset {version} (epifuse supports ai.onnx opsets "
                           f"{MIN_OPSET} to {MAX_OPSET})", path=path)
    if version < MIN_OPSET:
        try:
            model = version_converter.convert_version(model, CONVERT_TO_OPSET)
        except Exception as e:  # the converter raises bare RuntimeErrors with C++ messages
            raise EpifuseError(f"opset {version} could not be converted to {CONVERT_TO_OPSET}: "
                               f"{str(e).splitlines()[0]}", path=path) from None
    try:
        # shape inference first, inside check_and_infer, so that graph outputs written without a
        # shape (ONNX Runtime accepts them) get one before the checker asks for it
        return check_and_infer(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise EpifuseError(f"invalid ONNX model: {first}", path=path) from None
