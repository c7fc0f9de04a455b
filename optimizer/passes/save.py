"""Save atomically: write beside the destination under a temporary name, then rename, so a
reader never sees a half-written model and a failure leaves nothing behind. Never overwrites
the input model. Models over 2 GB go to external data next to the file."""
from __future__ import annotations

import os
import tempfile

import onnx

from ..errors import EpifuseError

PROTOBUF_LIMIT = 2**31 - 1


def check_output_path(out_path: str, in_path: str | None) -> None:
    if in_path is not None and os.path.abspath(out_path) == os.path.abspath(in_path) or (
            in_path is not None and os.path.exists(out_path) and os.path.samefile(out_path, in_path)):
        raise EpifuseError("output path is the input model; choose another file", path=out_path)
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise EpifuseError("output folder does not exist", path=out_path)


def save_model(model: onnx.ModelProto, out_path: str, in_path: str | None = None) -> None:
    check_output_path(out_path, in_path)
    folder = os.path.dirname(os.path.abspath(out_path))
    base = os.path.basename(out_path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
    os.close(fd)
    data_tmp = None
    try:
        if model.ByteSize() > PROTOBUF_LIMIT:
            data_name = base + ".data"
            data_tmp = os.path.join(folder, f".{data_name}.tmp")
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(data_tmp), size_threshold=1024)
            # point the model at the final data file name, then move both into place
            final = onnx.load(tmp, load_external_data=False)
            for t in onnx.external_data_helper._get_all_tensors(final):
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = data_name
            with open(tmp, "wb") as f:
                f.write(final.SerializeToString())
            os.replace(data_tmp, os.path.join(folder, data_name))
        else:
            with open(tmp, "wb") as f:
                f.write(model.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        for path in (tmp, data_tmp):
            if path and os.path.exists(path):
                os.unlink(path)
        raise
