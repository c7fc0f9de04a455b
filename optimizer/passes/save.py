"""Save atomically: write beside the destination under a temporary name, then rename, so a
reader never sees a half-written model and a failure leaves nothing behind. Never overwrites
the input model. The model is streamed: its skeleton first, then one initializer at a time
(protobuf merges repeated top-level messages, so the concatenation parses as one model), each
written from its numpy array without an intermediate protobuf copy. Models over 2 GB put their weights in
external data next to the file."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import EpifuseError
from ..proto import SplitModel, encode_varint, skeleton, tensor_nbytes

PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_THRESHOLD = 1024
ALIGNMENT = 4096


def same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or (os.path.exists(a) and os.path.exists(b) and
                                                      os.path.samefile(a, b))


def check_output_path(out_path: str, in_path: str | None, referenced: set[str] = frozenset()) -> None:
    """The output (and the external-data file a model over 2 GB writes beside it) may be neither the
    input model nor any file it references (`referenced`: its external data files), and must be a
    regular file or not exist yet."""
    if not out_path:
        raise EpifuseError("the output path is empty")
    if os.path.isdir(out_path):
        raise EpifuseError("is a folder; give the output a file name", path=out_path)
    if os.path.exists(out_path) and not os.path.isfile(out_path):
        raise EpifuseError("exists and is not a regular file (a device or a pipe); choose another file",
                           path=out_path)
    protected = ([in_path] if in_path is not None else []) + sorted(referenced)
    for written in (out_path, out_path + ".data"):
        for kept in protected:
            if same_file(written, kept):
                if written == out_path and kept == in_path:
                    raise EpifuseError("output path is the input model; choose another file", path=out_path)
                what = "the input model" if kept == in_path else f"the input's external data file {kept}"
                raise EpifuseError(f"writing here would overwrite {what}; choose another file", path=out_path)
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise EpifuseError("output folder does not exist", path=out_path)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _key(field: int, wire: int) -> bytes:
    return encode_varint(field << 3 | wire)


def _delimited(field: int, payload_length: int) -> bytes:
    return _key(field, 2) + encode_varint(payload_length)


def _write_initializer(f, name: str, values: np.ndarray, data_file=None, data_name: str = "", offset: int = 0) -> int:
    """Writes ModelProto{graph{initializer{name, dims, data_type, raw_data}}} with the array's
    bytes going straight from numpy to the file (inline or into `data_file`). Returns the new
    offset in `data_file`."""
    if not values.flags.c_contiguous:  # np.ascontiguousarray alone makes a scalar a 1-element vector
        values = np.ascontiguousarray(values)
    raw = values.reshape(-1).view(np.uint8)
    dims = b"".join(encode_varint(int(d)) for d in values.shape)
    head = (_delimited(1, len(dims)) + dims if values.ndim else b"") + _key(2, 0) + encode_varint(
        helper.np_dtype_to_tensor_dtype(values.dtype)) + _delimited(8, len(name.encode())) + name.encode()
    if data_file is not None and raw.nbytes > EXTERNAL_THRESHOLD:
        offset += (-offset) % ALIGNMENT
        data_file.seek(offset)
        data_file.write(raw)
        entries = []
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(raw.nbytes))):
            entry = onnx.StringStringEntryProto(key=key, value=value).SerializeToString()
            entries.append(_delimited(13, len(entry)) + entry)
        tail = b"".join(entries)
        tail += _key(14, 0) + encode_varint(onnx.TensorProto.EXTERNAL)
        offset += raw.nbytes
        tensor = head + tail
        f.write(_delimited(7, len(_delimited(5, len(tensor))) + len(tensor)) + _delimited(5, len(tensor)) + tensor)
        return offset
    tensor_len = len(head) + len(_delimited(9, raw.nbytes)) + raw.nbytes
    f.write(_delimited(7, len(_delimited(5, tensor_len)) + tensor_len) + _delimited(5, tensor_len) + head
            + _delimited(9, raw.nbytes))
    f.write(raw)
    return offset


def _parts(model: onnx.ModelProto | SplitModel):
    """(header, (name, array) one at a time) without a whole-model copy."""
    if isinstance(model, SplitModel):
        return model.header(), iter(model.weights.items())
    return (skeleton(model, keep_small=False, weights_as_inputs=False),
            ((t.name, numpy_helper.to_array(t)) for t in model.graph.initializer))


def _write_stream(header: onnx.ModelProto, weights, f, data_file=None, data_name: str = "") -> None:
    f.write(header.SerializeToString())
    offset = 0
    for name, values in weights:
        if values.dtype.kind in "OUS":  # string tensors have no raw form
            piece = onnx.ModelProto()
            piece.graph.initializer.append(numpy_helper.from_array(values, name))
            f.write(piece.SerializeToString())
        else:
            offset = _write_initializer(f, name, values, data_file, data_name, offset)


def save_model(model: onnx.ModelProto | SplitModel, out_path: str, in_path: str | None = None,
               referenced: set[str] = frozenset()) -> None:
    check_output_path(out_path, in_path, referenced)
    folder = os.path.dirname(os.path.abspath(out_path))
    base = os.path.basename(out_path)
    data_name = base + ".data"
    if isinstance(model, SplitModel):
        size = sum(v.nbytes for v in model.weights.values())
    else:
        size = sum(tensor_nbytes(t) for t in model.graph.initializer)
    header, tensors = _parts(model)
    external = size > PROTOBUF_LIMIT - 64 * 2**20  # leave room for the graph itself
    temps = []
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
        temps.append(tmp)
        data_tmp = os.path.join(folder, f".{data_name}.tmp") if external else None
        with os.fdopen(fd, "wb") as f:
            if external:
                temps.append(data_tmp)
                with open(data_tmp, "wb") as data_file:
                    _write_stream(header, tensors, f, data_file, data_name)
                    data_file.flush()
                    os.fsync(data_file.fileno())
            else:
                _write_stream(header, tensors, f)
            f.flush()
            os.fsync(f.fileno())
        for path in temps:  # mkstemp makes 0600 files; an output is a file like any other tool's
            os.chmod(path, 0o666 & ~umask())
        if external:
            os.replace(data_tmp, os.path.join(folder, data_name))
        os.replace(tmp, out_path)
    except BaseException:
        for path in temps:
            if path and os.path.exists(path):
                os.unlink(path)
        raise
