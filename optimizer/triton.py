"""`epifuse export-triton`: a Triton Inference Server model repository entry for an epifuse model.

Writes ``REPO/NAME/config.pbtxt`` and ``REPO/NAME/1/model.onnx`` (ONNX Runtime backend, with the
epifuse custom-op library named in ``model_operations``) or ``REPO/NAME/1/model.plan`` (TensorRT
backend; the plugin is loaded by the server, see docs/deploy.md). Inputs and outputs come from the
ONNX graph; a symbolic first dimension on every input means the model batches, and then Triton's
dynamic batcher is configured. The folder is written next to its destination and renamed into place,
so a server watching the repository never sees half a model.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import onnx

from .errors import EpifuseError

BACKENDS = ("onnxruntime", "tensorrt")
# Where the Dockerfile puts the plugin libraries inside the image.
IMAGE_LIB_DIR = "/opt/epifuse/lib"
IMAGE_ORT_LIBRARY = f"{IMAGE_LIB_DIR}/libepifuse_ort.so"

_TRITON_TYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16", onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT8: "TYPE_INT8", onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.UINT8: "TYPE_UINT8", onnx.TensorProto.UINT16: "TYPE_UINT16",
    onnx.TensorProto.UINT32: "TYPE_UINT32", onnx.TensorProto.UINT64: "TYPE_UINT64",
    onnx.TensorProto.BOOL: "TYPE_BOOL", onnx.TensorProto.STRING: "TYPE_STRING",
}


def _tensors(model: onnx.ModelProto, path: str) -> tuple[list, list]:
    """[(name, triton type, dims with -1 for symbolic)] of the graph's inputs and outputs."""
    initializers = {t.name for t in model.graph.initializer}

    def describe(value) -> tuple[str, str, list[int]]:
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
            raise EpifuseError(f"'{value.name}' is not a tensor of known rank", path=path)
        if tensor.elem_type not in _TRITON_TYPES:
            name = onnx.TensorProto.DataType.Name(tensor.elem_type)
            raise EpifuseError(f"'{value.name}' has data type {name}, which Triton has no type for", path=path)
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return value.name, _TRITON_TYPES[tensor.elem_type], dims

    inputs = [describe(v) for v in model.graph.input if v.name not in initializers]
    return inputs, [describe(v) for v in model.graph.output]


def _batches(inputs: list) -> bool:
    return bool(inputs) and all(dims and dims[0] == -1 for _, _, dims in inputs)


def _tensor_block(kind: str, tensors: list, batched: bool) -> list[str]:
    lines = []
    for name, dtype, dims in tensors:
        shown = dims[1:] if batched else dims
        lines += [f"{kind} {{", f"  name: \"{name}\"", f"  data_type: {dtype}",
                  f"  dims: [ {', '.join(str(d) for d in shown)} ]", "}"]
    return lines


def config_text(name: str, backend: str, inputs: list, outputs: list, *, batched: bool, max_batch: int,
                instances: int, gpus: list[int] | None, library: str | None, ort_params: dict[str, str]) -> str:
    """The config.pbtxt text (protobuf text format of Triton's ModelConfig)."""
    lines = [f"name: \"{name}\""]
    if backend == "onnxruntime":
        lines.append("backend: \"onnxruntime\"")
    else:
        lines.append("platform: \"tensorrt_plan\"")
    lines.append(f"max_batch_size: {max_batch if batched else 0}")
    lines += _tensor_block("input", inputs, batched)
    lines += _tensor_block("output", outputs, batched)
    group = [f"  count: {instances}", "  kind: KIND_GPU"]
    if gpus:
        group.append(f"  gpus: [ {', '.join(str(g) for g in gpus)} ]")
    lines += ["instance_group {", *group, "}"]
    if batched:
        lines.append("dynamic_batching { }")
    if backend == "onnxruntime":
        lines += ["model_operations {", f"  op_library_filename: \"{library}\"", "}"]
        for key, value in sorted(ort_params.items()):
            lines.append(f"parameters {{ key: \"{key}\" value: {{ string_value: \"{value}\" }} }}")
    return "\n".join(lines) + "\n"


def _load_onnx(path: str) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise EpifuseError("no such file", path=path)
    try:
        return onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types for bad bytes
        raise EpifuseError(f"not an ONNX model: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                           path=path) from None


def _build_plan(onnx_path: str, plan_path: str, inputs: list, batched: bool, max_batch: int) -> None:
    from . import tensorrt  # noqa: PLC0415

    try:
        tensorrt.load_tensorrt()
    except EpifuseError:
        raise EpifuseError("building a TensorRT plan needs TensorRT's Python API, which is not installed here: "
                           f"run `epifuse build-engine {onnx_path} -o model.plan` where it is, with the server's "
                           "TensorRT version on the serving GPU kind (see docs/deploy.md), and pass model.plan "
                           "to export-triton", path=onnx_path) from None
    shapes = {}
    for name, _, dims in inputs:
        rest = dims[1:] if batched else dims
        if any(d == -1 for d in rest):
            raise EpifuseError(f"input '{name}' has symbolic dimensions besides the batch: build the plan with "
                               "`epifuse build-engine --min/--opt/--max` and pass it to export-triton",
                               path=onnx_path)
        if batched:
            shapes[name] = [(b, *rest) for b in (1, max_batch, max_batch)]
    tensorrt.build_engine(onnx_path, plan_path,
                          min_shapes={k: v[0] for k, v in shapes.items()},
                          opt_shapes={k: v[1] for k, v in shapes.items()},
                          max_shapes={k: v[2] for k, v in shapes.items()})


def export_triton(model: str, repo: str, *, backend: str, name: str | None = None, max_batch: int = 8,
                  instances: int = 1, gpus: list[int] | None = None, library: str | None = None,
                  io_model: str | None = None, ort_params: dict[str, str] | None = None,
                  force: bool = False) -> Path:
    """Writes REPO/NAME (config.pbtxt and 1/model.onnx or 1/model.plan); returns that folder."""
    if backend not in BACKENDS:
        raise EpifuseError(f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    if max_batch < 1 or instances < 1:
        raise EpifuseError("--max-batch and --instances must be at least 1")
    is_plan = model.endswith((".plan", ".engine"))
    if is_plan and backend != "tensorrt":
        raise EpifuseError("a TensorRT plan can only be served with --backend tensorrt", path=model)
    if is_plan and not os.path.isfile(model):
        raise EpifuseError("no such file", path=model)
    name = name or re.sub(r"[^A-Za-z0-9_-]", "_", Path(model).name.split(".")[0])
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise EpifuseError(f"model name {name!r} is not a plain folder name")

    description = None if is_plan and io_model is None else _load_onnx(io_model or model)
    if description is not None:
        inputs, outputs = _tensors(description, io_model or model)
        batched = _batches(inputs)
    else:  # a plan alone: Triton's auto-complete reads the inputs and outputs from the engine
        inputs, outputs, batched = [], [], False
    library = library or IMAGE_ORT_LIBRARY
    if backend == "onnxruntime" and not os.path.isabs(library):
        raise EpifuseError("--library must be an absolute path (as the server sees it)", path=library)

    repo_dir = Path(repo)
    target = repo_dir / name
    if target.exists() and not force:
        raise EpifuseError("model folder exists (pass --force to replace it)", path=str(target))
    repo_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=repo_dir))
    try:
        version = staging / "1"
        version.mkdir()
        if backend == "onnxruntime":
            # Re-saving (not copying) keeps external data next to the model under the default name.
            onnx.save(onnx.load(model), str(version / "model.onnx"))
        elif is_plan:
            shutil.copyfile(model, version / "model.plan")
        else:
            _build_plan(model, str(version / "model.plan"), inputs, batched, max_batch)
        (staging / "config.pbtxt").write_text(config_text(
            name, backend, inputs, outputs, batched=batched, max_batch=max_batch, instances=instances,
            gpus=gpus, library=library, ort_params=ort_params or {}))
        staging.chmod(0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=repo_dir))
            os.replace(target, old / name)
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


# ------------------------------------------------------------------------------------- CLI
def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise EpifuseError(f"bad --ort-param {text!r}: expected KEY=VALUE")
    return key, value


def _gpu_list(text: str) -> list[int]:
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise EpifuseError(f"bad --gpus {text!r}: expected device numbers like 0,1") from None


def add_export_triton_command(sub) -> None:
    p = sub.add_parser("export-triton", help="write a Triton Inference Server model repository entry")
    p.add_argument("model", help="an (epifuse-optimized) .onnx model, or a TensorRT .plan for --backend tensorrt")
    p.add_argument("--repo", required=True, metavar="DIR", help="model repository folder (created if missing)")
    p.add_argument("--backend", required=True, choices=BACKENDS)
    p.add_argument("--name", help="model name (default: the file name up to its first dot)")
    p.add_argument("--max-batch", type=int, default=8, metavar="N",
                   help="max_batch_size when the first dimension is symbolic (default 8)")
    p.add_argument("--instances", type=int, default=1, metavar="N", help="model instances per GPU")
    p.add_argument("--gpus", metavar="0,1,...", help="GPUs the instances run on (default: all)")
    p.add_argument("--library", metavar="PATH",
                   help=f"libepifuse_ort.so as the server sees it (default {IMAGE_ORT_LIBRARY}, the image's)")
    p.add_argument("--onnx", dest="io_model", metavar="MODEL.onnx",
                   help="with a .plan: the ONNX model it was built from, for the inputs and outputs")
    p.add_argument("--ort-param", action="append", default=[], metavar="KEY=VALUE",
                   help="ONNX Runtime backend parameter, e.g. cudnn_conv_algo_search=1 (repeatable)")
    p.add_argument("--force", action="store_true", help="replace an existing model folder")
    p.set_defaults(func=_cmd_export_triton)


def _cmd_export_triton(args, console) -> int:
    folder = export_triton(args.model, args.repo, backend=args.backend, name=args.name, max_batch=args.max_batch,
                           instances=args.instances, gpus=_gpu_list(args.gpus) if args.gpus else None,
                           library=args.library, io_model=args.io_model,
                           ort_params=dict(_key_value(kv) for kv in args.ort_param), force=args.force)
    console.print(f"wrote {folder}")
    return 0
