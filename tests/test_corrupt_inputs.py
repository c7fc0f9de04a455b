"""Corrupt-input corpus, built here with a fixed seed: truncations at many offsets, byte flips,
wrong element types, negative or huge dims, NaN/Inf weights, attributes out of range, external
data that escapes the model's folder or is missing. Each one optimizes (and verifies) or gets an
EpifuseError naming the file (CLI: exit code 2, one line, no output file); never another
exception type, never a crash. The corpus runs in one child process, so a segfault fails the
test with the case that caused it instead of killing pytest."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234


def conv_model(*, w=None, conv_attrs=None, x_shape=(1, 8, 8, 8), w_type=TensorProto.FLOAT, opset=17,
               bn=True) -> onnx.ModelProto:
    """Conv(8→16, 3x3) + BN + Relu; the weight is 4.6 KB, so loading streams it."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) if w is None else w
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(16, np.float32), "b")]
    if w_type != TensorProto.FLOAT:
        inits[0] = helper.make_tensor("w", w_type, w.shape, w.astype(np.int64).ravel().tolist())
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv",
                              **(conv_attrs if conv_attrs is not None else {"pads": [1, 1, 1, 1]}))]
    out = "c"
    if bn:
        for n, v in (("s", 1.0), ("o", 0.0), ("m", 0.0), ("v", 1.0)):
            inits.append(numpy_helper.from_array(np.full(16, v, np.float32), n))
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["bn"], name="bn"))
        out = "bn"
    nodes.append(helper.make_node("Relu", [out], ["y"], name="relu"))
    g = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _external(model: onnx.ModelProto, name: str, location: str, length: int, offset: int = 0) -> onnx.ModelProto:
    t = next(t for t in model.graph.initializer if t.name == name)
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return model


def build_corpus(folder: str) -> list[str]:
    """Writes the corpus into `folder`; returns the model paths (sorted: deterministic)."""
    rng = np.random.default_rng(SEED)
    base = conv_model().SerializeToString()
    files: dict[str, bytes | onnx.ModelProto] = {}
    for i, cut in enumerate(sorted({*range(0, 64, 7), *rng.integers(1, len(base), 40).tolist(), len(base) - 1})):
        files[f"trunc_{i:03d}_{cut}.onnx"] = base[:cut]
    for i in range(60):
        data = bytearray(base)
        for pos in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[pos] ^= int(rng.integers(1, 256))
        files[f"flip_{i:03d}.onnx"] = bytes(data)
    files["garbage_random.onnx"] = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    files["empty.onnx"] = b""
    files["huge_varint.onnx"] = b"\x3a" + b"\xff" * 9 + b"\x01"  # graph field, length 2**63-ish
    files["wrong_weight_type_int64.onnx"] = conv_model(w_type=TensorProto.INT64)
    m = conv_model()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    files["string_input.onnx"] = m
    files["negative_input_dim.onnx"] = conv_model(x_shape=(1, 8, -5, 8))
    files["huge_input_dim.onnx"] = conv_model(x_shape=(1, 8, 2**40, 8))
    m = conv_model()
    m.graph.initializer[0].dims[0] = -16
    files["negative_initializer_dim.onnx"] = m
    m = conv_model()
    m.graph.initializer[0].dims[0] = 2**40
    files["huge_initializer_dim.onnx"] = m
    m = conv_model()
    m.graph.initializer[1].dims[0] = 17  # data for 16 values
    files["initializer_dims_disagree_with_data.onnx"] = m
    for tag, value in (("nan", np.nan), ("inf", np.inf), ("neginf", -np.inf)):
        w = np.random.default_rng(1).standard_normal((16, 8, 3, 3)).astype(np.float32)
        w[3, 2, 1, 1] = value
        files[f"{tag}_weight.onnx"] = conv_model(w=w)
        m = conv_model()
        var = next(t for t in m.graph.initializer if t.name == "v")
        var.CopyFrom(numpy_helper.from_array(np.full(16, value, np.float32), "v"))
        files[f"{tag}_bn_variance.onnx"] = m
    m = conv_model()
    var = next(t for t in m.graph.initializer if t.name == "v")
    var.CopyFrom(numpy_helper.from_array(np.full(16, -1.0, np.float32), "v"))  # sqrt of a negative
    files["negative_bn_variance.onnx"] = m
    for tag, attrs in (("negative_pads", {"pads": [-1, -1, -1, -1]}), ("stride_0", {"strides": [0, 0]}),
                       ("negative_stride", {"strides": [-1, 1]}), ("dilation_0", {"dilations": [0, 1]}),
                       ("group_not_dividing_c", {"group": 3}), ("group_0", {"group": 0}),
                       ("group_negative", {"group": -2}), ("pads_wrong_length", {"pads": [1, 1]}),
                       ("kernel_shape_mismatch", {"kernel_shape": [5, 5]}),
                       ("huge_pads", {"pads": [2**40, 0, 0, 0]}), ("auto_pad_bogus", {"auto_pad": "SIDEWAYS"})):
        files[f"attr_{tag}.onnx"] = conv_model(conv_attrs=attrs, bn=False)
    w = np.random.default_rng(2).standard_normal((16, 8, 3, 3)).astype(np.float32)
    for tag, location, length in (("escape_dotdot", "../outside.bin", w.nbytes),
                                  ("escape_absolute", "/etc/passwd", 16), ("missing_file", "nowhere.bin", w.nbytes),
                                  ("short_file", "short.bin", w.nbytes), ("offset_past_end", "short.bin", 16)):
        m = _external(conv_model(w=w), "w", location, length, offset=64 if tag == "offset_past_end" else 0)
        files[f"ext_{tag}.onnx"] = m
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "short.bin"), "wb") as f:
        f.write(w.tobytes()[:100])
    with open(os.path.join(os.path.dirname(folder), "outside.bin"), "wb") as f:
        f.write(w.tobytes())
    paths = []
    for name, content in files.items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.SerializeToString())
        paths.append(path)
    return sorted(paths)


_WORKER = r"""
import json, os, sys, traceback
from optimizer.errors import EpifuseError
from optimizer.pipeline import optimize_file
from optimizer.verify import verify
for path in sys.argv[1:]:
    out = path + ".out.onnx"
    print(json.dumps({"start": path}), flush=True)
    try:
        optimize_file(path, out)
        result = verify(path, out)
        outcome = {"ok": True, "passed": result["passed"], "worst": result["worst_rel_l2"]}
    except EpifuseError as e:
        outcome = {"epifuse_error": str(e), "output_written": os.path.exists(out)}
    except Exception as e:
        outcome = {"other": type(e).__name__, "message": str(e)[:300], "tb": traceback.format_exc()[-1500:]}
    print(json.dumps({"path": path, **outcome}), flush=True)
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus") / "models"
    paths = build_corpus(str(folder))
    proc = subprocess.run([sys.executable, "-c", _WORKER, *paths], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        last = next((line["start"] for line in reversed(lines) if "start" in line), "?")
        pytest.fail(f"the optimizer process died (exit {proc.returncode}) on {last}: {proc.stderr[-2000:]}")
    return {line["path"]: line for line in lines if "path" in line}


def test_corpus_gives_only_clear_errors_or_verified_models(corpus):
    assert len(corpus) > 130
    bad = {os.path.basename(p): r for p, r in corpus.items() if "other" in r}
    assert not bad, json.dumps(bad, indent=1)[:6000]
    for path, r in corpus.items():
        name = os.path.basename(path)
        if "epifuse_error" in r:
            assert name in r["epifuse_error"], r  # names the file
            assert "\n" not in r["epifuse_error"].strip(), r  # one line
            assert not r["output_written"], r
        else:  # optimized: then it must also verify (NaN/Inf models compare NaN to NaN as failed)
            assert r["passed"] or name.startswith(("nan_", "inf_", "neginf_", "negative_bn")), r


@pytest.mark.parametrize("name", ["attr_stride_0.onnx", "attr_group_not_dividing_c.onnx", "flip_000.onnx",
                                  "ext_escape_dotdot.onnx", "negative_initializer_dim.onnx", "wrong_weight_type_int64.onnx",
                                  "trunc_010"])
def test_cli_on_corrupt_input(corpus, name, tmp_path):
    path = next((p for p in corpus if os.path.basename(p).startswith(name.split(".")[0])), None)
    assert path is not None
    out = tmp_path / "o.onnx"
    proc = subprocess.run([sys.executable, "-m", "optimizer", "optimize", path, "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if "epifuse_error" in corpus[path]:
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("epifuse: error:") and os.path.basename(path) in lines[0]
        assert "Traceback" not in proc.stderr and not out.exists()
    else:
        assert proc.returncode == 0, proc.stderr
