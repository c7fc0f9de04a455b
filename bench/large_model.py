"""Peak memory of `epifuse optimize` on a model over 2 GB (external data), next to its size.

    python bench/large_model.py [--channels 16384] [--keep DIR] [--verify]

Builds a model whose weights exceed the 2 GB protobuf limit (two 1x1 convs of C x C fp32 weights
with BatchNorm and ReLU, written straight to an external-data file), optimizes it in a subprocess
under GNU time, and prints wall time, peak RSS and peak RSS / model size (target: at most 2x).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent


def external(name: str, array: np.ndarray, data, data_name: str) -> TensorProto:
    """A TensorProto whose bytes go to the open `data` file (never held as protobuf)."""
    offset = data.tell()
    array.tofile(data)
    t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape,
                    data_location=TensorProto.EXTERNAL)
    for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(array.nbytes))):
        t.external_data.add(key=key, value=value)
    return t


def build(folder: Path, channels: int) -> Path:
    rng = np.random.default_rng(0)
    path, data_name = folder / "large.onnx", "large.onnx.data"
    nodes, inits, x = [], [], "input"
    with open(folder / data_name, "wb") as data:
        for i in range(2):
            w = (rng.standard_normal((channels, channels, 1, 1), dtype=np.float32) / np.sqrt(channels)).astype(np.float32)
            inits.append(external(f"conv{i}.weight", w, data, data_name))
            del w
            bn = [rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.1, channels), rng.normal(0, 0.1, channels),
                  rng.uniform(0.5, 1.5, channels)]
            names = [f"bn{i}.{k}" for k in ("scale", "bias", "mean", "var")]
            inits += [numpy_helper.from_array(v.astype(np.float32), n) for v, n in zip(bn, names)]
            nodes += [helper.make_node("Conv", [x, f"conv{i}.weight"], [f"c{i}"], name=f"conv{i}"),
                      helper.make_node("BatchNormalization", [f"c{i}", *names], [f"b{i}"], name=f"bn{i}"),
                      helper.make_node("Relu", [f"b{i}"], [f"r{i}"], name=f"relu{i}")]
            x = f"r{i}"
    graph = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                             ["batch", channels, 8, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", channels, 8, 8])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def size_of(path: Path) -> int:
    return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + ".data"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=16384, help="C of the two CxC 1x1 convs (16384: 2.15 GB)")
    ap.add_argument("--keep", help="work in this folder and keep the files")
    ap.add_argument("--verify", action="store_true", help="also pass --verify (ONNX Runtime on both models)")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="epifuse-large-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        start = time.time()
        src = build(folder, args.channels)
        print(f"built {src} ({size_of(src) / 1e9:.2f} GB) in {time.time() - start:.0f} s", flush=True)
        out = folder / "out"
        out.mkdir(exist_ok=True)
        cmd = ["/usr/bin/time", "-f", "%M %e", sys.executable, "-m", "optimizer", "optimize", str(src), "-o",
               str(out / "large.epifuse.onnx")] + (["--verify"] if args.verify else [])
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-2000:])
            return 1
        peak_kb, wall = result.stderr.strip().splitlines()[-1].split()
        written = out / "large.epifuse.onnx"
        model_gb, peak_gb = size_of(src) / 1e9, int(peak_kb) * 1024 / 1e9
        print(f"model {model_gb:.2f} GB → optimized {size_of(written) / 1e9:.2f} GB "
              f"({'external data' if (out / 'large.epifuse.onnx.data').exists() else 'inline'}), "
              f"{float(wall):.1f} s, peak RSS {peak_gb:.2f} GB = {peak_gb / model_gb:.2f}x the model (target ≤ 2x)")
        light = onnx.load(written, load_external_data=False)
        print("ops after:", [n.op_type for n in light.graph.node])
        return 0 if peak_gb <= 2 * model_gb else 1
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
