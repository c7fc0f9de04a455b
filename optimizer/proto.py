"""ModelProto helpers that never copy the weights as a whole: onnx.checker and shape inference
serialise the entire model, and a 100 MB model copied a few times is what made the optimizer
slow and memory-hungry. They run on a structure-only copy here, and saving streams tensor by
tensor."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

SMALL_TENSOR_BYTES = 1024  # shape-like constants stay, so shape inference can still read them
_MODEL_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")


def tensor_nbytes(t: onnx.TensorProto) -> int:
    """Size of a tensor's values from its type and dims (placeholders carry no data)."""
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 8
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def skeleton(model: onnx.ModelProto, keep_small: bool = True, weights_as_inputs: bool = True) -> onnx.ModelProto:
    """A copy of `model` without its large initializers. With `weights_as_inputs`, each dropped
    initializer becomes a graph input of the same type and shape, so the copy still checks."""
    light = onnx.ModelProto()
    for name in _MODEL_FIELDS:
        if model.HasField(name):
            setattr(light, name, getattr(model, name))
    light.opset_import.extend(model.opset_import)
    light.metadata_props.extend(model.metadata_props)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name, dst.doc_string = src.name, src.doc_string
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    dst.sparse_initializer.extend(src.sparse_initializer)
    inputs = {i.name for i in src.input}
    for t in src.initializer:
        if keep_small and tensor_nbytes(t) <= SMALL_TENSOR_BYTES and t.data_location != onnx.TensorProto.EXTERNAL:
            dst.initializer.append(t)
        elif weights_as_inputs and t.name not in inputs:
            dst.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def check_and_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker and shape inference on the structure; the inferred types and shapes are
    written back into `model`, which is returned. Raises what the checker raises."""
    light = skeleton(model)
    try:
        light = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception:
        pass  # the checker names the problem
    onnx.checker.check_model(light)
    del model.graph.value_info[:]
    model.graph.value_info.extend(light.graph.value_info)
    for out, inferred in zip(model.graph.output, light.graph.output):
        out.CopyFrom(inferred)
    return model


@dataclass
class SplitModel:
    """A finished model kept as its structure plus the weights as numpy arrays, so that it can be
    checked and written without ever holding a protobuf copy of the weights. In `structure` the
    weights are graph inputs of their type and shape (what `skeleton` makes)."""

    structure: onnx.ModelProto
    weights: dict[str, np.ndarray]
    inputs_with_defaults: set[str] = field(default_factory=set)  # weights that stay graph inputs

    def tensors(self):
        """The weights as TensorProtos, one at a time, in initializer order."""
        for name, values in self.weights.items():
            yield numpy_helper.from_array(values, name)

    def header(self) -> onnx.ModelProto:
        """The structure with the weight inputs removed: the model minus its large initializers."""
        head = onnx.ModelProto()
        head.CopyFrom(self.structure)
        inputs = [i for i in head.graph.input if i.name not in self.weights or i.name in self.inputs_with_defaults]
        del head.graph.input[:]
        head.graph.input.extend(inputs)
        return head

    def to_model(self) -> onnx.ModelProto:
        model = self.header()
        model.graph.initializer.extend(self.tensors())
        return model


# ----------------------------------------------------------------------------------- reading
# A model file is a ModelProto; its weights are GraphProto.initializer entries (field 5) inside
# ModelProto.graph (field 7). Reading them one at a time from the file, instead of parsing the
# whole file, keeps one copy of the weights in memory (as numpy arrays) instead of three (file
# bytes, protobuf, arrays).
_GRAPH_FIELD, _INITIALIZER_FIELD = 7, 5
_RAW_DATA_FIELD = 9  # TensorProto.raw_data
_LENGTH_DELIMITED = 2


def _varint(f) -> int | None:
    shift = result = 0
    while True:
        b = f.read(1)
        if not b:
            return None if shift == 0 else -1
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            return -1


def _fields(f, end: int):
    """(field number, wire type, value start, value length or varint value) for each field in
    f's bytes [tell, end); only scalar and length-delimited wire types occur in ONNX files."""
    while f.tell() < end:
        key = _varint(f)
        if key is None or key < 0:
            raise ValueError("truncated or corrupt protobuf")
        field, wire = key >> 3, key & 7
        start = f.tell()
        if wire == 0:
            value = _varint(f)
            if value is None or value < 0:
                raise ValueError("truncated or corrupt protobuf")
            yield field, wire, start, f.tell() - start
        elif wire == 1:
            f.seek(8, 1)
            yield field, wire, start, 8
        elif wire == 5:
            f.seek(4, 1)
            yield field, wire, start, 4
        elif wire == _LENGTH_DELIMITED:
            length = _varint(f)
            if length is None or length < 0:
                raise ValueError("truncated or corrupt protobuf")
            start = f.tell()
            if start + length > end:
                raise ValueError("truncated or corrupt protobuf")
            yield field, wire, start, length
            f.seek(start + length)
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        if f.tell() > end:
            raise ValueError("truncated or corrupt protobuf")


def encode_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


_DIRECT_DTYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
                  onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
                  onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8}


def _read_raw_tensor(f, start: int, length: int) -> tuple[onnx.TensorProto, np.ndarray] | None:
    """An initializer whose values are raw little-endian data of a plain numpy dtype, read with its
    array going straight from the file (no bytes object, no parsed message holding them): the
    placeholder (name, type, dims) and the array. None for any other layout (the caller parses it)."""
    head = bytearray()
    raw = None
    for number, wire, value_start, value_length in _fields(f, start + length):
        if number == _RAW_DATA_FIELD and wire == _LENGTH_DELIMITED:
            raw = (value_start, value_length)
            continue
        pos = f.tell()
        f.seek(value_start)
        head += encode_varint(number << 3 | wire) + (encode_varint(value_length) if wire == _LENGTH_DELIMITED
                                                    else b"") + f.read(value_length)
        f.seek(pos)
    placeholder = onnx.TensorProto()
    placeholder.ParseFromString(bytes(head))
    dtype = _DIRECT_DTYPES.get(placeholder.data_type)
    count = int(np.prod(placeholder.dims, dtype=np.int64))
    if (raw is None or dtype is None or placeholder.data_location == onnx.TensorProto.EXTERNAL or
            placeholder.segment.ByteSize() or raw[1] != count * np.dtype(dtype).itemsize or
            raw[1] <= SMALL_TENSOR_BYTES or sys.byteorder != "little"):
        return None
    f.seek(raw[0])
    values = np.fromfile(f, dtype=dtype, count=count).reshape(tuple(placeholder.dims))
    if values.size != count:
        raise ValueError("truncated or corrupt protobuf")
    light = onnx.TensorProto(name=placeholder.name, data_type=placeholder.data_type, doc_string=placeholder.doc_string)
    light.dims.extend(placeholder.dims)
    return light, values


def read_model(path: str, load_tensor) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Parses `path` with every initializer larger than SMALL_TENSOR_BYTES replaced by a
    placeholder (name, type and dims, no data); returns it and those initializers' values, read
    one at a time through `load_tensor(TensorProto) -> np.ndarray`."""
    size = os.path.getsize(path)
    head, graph_bytes, weights = bytearray(), bytearray(), {}
    placeholders = []
    with open(path, "rb") as f:
        for field, wire, start, length in _fields(f, size):
            end = start + length if wire == _LENGTH_DELIMITED else start + length
            if field != _GRAPH_FIELD or wire != _LENGTH_DELIMITED:
                f.seek(start)
                key_and_value = encode_varint(field << 3 | wire)
                key_and_value += (encode_varint(length) if wire == _LENGTH_DELIMITED else b"") + f.read(length)
                head += key_and_value
                f.seek(end)
                continue
            for g_field, g_wire, g_start, g_length in _fields(f, end):
                after = f.tell()
                if g_field == _INITIALIZER_FIELD and g_wire == _LENGTH_DELIMITED and g_length > SMALL_TENSOR_BYTES:
                    direct = _read_raw_tensor(f, g_start, g_length)
                    if direct is not None:  # the array straight from the file: one copy, no protobuf
                        tensor, weights[direct[0].name] = direct
                        placeholders.append(tensor)
                        f.seek(after)
                        continue
                f.seek(g_start)
                data = f.read(g_length)
                tensor = None
                if g_field == _INITIALIZER_FIELD and g_wire == _LENGTH_DELIMITED and g_length > SMALL_TENSOR_BYTES:
                    tensor = onnx.TensorProto()
                    tensor.ParseFromString(data)
                    if tensor_nbytes(tensor) <= SMALL_TENSOR_BYTES or tensor.data_location == onnx.TensorProto.EXTERNAL:
                        tensor = None  # stays in the graph as it is, like every small tensor
                if tensor is not None:
                    del data
                    weights[tensor.name] = load_tensor(tensor)
                    # a new message: a cleared field would keep its bytes in the parsed one's arena
                    placeholder = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type,
                                                   doc_string=tensor.doc_string)
                    placeholder.dims.extend(tensor.dims)
                    placeholders.append(placeholder)
                    del tensor
                else:
                    key = encode_varint(g_field << 3 | g_wire)
                    graph_bytes += key + (encode_varint(g_length) if g_wire == _LENGTH_DELIMITED else b"") + data
                f.seek(after)
            f.seek(end)
    model = onnx.ModelProto()
    model.ParseFromString(bytes(head))
    graph = onnx.GraphProto()
    graph.ParseFromString(bytes(graph_bytes))
    graph.initializer.extend(placeholders)
    model.graph.MergeFrom(graph)
    return model, weights

