"""TensorRT engines with the FusedConv plugin (marker `trt_build`).

They run where the plugin library can be compiled (TensorRT headers in EPIFUSE_TRT_INCLUDE_DIR)
and a TensorRT Python API is importable: `tensorrt`, or the TensorRT-RTX pip bindings, which build
plans on a machine without a GPU. EPIFUSE_TRT_PYTHON may name another interpreter that has them.
The plugin library is taken from EPIFUSE_LIB_DIR or build/, else compiled with
plugins/tensorrt/compile_check.sh into EPIFUSE_TRT_BUILD_DIR (default: a folder under /tmp).

Engines are built by `epifuse build-engine` in a subprocess, because TensorRT-RTX's ONNX parser
needs an unversioned libtensorrt_rtx.so on LD_LIBRARY_PATH before the process starts. Without a
GPU only the build phase runs: nothing here deserializes or executes an engine.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conv_reference import output_size
from models import zoo
from optimizer.pipeline import FusionPolicy, optimize_model

pytestmark = pytest.mark.trt_build
REPO = Path(__file__).resolve().parent.parent
PLUGIN = "libepifuse_trt.so"


# ----------------------------------------------------------------------------- environment
@pytest.fixture(scope="session")
def headers() -> Path:
    inc = os.environ.get("EPIFUSE_TRT_INCLUDE_DIR")
    if not inc or not Path(inc, "NvInferRuntime.h").is_file():
        pytest.skip("TensorRT headers not found: set EPIFUSE_TRT_INCLUDE_DIR to a folder with NvInferRuntime.h")
    return Path(inc)


@pytest.fixture(scope="session")
def lib_dir(headers) -> Path:
    for d in (os.environ.get("EPIFUSE_LIB_DIR"), REPO / "build"):
        if d and Path(d, PLUGIN).is_file() and Path(d, "libepifuse_core.so").is_file():
            return Path(d)
    build = Path(os.environ.get("EPIFUSE_TRT_BUILD_DIR", Path(tempfile.gettempdir()) / "epifuse-trt-check"))
    run = subprocess.run(["bash", str(REPO / "plugins/tensorrt/compile_check.sh"), str(headers), str(build)],
                         capture_output=True, text=True)
    assert run.returncode == 0, f"the plugin did not compile:\n{run.stdout}\n{run.stderr}"
    return build


@pytest.fixture(scope="session")
def trt_env(lib_dir, tmp_path_factory) -> dict:
    """Environment for a subprocess that builds engines: python, env (LD_LIBRARY_PATH etc.)."""
    python = os.environ.get("EPIFUSE_TRT_PYTHON", sys.executable)
    env = dict(os.environ, EPIFUSE_LIB_DIR=str(lib_dir), PYTHONPATH=str(REPO))
    probe = subprocess.run([python, "-c", "from optimizer import tensorrt as t; trt = t.load_tensorrt(); "
                            "print(trt.__name__); print(trt.__version__); import importlib; "
                            "print(importlib.import_module('tensorrt_rtx_libs').__path__[0] if t.is_rtx(trt) else '')"],
                           capture_output=True, text=True, env=env, cwd=REPO)
    if probe.returncode != 0:
        pytest.skip(f"no TensorRT Python API in {python}: {probe.stderr.strip().splitlines()[-1]}")
    module, version, rtx_libs = (probe.stdout.splitlines() + [""])[:3]
    if rtx_libs:
        link_dir = tmp_path_factory.mktemp("rtx-libs")
        (link_dir / "libtensorrt_rtx.so").symlink_to(Path(rtx_libs) / "libtensorrt_rtx.so.1")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(link_dir), env.get("LD_LIBRARY_PATH")]))
    return dict(python=python, env=env, module=module, version=version, lib_dir=lib_dir)


def run_cli(trt_env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([trt_env["python"], "-m", "optimizer", *map(str, args)], capture_output=True, text=True,
                          env=trt_env["env"], cwd=REPO)


# --------------------------------------------------------------------------------- helpers
def _dims(value_info) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else -1 for d in value_info.type.tensor_type.shape.dim]


def _profile_args(model: onnx.ModelProto) -> list[str]:
    init = {i.name for i in model.graph.initializer}
    bounds = {"--min": 1, "--opt": 2, "--max": 4}
    args = []
    for flag, batch in bounds.items():
        spec = [f"{i.name}:{'x'.join(str(d if d >= 0 else batch) for d in _dims(i))}"
                for i in model.graph.input if i.name not in init and -1 in _dims(i)]
        if spec:
            args += [flag, ",".join(spec)]
    return args


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _serialized_bytes(node) -> bytes:
    """The node's getFieldsToSerialize as TensorRT-RTX 1.7 lays a PluginFieldCollection out in a plan
    (per field: u32 name size, name NUL, i32 type, i32 length, data), from libepifuse_core's
    serializer (tests/test_plugin_fields.py checks that one against the op contract)."""
    from test_plugin_fields import Fields, field

    a = _attrs(node)
    fields = [field(k, v.decode() if isinstance(v, bytes) else v) for k, v in a.items()
              if k not in ("plugin_namespace", "plugin_version")]
    out = b""
    for name, ftype, data, length in Fields(fields).serialized():
        out += struct.pack("<I", len(name) + 1) + name.encode() + b"\0" + struct.pack("<ii", ftype, length) + data
    return out


# ----------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_zoo_engine(name, trt_env, tmp_path):
    original = zoo.ZOO[name]()
    # every candidate with a kernel fused: the plugin is what this builds (by cost, TensorRT keeps them)
    optimized, _ = optimize_model(original, target="tensorrt", policy=FusionPolicy(mode="always"))
    nodes = {n.name: n for n in optimized.graph.node if n.op_type == "FusedConv"}
    assert nodes, f"{name}: nothing fused for tensorrt"
    path = tmp_path / f"{name}.onnx"
    onnx.save(optimized, path)
    run = run_cli(trt_env, "build-engine", path, "-o", tmp_path / f"{name}.plan", "--report", tmp_path / "r.json",
                  "--timing-cache", tmp_path / "timing.cache", *_profile_args(optimized))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "r.json").read_text())

    # Every FusedConv became the plugin layer of the same name.
    plugin_layers = {layer["name"]: layer for layer in report["layers"] if layer["type"] == "PLUGIN_V3"}
    assert set(plugin_layers) == set(nodes)
    assert report["plugin_layers"] == report["fused_conv_nodes"] == len(nodes)

    # Output shapes (from getOutputShapes through IExprBuilder) follow the contract's rule; the
    # batch stays symbolic.
    for node_name, layer in plugin_layers.items():
        a = _attrs(nodes[node_name])
        (_, x, x_type), (_, w, _), (_, b, _) = layer["inputs"][:3]
        strides, pads, dil = a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), a.get("dilations", [1, 1])
        want = [x[0], output_size(x[1], pads[0], pads[2], dil[0], w[1], strides[0]),
                output_size(x[2], pads[1], pads[3], dil[1], w[2], strides[1]), w[0]]
        (_, y, y_type), = layer["outputs"]
        assert y == want and x[0] == -1 and y_type == x_type, node_name
        assert len(layer["inputs"]) == (4 if a.get("residual", b"none") != b"none" else 3), node_name

    # The network's outputs are the original model's.
    assert [(n, s) for n, s, _ in report["outputs"]] == [(o.name, _dims(o)) for o in original.graph.output]

    # The plan holds each node's serialized fields (a null getFieldsToSerialize would still build).
    plan = (tmp_path / f"{name}.plan").read_bytes()
    expected: dict[bytes, int] = {}
    for node in nodes.values():
        assert f"{node.name}_PluginFieldCollection".encode() in plan, node.name
        blob = _serialized_bytes(node)
        expected[blob] = expected.get(blob, 0) + 1
    for blob, count in expected.items():
        assert plan.count(blob) >= count, blob
    assert (tmp_path / "timing.cache").stat().st_size > 0


def _single_node_model(path, *, activation="relu", dtype=TensorProto.FLOAT16, w_dtype=None, **attrs):
    w = np.ones((8, 3, 3, 4), np.float32)
    b = np.zeros(8, np.float32)
    to = helper.tensor_dtype_to_np_dtype
    node = helper.make_node("FusedConv", ["X", "W", "B"], ["Y"], name="the_node", domain="epifuse",
                            plugin_namespace="epifuse", plugin_version="1", activation=activation, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", dtype, ["n", 8, 8, 4])],
                              [helper.make_tensor_value_info("Y", dtype, None)],
                              initializer=[numpy_helper.from_array(w.astype(to(w_dtype or dtype)), "W"),
                                           numpy_helper.from_array(b.astype(to(w_dtype or dtype)), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    model.ir_version = 9
    onnx.save(model, path)
    return ["--min", "X:1x8x8x4", "--opt", "X:2x8x8x4", "--max", "X:8x8x8x4"]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_single_node_dtypes(dtype, trt_env, tmp_path):
    shapes = _single_node_model(tmp_path / "m.onnx", dtype=dtype, strides=[2, 2], pads=[1, 1, 1, 1])
    run = run_cli(trt_env, "build-engine", tmp_path / "m.onnx", "--report", tmp_path / "r.json", *shapes)
    assert run.returncode == 0, run.stderr
    (layer,) = [la for la in json.loads((tmp_path / "r.json").read_text())["layers"] if la["type"] == "PLUGIN_V3"]
    assert layer["outputs"][0][1] == [-1, 4, 4, 8]
    assert layer["outputs"][0][2] == {TensorProto.FLOAT: "FLOAT", TensorProto.FLOAT16: "HALF",
                                      TensorProto.BFLOAT16: "BF16"}[dtype]
    assert (tmp_path / "m.plan").stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    (dict(activation="swish"), "FusedConv 'the_node': unknown activation 'swish'"),
    (dict(w_dtype=TensorProto.FLOAT), "input W has another type than X (float16)"),
    (dict(group=3), "group 3 does not divide C = 4"),
])
def test_bad_nodes_fail_with_the_node_and_the_reason(change, message, trt_env, tmp_path):
    shapes = _single_node_model(tmp_path / "m.onnx", **change)
    run = run_cli(trt_env, "build-engine", tmp_path / "m.onnx", *shapes)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr
    assert "epifuse: error:" in run.stderr


def _header_major(headers: Path) -> int:
    text = (headers / "NvInferVersion.h").read_text()
    return int(text.split("#define TRT_MAJOR_ENTERPRISE", 1)[1].split()[0])


def test_static_registration_library(headers, trt_env, tmp_path):
    """libepifuse_trt_static.so registers itself when dlopen()ed into a process that has TensorRT
    loaded (as trtexec --staticPlugins and Triton do); build-engine then finds the creator."""
    # REGISTER_TENSORRT_PLUGIN calls IPluginRegistry::registerCreator through the headers' vtable,
    # which TensorRT 11 changed (the IPluginCreator overloads are gone); TensorRT-RTX 1.7 has the
    # 11 layout (a 10.16-header build crashes there). The loadLibrary library has no such call.
    runtime_major = 11 if trt_env["module"].startswith("tensorrt_rtx") else int(trt_env["version"].split(".")[0])
    if _header_major(headers) != runtime_major:
        pytest.skip(f"static registration needs headers of the runtime's major version: headers "
                    f"{_header_major(headers)}, {trt_env['module']} {trt_env['version']} (registry layout {runtime_major})")
    static = trt_env["lib_dir"] / "libepifuse_trt_static.so"
    shapes = _single_node_model(tmp_path / "m.onnx")
    script = (
        "import ctypes, sys\n"
        "from optimizer import tensorrt as t\n"
        "trt = t.load_tensorrt()\n"
        "if t.is_rtx(trt):\n"
        "    import tensorrt_rtx_libs\n"
        "    ctypes.CDLL(tensorrt_rtx_libs.__path__[0] + '/libtensorrt_rtx.so.1', mode=ctypes.RTLD_GLOBAL)\n"
        "ctypes.CDLL(sys.argv[1])\n"
        "r = t.build_engine(sys.argv[2], sys.argv[3], plugin_library='/nonexistent/not-loaded.so',\n"
        "                   min_shapes=t.parse_shapes(sys.argv[4]), max_shapes=t.parse_shapes(sys.argv[5]))\n"
        "print(r.plugin_layers)\n")
    run = subprocess.run([trt_env["python"], "-c", script, static, tmp_path / "m.onnx", tmp_path / "m.plan",
                          shapes[1], shapes[5]], capture_output=True, text=True, env=trt_env["env"], cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1"]


def test_fields_round_trip_through_the_library(headers, lib_dir, tmp_path):
    """getFieldsToSerialize -> createPlugin(kRUNTIME) in libepifuse_trt.so itself, driven through
    its entry points by a small C++ program (TensorRT only builds, and never deserializes here)."""
    exe = tmp_path / "plugin_round_trip"
    cuda_inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    compile_ = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Wno-deprecated-declarations",
                               "-isystem", str(headers), "-isystem", str(cuda_inc),
                               str(REPO / "tests/trt_plugin_host/plugin_round_trip.cpp"), "-o", str(exe), "-ldl"],
                              capture_output=True, text=True)
    assert compile_.returncode == 0, compile_.stderr
    run = subprocess.run([str(exe), str(lib_dir / PLUGIN)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
