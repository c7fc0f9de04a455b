"""Peak memory of `epifuse optimize` against the model's size, where copies pile up most easily: one
weight shared by two Conv+BN pairs (each fold needs its own scaled copy) and 3x3 filters (each fused
conv writes a KRSC copy). Measured as the child process's peak RSS above that of the same command on
a tiny model (the interpreter and its libraries)."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from models import zoo

# VmHWM, not getrusage's ru_maxrss: that one keeps the forking parent's (pytest's) size across exec
CHILD = """
import sys
from optimizer.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")))  # KiB
sys.exit(code)
"""


def _peak_kib(*args) -> int:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-500:]
    return int(done.stdout.strip().splitlines()[-1])


def _shared_weight_model(path, channels=1280, kernel=3):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((channels, channels, kernel, kernel)) * 0.01).astype(np.float32), "w")
    inits, nodes = [w], []
    for i in range(2):
        bn = [numpy_helper.from_array(v.astype(np.float32), f"bn{i}_{k}") for k, v in
              zip("sbmv", [rng.uniform(.5, 1.5, channels), rng.normal(0, .1, channels), rng.normal(0, .1, channels),
                           rng.uniform(.5, 1.5, channels)])]
        inits += bn
        nodes += [helper.make_node("Conv", ["x", "w"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", *[b.name for b in bn]], [f"b{i}"]),
                  helper.make_node("Relu", [f"b{i}"], [f"y{i}"])]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, channels, 4, 4])],
                          [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, [1, channels, 4, 4])
                           for i in range(2)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return w.raw_data.__len__()


@pytest.mark.slow
@pytest.mark.parametrize("fuse", ["always", "static"])
def test_a_weight_shared_by_two_folds_peaks_within_3x(tmp_path, fuse):
    size = _shared_weight_model(tmp_path / "shared.onnx")  # 1280 x 1280 x 3 x 3 fp32: 56 MiB, read by two Conv+BN
    onnx.save(zoo.build("resnet_tiny", batch=1), tmp_path / "tiny.onnx")
    floor = _peak_kib("optimize", str(tmp_path / "tiny.onnx"), "-o", str(tmp_path / "t.onnx"), "--fuse", fuse)
    peak = _peak_kib("optimize", str(tmp_path / "shared.onnx"), "-o", str(tmp_path / "o.onnx"), "--fuse", fuse)
    assert (peak - floor) * 1024 <= 3 * size, f"{(peak - floor) / 1024:.0f} MiB above the floor for {size / 2**20:.0f} MiB"
